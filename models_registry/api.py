"""REST API for models and their versions: /api/v1/models/..."""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings
from django.db import transaction
from django.http import Http404
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_field,
)
from rest_framework import exceptions, serializers, status
from rest_framework.decorators import api_view, parser_classes
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.context import acting_user, current_team, is_team_admin
from accounts.idempotency import idempotent
from audit.log import record as audit
from infra.api_errors import PayloadTooLarge, not_found, request_object
from infra.api_json import BoundedJSONField, BoundedJSONParser
from infra.api_schema import (
    IDEMPOTENCY_ERRORS,
    IDEMPOTENCY_KEY,
    JSON_PARSERS,
    ExactJSONTypes,
    NameField,
    error,
    takes_no_body,
)
from infra.names import name_error
from modelport.core import chat_template
from modelport.core.example_request import ExampleRequestError, example_to_store
from modelport.core.formats import describe
from modelport.core.signature import KSERVE_TO_TRITON, TRITON_TO_KSERVE, SignatureError, parse_signature
from models_registry import actions, imports, pipelines
from models_registry.models import Format, Model, ModelVersion, Upload, with_identical_to
from models_registry.quota import NoRoom
from models_registry.sources.base import SourceForbidden, SourceRefused
from models_registry.validation import ArtifactRejected

# The formats a version can be declared as: artifacts (any but a pipeline), pipelines. Named in the schema
# (SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"]).
ARTIFACT_FORMATS = [f.value for f in Format if f != Format.ENSEMBLE]
PIPELINE_FORMATS = [Format.ENSEMBLE.value]
# A format that is none of them: what each name means, since an uploader guesses ("pytorch", "tensorflow").
UNKNOWN_FORMAT = ('"{input}" is not a format name: send one of '
                  + ", ".join(f"{f} for {describe(f)}" for f in ARTIFACT_FORMATS)
                  + ", or leave 'format' out to have it detected from the file.")


# The JSON a signature and a pipeline definition are, for the schema (modelport/core/signature.py and pipelines.py
# parse them). A tensor's older spellings ("data_type", "shape") are read, so they are in the schema, deprecated: one
# spelling of each, as the parser requires, and no other key (lowercase datatypes are left out of the enum).
_DIMS = {"type": "array", "items": {"type": "integer", "minimum": -1, "not": {"enum": [0]}},
         "description": "The full shape: positive sizes, -1 for a dynamic dimension."}
_DATATYPE = {"type": "string", "enum": [*KSERVE_TO_TRITON, *TRITON_TO_KSERVE],
             "description": "A KServe v2 datatype, or Triton's name for it."}
_TENSOR = {
    "type": "object", "required": ["name"], "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": r"\S"},
        "datatype": _DATATYPE,
        "dims": _DIMS,
        "data_type": {**_DATATYPE, "deprecated": True, "description": "The older spelling of datatype."},
        "shape": {**_DIMS, "deprecated": True, "description": "The older spelling of dims."},
    },
    "allOf": [{"oneOf": [{"required": ["datatype"]}, {"required": ["data_type"]}]},
              {"oneOf": [{"required": ["dims"]}, {"required": ["shape"]}]}],
}
# A signature's input may be optional (modelport/core/signature.py: python models only); an output, a pipeline's
# input, never.
_INPUT_TENSOR = {**_TENSOR, "properties": {
    **_TENSOR["properties"],  # type: ignore[dict-item]
    "optional": {"type": "boolean", "default": False,
                 "description": "A request may leave this input out (Triton's optional: true; python models only). "
                                "Written only when true."},
}}
SIGNATURE_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["inputs", "outputs"],
    "properties": {"inputs": {"type": "array", "minItems": 1, "items": _INPUT_TENSOR},
                   "outputs": {"type": "array", "minItems": 1, "items": _TENSOR}},
    "description": "Tensor names are unique across inputs and outputs.",
}
_TENSOR_MAP = {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string", "minLength": 1}}
DEFINITION_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["inputs", "outputs", "steps"],
    "properties": {
        "inputs": {"type": "array", "minItems": 1, "items": _TENSOR},
        "outputs": {"type": "array", "minItems": 1, "items": _TENSOR},
        "steps": {"type": "array", "minItems": 1, "maxItems": pipelines.MAX_STEPS, "items": {
            "type": "object", "additionalProperties": False, "required": ["model", "input_map", "output_map"],
            "properties": {
                "model": {"type": "string", "minLength": 1},
                "version": {"type": "integer", "minimum": 1, "nullable": True,
                            "description": "Default: the latest ready version."},
                "input_map": {**_TENSOR_MAP, "description": "{step input: pipeline tensor}"},
                "output_map": {**_TENSOR_MAP, "description": "{step output: pipeline tensor}"},
            },
        }},
    },
}


@extend_schema_field({"nullable": True, "anyOf": [
    SIGNATURE_SCHEMA,
    {"type": "object", "maxProperties": 0, "description": "No signature: {}, like null."},
    {"type": "string", "description": "The signature as JSON text; empty: none."},
]})
class SignatureField(BoundedJSONField):
    pass


@extend_schema_field(DEFINITION_SCHEMA)
class DefinitionField(BoundedJSONField):
    pass


_EXAMPLE_INPUT = {
    "type": "object", "additionalProperties": False, "required": ["name", "datatype", "shape", "data"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "datatype": _TENSOR["properties"]["datatype"],  # type: ignore[index]
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 1}},
        "data": {"type": "array", "description": 'The elements, flat or nested row-major; a BYTES element is a '
                                                 'string or {"b64": "<base64>"}.'},
        "parameters": {"type": "object"},
    },
}
EXAMPLE_REQUEST_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["inputs"], "nullable": True,
    "properties": {"id": {"type": "string"}, "parameters": {"type": "object"}, "outputs": {"type": "array"},
                   "inputs": {"type": "array", "minItems": 1, "items": _EXAMPLE_INPUT}},
    "description": "A KServe v2 JSON inference request for this version, checked against its signature (at most "
                   "EXAMPLE_REQUEST_MAX_BYTES): the trial call of a python model sends it instead of zeros.",
}


@extend_schema_field(EXAMPLE_REQUEST_SCHEMA)
class ExampleRequestField(BoundedJSONField):
    pass


DECOUPLED_IN = ("A streaming python model (Triton's decoupled mode): it may send any number of responses per request, "
                "served by /generate_stream and gRPC's ModelStreamInfer, not /infer. Python models only.")
DECOUPLED_OUT = ("Whether the version streams (uploaded with decoupled=true, or a pipeline with such a step): "
                 "deployed, it answers /v2/models/<model>/generate_stream and gRPC's ModelStreamInfer; /infer "
                 "refuses it.")


CHAT_TEMPLATE_IN = ("A Jinja chat template (at most 64 KiB) for the OpenAI-compatible chat endpoint: how its messages "
                    "become the model's text_input, rendered as Hugging Face renders one (messages, "
                    "add_generation_prompt, raise_exception). Checked by compiling it: a syntax error names the line. "
                    "Left out: the documented default template.")
CHAT_TEMPLATE_OUT = "The version's chat template (uploaded as chat_template); \"\" for the default one."


class ChatTemplateField(serializers.CharField):
    """A chat template, compiled at upload in the sandbox the gateway renders it in: a 400 names a syntax error's
    line."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(required=False, allow_blank=True, trim_whitespace=False, help_text=CHAT_TEMPLATE_IN,
                         **kwargs)

    def to_internal_value(self, data: Any) -> str:
        value: str = super().to_internal_value(data)
        if value:
            try:
                chat_template.compile_template(value)
            except chat_template.TemplateRejected as exc:
                raise serializers.ValidationError(str(exc)) from None
        return value


class ImportProgressSerializer(serializers.Serializer[Any]):
    done_bytes = serializers.IntegerField(help_text="Bytes fetched so far.")
    total_bytes = serializers.IntegerField(allow_null=True, help_text="Of how many; null until the source says.")


class VersionSerializer(serializers.ModelSerializer[ModelVersion]):
    model = serializers.CharField(source="model.name", read_only=True)
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True, allow_null=True)
    # The signature is {} until the version is inspected; a pipeline's definition is null for other versions.
    format = serializers.ChoiceField(choices=Format.choices, allow_blank=True, read_only=True,
                                     help_text="Empty until the version is inspected.")
    signature = serializers.DictField(read_only=True, help_text='{"inputs": [tensor], "outputs": [tensor]}, '
                                                                "{} until the version is inspected.")
    definition = serializers.DictField(read_only=True, allow_null=True,
                                       help_text="A pipeline's definition; null for other formats.")
    # Not the request itself: up to EXAMPLE_REQUEST_MAX_BYTES each would make a list of versions huge.
    has_example_request = serializers.BooleanField(read_only=True, help_text=(
        "Whether the version was uploaded with an example request (its trial call sent it instead of zeros)."))
    notes = serializers.ListField(child=serializers.CharField(), read_only=True, help_text=(
        "What to know of the version: a trial at inspection that did not run or could not check the model (a "
        "python model that raised on inputs of zeros, naming the exception). [] when there is nothing to say."))
    identical_to = serializers.IntegerField(read_only=True, allow_null=True, help_text=(
        "The first earlier version of this model with the same bytes (the same sha256), or null: pushing the same "
        "file again makes a new version and says so here. Null until the version is inspected."))
    measured_memory_bytes = serializers.IntegerField(read_only=True, allow_null=True, help_text=(
        "What the model's own processes took at their peak on this machine, per instance (the most seen: its python "
        "trial call at inspection, its use in a pool or a dedicated deployment); null until measured. A dedicated "
        "local deployment that gives no memory is limited from it."))
    measured_memory_by = serializers.CharField(read_only=True, help_text=(
        'Where measured_memory_bytes was measured, e.g. "its trial call at inspection"; "" until measured.'))
    decoupled = serializers.BooleanField(read_only=True, help_text=DECOUPLED_OUT)
    chat_template = serializers.CharField(read_only=True, help_text=CHAT_TEMPLATE_OUT)
    source = serializers.DictField(read_only=True, allow_null=True, help_text=(  # type: ignore[assignment]
        'Where an imported version came from: {"kind", the source\'s fields, and once fetched "fetched": the '
        "registry version, run id or commit and each file's sha256}; null for an uploaded version."))

    class Meta:
        model = ModelVersion
        fields = ["model", "number", "format", "status", "error", "size", "sha256", "identical_to", "signature",
                  "max_batch_size", "original_filename", "definition", "has_example_request", "notes",
                  "measured_memory_bytes", "measured_memory_by", "decoupled", "chat_template", "source",
                  "created_by", "created_at", "validated_at"]
        read_only_fields = fields

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        # "import" is a Python keyword, so the field is named here rather than declared above.
        fields["import"] = serializers.SerializerMethodField(method_name="get_import_progress")
        return fields

    @extend_schema_field(ImportProgressSerializer(allow_null=True, help_text=(
        "While the version is importing: bytes fetched, of how many; null otherwise.")))
    def get_import_progress(self, obj: ModelVersion) -> dict[str, Any] | None:
        if obj.status != ModelVersion.Status.IMPORTING:
            return None
        return {"done_bytes": obj.import_done_bytes, "total_bytes": obj.import_total_bytes}


class ModelSerializer(ExactJSONTypes, serializers.ModelSerializer[Model]):
    # No max_length or blank check of DRF's own: the one naming rule gives the one message for every bad name.
    name = NameField(help_text="Becomes Triton, Kubernetes and S3 names.")
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True, allow_null=True)
    latest_version = serializers.SerializerMethodField()
    free_text_fields: ClassVar[frozenset[str]] = frozenset({"description"})  # lines of text are welcome there

    class Meta:
        model = Model
        fields = ["name", "description", "created_by", "created_at", "updated_at", "latest_version"]
        read_only_fields = ["created_by", "created_at", "updated_at", "latest_version"]

    def get_latest_version(self, obj: Model) -> int | None:
        return obj.last_version or None


class ModelUpdateSerializer(ExactJSONTypes, serializers.Serializer[Any]):
    free_text_fields: ClassVar[frozenset[str]] = frozenset({"description"})
    description = serializers.CharField(allow_blank=True, required=False)


class VersionCreateSerializer(ExactJSONTypes, serializers.Serializer[Any]):
    file = serializers.FileField(required=False,
                                 help_text="The artifact, for small files (see MAX_MULTIPART_UPLOAD_SIZE).")
    upload_id = serializers.UUIDField(required=False, help_text="The id ending the URL of a finished tus upload.")
    format = serializers.ChoiceField(choices=ARTIFACT_FORMATS, required=False, allow_blank=True,
                                     error_messages={"invalid_choice": UNKNOWN_FORMAT})
    signature = SignatureField(required=False, allow_null=True,
                               help_text='{"inputs": [{"name", "datatype", "dims"}], "outputs": [...]}')
    max_batch_size = serializers.IntegerField(required=False, min_value=0, max_value=1_000_000)
    create_model = serializers.BooleanField(
        required=False, default=False,
        help_text="Create the model if it does not exist, with this version: a refused first version leaves no model.")
    example_request = ExampleRequestField(required=False, allow_null=True)
    decoupled = serializers.BooleanField(required=False, default=False, help_text=DECOUPLED_IN)
    chat_template = ChatTemplateField()
    free_text_fields: ClassVar[frozenset[str]] = frozenset({"chat_template"})  # a template spans lines

    def validate_signature(self, value: Any) -> Any:
        if value in (None, "", {}):
            return None
        try:
            return parse_signature(value)
        except SignatureError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if bool(attrs.get("file")) == bool(attrs.get("upload_id")):
            raise serializers.ValidationError("Send exactly one of 'file' (multipart) "
                                              "or 'upload_id' (a finished tus upload).")
        attrs["example_request"] = _example_request(attrs.get("example_request"), attrs.get("signature"))
        try:
            actions.check_streamable(attrs.get("format") or "", attrs.get("decoupled", False))
        except actions.NotStreamable as exc:
            raise serializers.ValidationError({"decoupled": [str(exc)]}) from None
        return attrs


def _example_request(value: Any, signature: Any) -> dict[str, Any] | None:
    """The example request as stored (modelport/core/example_request.py example_to_store), or a 400 naming what
    does not fit."""
    try:
        return example_to_store(value, signature, settings.EXAMPLE_REQUEST_MAX_BYTES)
    except ExampleRequestError as exc:
        raise serializers.ValidationError({"example_request": [str(exc)]}) from None


class VersionFromFileSerializer(serializers.Serializer[Any]):
    """A version from a file sent in the request (multipart/form-data); for the schema."""

    file = serializers.FileField(help_text="The artifact, for small files (see MAX_MULTIPART_UPLOAD_SIZE).")
    format = VersionCreateSerializer().fields["format"]
    signature = serializers.CharField(required=False, allow_blank=True, help_text="The signature as JSON text, "
                                                                 '{"inputs": [{"name", "datatype", "dims"}], '
                                                                 '"outputs": [...]}.')
    max_batch_size = VersionCreateSerializer().fields["max_batch_size"]
    create_model = VersionCreateSerializer().fields["create_model"]
    example_request = serializers.CharField(required=False, allow_blank=True, help_text=(
        "A KServe v2 JSON inference request as JSON text, checked against the signature: the trial call of a python "
        'model sends it instead of zeros; a BYTES element is a string or {"b64": "<base64>"}.'))
    decoupled = serializers.BooleanField(required=False, default=False, help_text=DECOUPLED_IN)
    chat_template = ChatTemplateField()


class VersionFromUploadSerializer(serializers.Serializer[Any]):
    """A version from a finished tus upload (application/json); for the schema."""

    upload_id = serializers.UUIDField(help_text="The id ending the URL of a finished tus upload (used once).")
    format = VersionCreateSerializer().fields["format"]
    signature = SignatureField(required=False, allow_null=True)
    max_batch_size = VersionCreateSerializer().fields["max_batch_size"]
    create_model = VersionCreateSerializer().fields["create_model"]
    example_request = ExampleRequestField(required=False, allow_null=True)
    decoupled = serializers.BooleanField(required=False, default=False, help_text=DECOUPLED_IN)
    chat_template = ChatTemplateField()


_KIND_HELP = "Where the version comes from (docs/importing.md)."


class MlflowSourceSerializer(serializers.Serializer[Any]):
    """A registered model version of the operator's MLflow registry (MLFLOW_TRACKING_URI)."""

    kind = serializers.ChoiceField(choices=["mlflow"], help_text=_KIND_HELP)
    uri = serializers.CharField(help_text='"models:/<registered name>/<version>" or "models:/<name>@<alias>".')


class HuggingFaceSourceSerializer(serializers.Serializer[Any]):
    """A Hugging Face repository (HF_ENDPOINT: the hub, or the operator's mirror)."""

    kind = serializers.ChoiceField(choices=["huggingface"], help_text=_KIND_HELP)
    repo = serializers.CharField(help_text='"<org>/<name>".')
    revision = serializers.CharField(required=False, help_text='A commit, tag or branch; "main" when left out.')
    files = serializers.ListField(child=serializers.CharField(), required=False,
                                  help_text="The repository's files to import; its model's files when left out.")


class UriSourceSerializer(serializers.Serializer[Any]):
    """An object of a bucket the operator allowed the team, or an https:// URL of an allowed host."""

    kind = serializers.ChoiceField(choices=["uri"], help_text=_KIND_HELP)
    uri = serializers.CharField(help_text='"s3://<bucket>/<key>" or "https://<host>/<path>".')


SOURCE_SCHEMA = PolymorphicProxySerializer(
    component_name="VersionSource", resource_type_field_name="kind",
    serializers={"mlflow": MlflowSourceSerializer, "huggingface": HuggingFaceSourceSerializer,
                 "uri": UriSourceSerializer})


@extend_schema_field(SOURCE_SCHEMA)
class SourceField(serializers.DictField):
    """The `source` object; its fields are its kind's fetcher's to check (models_registry/sources/), the schema says
    each kind's."""


class VersionFromSourceSerializer(ExactJSONTypes, serializers.Serializer[Any]):
    """A version imported from where the team keeps it (application/json): fetched and inspected on a worker."""

    source = SourceField(help_text="The source: its `kind` says which fields it has.")  # type: ignore[assignment]
    create_model = VersionCreateSerializer().fields["create_model"]
    new_version = serializers.BooleanField(
        required=False, default=False,
        help_text="Import the source again as a new version: by default the same source with the same declared "
                  "options into the same model gives the version that imported it (HTTP 200), unless that one "
                  "failed. An MLflow alias, a Hugging Face branch or tag and an s3 object are the same source while "
                  "they name the same registry version, commit or object (asked of the source when imported); an s3 "
                  "folder and an https object are a new version at every import.")
    example_request = ExampleRequestField(required=False, allow_null=True)
    # What an upload may declare, for what the source does not say (a hub repository's python model) or says
    # otherwise: sent, it wins over the source's own (an MLflow signature).
    format = VersionCreateSerializer().fields["format"]
    signature = SignatureField(required=False, allow_null=True)
    max_batch_size = VersionCreateSerializer().fields["max_batch_size"]
    decoupled = serializers.BooleanField(required=False, default=False, help_text=DECOUPLED_IN)
    chat_template = ChatTemplateField()
    free_text_fields: ClassVar[frozenset[str]] = frozenset({"chat_template"})
    validate_signature = VersionCreateSerializer.validate_signature

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        try:
            actions.check_streamable(attrs.get("format") or "", attrs.get("decoupled", False))
        except actions.NotStreamable as exc:
            raise serializers.ValidationError({"decoupled": [str(exc)]}) from None
        return attrs


class PipelineCreateSerializer(ExactJSONTypes, serializers.Serializer[Any]):
    # A pipeline has no artifact: a field of a file's version is refused saying so, rather than as unknown.
    refused_fields: ClassVar[dict[str, str]] = {
        name: f"A pipeline is defined by 'definition' alone (no artifact, no signature): leave '{name}' out."
        for name in ("file", "upload_id", "signature")}
    format = serializers.ChoiceField(choices=PIPELINE_FORMATS)
    definition = DefinitionField(
        help_text='{"inputs": [tensor], "outputs": [tensor], "steps": [{"model", "version", "input_map": '
                  '{step_input: tensor}, "output_map": {step_output: tensor}}]}; tensors as in signatures.')
    max_batch_size = serializers.IntegerField(required=False, min_value=0, max_value=1_000_000,
                                              help_text="Default: the smallest of the steps'.")
    create_model = serializers.BooleanField(required=False, default=False,
                                            help_text="Create the model if it does not exist, with this version.")


def _step_lookup(team: Any) -> pipelines.Lookup:
    """Find a step's version among the team's models (another team's models do not exist for it)."""
    return actions.pipeline_step_lookup(team)


def _create_pipeline(request: Request, model: Model) -> Response:
    serializer = PipelineCreateSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    data = serializer.validated_data
    try:
        pipeline = pipelines.validate_pipeline(data["definition"], _step_lookup(model.team), pipeline_model=model.name,
                                               max_batch_size=data.get("max_batch_size"))
        version = actions.create_pipeline_version(model, request.user, pipeline)
    except pipelines.PipelineError as exc:
        raise ValidationError(exc.errors) from None
    return Response(VersionSerializer(version).data, status=status.HTTP_201_CREATED)


def _get_model(request: Request, name: str) -> Model:
    """The model of the request's team, or 404 (another team's model does not exist for this user)."""
    team = current_team(request)
    model = Model.objects.filter(team=team, name=name).first()
    if model is None:
        raise not_found("model", name, team, "GET /api/v1/models/ lists the team's models.")
    return model


def _get_or_new_model(request: Request, name: str, body: dict[str, Any]) -> Model:
    """The model a new version goes to: the team's, or with `create_model` a new one, saved by the action in the
    version's transaction (a refused first version leaves no empty model behind); 404 otherwise."""
    team = current_team(request)
    model = Model.objects.filter(team=team, name=name).first()
    if model is not None:
        return model
    try:
        create = serializers.BooleanField().to_internal_value(body.get("create_model", False))
    except serializers.ValidationError as exc:
        raise ValidationError({"create_model": exc.detail}) from None
    if not create:
        raise not_found("model", name, team, 'Send "create_model": true to create it with this version.')
    error = name_error(name)
    if error:
        raise ValidationError({"name": [error]})
    return Model(team=team, name=name, created_by=acting_user(request))


def _get_version(request: Request, name: str, number: int) -> ModelVersion:
    team = current_team(request)
    version = (ModelVersion.objects.select_related("model", "created_by")
               .filter(model__team=team, model__name=name, number=number).first())
    if version is None:
        model = _get_model(request, name)  # 404s naming the model when it is the model that is missing
        numbers = list(model.versions.order_by("number").values_list("number", flat=True))
        have = f"its versions are {_ranges(numbers)}" if numbers else "it has no versions yet"
        raise Http404(f"Model {name!r} of team {model.team.name!r} has no version {number}: {have}.")
    return version


def _ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7] as "1-3, 7": a model with hundreds of versions stays one short line."""
    parts: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)


@extend_schema(methods=["GET"], summary="List your team's models", responses={200: ModelSerializer(many=True)})
@extend_schema(methods=["POST"], summary="Create a model", request=ModelSerializer, parameters=[IDEMPOTENCY_KEY],
               examples=[OpenApiExample("A model", request_only=True,
                                        value={"name": "digits", "description": "Handwritten digits, 8x8"})],
               responses={201: ModelSerializer, **IDEMPOTENCY_ERRORS,
                          409: error("A model of that name exists in your team, or a request with this "
                                     "Idempotency-Key is still running.")})
@api_view(["GET", "POST"])
@parser_classes(JSON_PARSERS)
@idempotent
def models_list(request: Request) -> Response:
    team = current_team(request)
    if request.method == "POST":
        serializer = ModelSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        model = actions.create_model(team, request.user, serializer.validated_data["name"],  # type: ignore[arg-type]
                                     serializer.validated_data.get("description", ""))
        return Response(ModelSerializer(model).data, status=status.HTTP_201_CREATED)
    models = Model.objects.filter(team=team).select_related("created_by")
    return Response(ModelSerializer(models, many=True).data)


@extend_schema(methods=["GET"], summary="A model", responses={200: ModelSerializer})
@extend_schema(methods=["PATCH"], summary="Change a model's description", request=ModelUpdateSerializer,
               responses={200: ModelSerializer, 400: error("Not a valid description, or a field other than "
                                                           "'description'.")})
@extend_schema(methods=["DELETE"], summary="Delete a model with its versions", responses={
    204: OpenApiResponse(description="Deleted."),
    403: error("Only team admins delete models (and: no team, no CSRF token)."),
    409: error("A deployment uses one of its versions, a pipeline of another model uses one as a step, or one is "
               "being inspected."),
})
@api_view(["GET", "PATCH", "DELETE"])
@parser_classes(JSON_PARSERS)
def model_detail(request: Request, name: str) -> Response:
    model = _get_model(request, name)
    if request.method == "PATCH":
        serializer = ModelUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if "description" in serializer.validated_data:
            with transaction.atomic():
                model.description = serializer.validated_data["description"]
                model.save(update_fields=["description", "updated_at"])
                audit(request.user, model.team, "model.update", model.name, fields=["description"])
    elif request.method == "DELETE":
        if not is_team_admin(request):
            raise PermissionDenied("Only team admins can delete a model.")
        with transaction.atomic():
            actions.delete_model(model, request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
    return Response(ModelSerializer(model).data)


@extend_schema(methods=["GET"], summary="List a model's versions", responses={200: VersionSerializer(many=True)})
@extend_schema(
    methods=["POST"], summary="Add a version: a file, a finished tus upload or a pipeline",
    request={
        "multipart/form-data": VersionFromFileSerializer,
        "application/json": PolymorphicProxySerializer(
            component_name="VersionCreate", resource_type_field_name=None,
            serializers=[VersionFromUploadSerializer, PipelineCreateSerializer, VersionFromSourceSerializer]),
    },
    parameters=[IDEMPOTENCY_KEY],
    responses={
        200: OpenApiResponse(VersionSerializer, description="The version that imported this source (or the "
                                                             "target it names now) with these options already "
                                                             "(imported again; send new_version: true for "
                                                             "another)."),
        201: VersionSerializer, **IDEMPOTENCY_ERRORS,
        400: error("Not a valid version: the file, the upload, the format, the signature, the pipeline or the source "
                   "('fields' says which and why)."),
        403: error("A source the operator has not allowed the team (admin console: Team sources), or a kind of "
                   "import the operator turned off."),
        404: error("No model of that name in your team (send create_model: true to create it with this version)."),
        409: error("The upload was used already, a step version was deleted meanwhile, or a request with this "
                   "Idempotency-Key is still running."),
        413: error("The file or the body is too large (use a resumable upload, /api/v1/uploads/), or more than the "
                   "team's storage quota or the server's disk has left (the message says which)."),
        415: error("Neither JSON nor multipart/form-data."),
        429: error("The team has IMPORT_MAX_ACTIVE_PER_TEAM imports under way already."),
    },
)
@api_view(["GET", "POST"])
@parser_classes([MultiPartParser, BoundedJSONParser])
@idempotent
def versions_list(request: Request, name: str) -> Response:
    if request.method == "GET":
        versions = with_identical_to(_get_model(request, name).versions.select_related("model", "created_by"))
        return Response(VersionSerializer(versions, many=True).data)
    body = request_object(request)
    model = _get_or_new_model(request, name, body)
    if body.get("format") == Format.ENSEMBLE:
        return _create_pipeline(request, model)
    if "source" in body and request.content_type.startswith("application/json"):
        return _import_version(request, model)
    upload = body.get("file")
    if upload is not None and getattr(upload, "size", 0) > settings.MAX_MULTIPART_UPLOAD_SIZE:
        raise PayloadTooLarge(
            f"The file is {upload.size} bytes; files sent in the request body are limited to "
            f"{settings.MAX_MULTIPART_UPLOAD_SIZE} bytes. Use a resumable upload (/api/v1/uploads/) for larger files."
        )
    serializer = VersionCreateSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    data = serializer.validated_data
    options = {"declared_format": data.get("format") or "", "signature": data.get("signature"),
               "max_batch_size": data.get("max_batch_size"), "example_request": data.get("example_request"),
               "decoupled": data.get("decoupled", False), "chat_template": data.get("chat_template", "")}
    try:
        if data.get("file"):
            version = actions.create_version_from_file(model, request.user, data["file"], data["file"].name, **options)
        else:
            tus_upload = Upload.objects.filter(pk=data["upload_id"], team=model.team).first()
            if tus_upload is None:
                raise ValidationError({"upload_id": ["No finished upload with this id in your team "
                                                     "(each upload can be used once)."]})
            version = actions.create_version_from_upload(model, request.user, tus_upload, **options)
    except NoRoom as exc:
        raise PayloadTooLarge(str(exc)) from None
    except actions.NotStreamable as exc:
        raise ValidationError({"decoupled": [str(exc)]}) from None
    except ArtifactRejected as exc:
        raise ValidationError({"file" if data.get("file") else "upload_id": [str(exc)]}) from None
    return Response(VersionSerializer(version).data, status=status.HTTP_201_CREATED)


class TooManyImportsError(exceptions.APIException):
    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_code = "too_many_imports"


def _import_version(request: Request, model: Model) -> Response:
    serializer = VersionFromSourceSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    data = serializer.validated_data
    try:
        source = imports.validate_source(data["source"], model.team.pk)
    except SourceForbidden as exc:
        raise PermissionDenied(str(exc)) from None
    except SourceRefused as exc:
        raise ValidationError({"source": [str(exc)]}) from None
    example = _example_request(data.get("example_request"), data.get("signature"))
    declared = imports.Declared(format=data.get("format") or "", signature=data.get("signature"),
                                max_batch_size=data.get("max_batch_size"), decoupled=data.get("decoupled", False),
                                chat_template=data.get("chat_template", ""))
    try:
        version, created = imports.start_import(model, request.user, source, new_version=data["new_version"],
                                                example_request=example, declared=declared)
    except imports.TooManyImports as exc:
        raise TooManyImportsError(str(exc)) from None
    return Response(VersionSerializer(version).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


@extend_schema(methods=["POST"], summary="Cancel a version's import", request=None, responses={
    200: VersionSerializer,
    409: error("The version is not importing (its import ended, or it was uploaded)."),
})
@api_view(["POST"])
@takes_no_body
def version_cancel(request: Request, name: str, number: int) -> Response:
    version = _get_version(request, name, number)
    return Response(VersionSerializer(imports.cancel_import(version, request.user)).data)


@extend_schema(methods=["GET"], summary="A version", responses={200: VersionSerializer})
@extend_schema(methods=["DELETE"], summary="Delete a version", responses={
    204: OpenApiResponse(description="Deleted."),
    409: error("A deployment uses the version, a pipeline uses it as a step, or its inspection is running."),
})
@api_view(["GET", "DELETE"])
def version_detail(request: Request, name: str, number: int) -> Response:
    version = _get_version(request, name, number)
    if request.method == "DELETE":
        with transaction.atomic():
            actions.delete_version(version, request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
    return Response(VersionSerializer(version).data)
