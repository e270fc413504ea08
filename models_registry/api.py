"""REST API for models and their versions: /api/v1/models/..."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import api_view, parser_classes
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.context import acting_user, current_team, is_team_admin
from accounts.idempotency import idempotent
from accounts.names import NAME_RULE, name_error
from audit.log import record as audit
from models_registry import actions, pipelines
from models_registry.models import Format, Model, ModelVersion, Upload
from models_registry.signature import SignatureError, parse_signature
from models_registry.validation import ArtifactRejected
from portal.api_errors import PayloadTooLarge, request_object
from portal.api_json import BoundedJSONField, BoundedJSONParser


def validate_name_field(value: str) -> str:
    error = name_error(value)
    if error:
        raise serializers.ValidationError(error)
    return value


class VersionSerializer(serializers.ModelSerializer[ModelVersion]):
    model = serializers.CharField(source="model.name", read_only=True)
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True)

    class Meta:
        model = ModelVersion
        fields = ["model", "number", "format", "status", "error", "size", "sha256", "signature", "max_batch_size",
                  "original_filename", "definition", "created_by", "created_at", "validated_at"]
        read_only_fields = fields


class ModelSerializer(serializers.ModelSerializer[Model]):
    # No max_length or blank check of DRF's own: the one naming rule gives the one message for every bad name.
    name = serializers.CharField(allow_blank=True, trim_whitespace=False,
                                 help_text=f"Becomes Triton, Kubernetes and S3 names: {NAME_RULE}.")
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True)
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = Model
        fields = ["name", "description", "created_by", "created_at", "updated_at", "latest_version"]
        read_only_fields = ["created_by", "created_at", "updated_at", "latest_version"]

    def validate_name(self, value: str) -> str:
        return validate_name_field(value)

    def get_latest_version(self, obj: Model) -> int | None:
        return obj.last_version or None


class ModelUpdateSerializer(serializers.Serializer[Any]):
    description = serializers.CharField(allow_blank=True, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = set(self.initial_data) - {"description"}
        if unknown:
            raise serializers.ValidationError(f"Only 'description' can be changed; got {sorted(unknown)}.")
        return attrs


class VersionCreateSerializer(serializers.Serializer[Any]):
    file = serializers.FileField(required=False, help_text="The artifact, for small files (see MAX_MULTIPART_UPLOAD_SIZE).")
    upload_id = serializers.UUIDField(required=False, help_text="The id ending the URL of a finished tus upload.")
    format = serializers.ChoiceField(choices=[f.value for f in Format if f != Format.ENSEMBLE], required=False, allow_blank=True)
    signature = BoundedJSONField(required=False, help_text='{"inputs": [{"name", "datatype", "dims"}], "outputs": [...]}')
    max_batch_size = serializers.IntegerField(required=False, min_value=0, max_value=1_000_000)
    create_model = serializers.BooleanField(
        required=False, default=False,
        help_text="Create the model if it does not exist, with this version: a refused first version leaves no model.")

    def validate_signature(self, value: Any) -> Any:
        if value in (None, "", {}):
            return None
        try:
            return parse_signature(value)
        except SignatureError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if bool(attrs.get("file")) == bool(attrs.get("upload_id")):
            raise serializers.ValidationError("Send exactly one of 'file' (multipart) or 'upload_id' (a finished tus upload).")
        return attrs


class PipelineCreateSerializer(serializers.Serializer[Any]):
    format = serializers.ChoiceField(choices=[Format.ENSEMBLE.value])
    definition = BoundedJSONField(
        help_text='{"inputs": [tensor], "outputs": [tensor], "steps": [{"model", "version", "input_map": '
                  '{step_input: tensor}, "output_map": {step_output: tensor}}]}; tensors as in signatures.')
    max_batch_size = serializers.IntegerField(required=False, min_value=0, max_value=1_000_000,
                                              help_text="Default: the smallest of the steps'.")
    create_model = serializers.BooleanField(required=False, default=False,
                                            help_text="Create the model if it does not exist, with this version.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        extra = set(self.initial_data) - {"format", "definition", "max_batch_size", "create_model"}
        if extra:
            raise serializers.ValidationError(
                f"A pipeline is defined by 'definition' alone (no artifact, no signature); unexpected {sorted(extra)}.")
        return attrs


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
    model = Model.objects.filter(team=current_team(request), name=name).first()
    if model is None:
        raise Http404
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
        raise Http404
    error = name_error(name)
    if error:
        raise ValidationError({"name": [error]})
    return Model(team=team, name=name, created_by=acting_user(request))


def _get_version(request: Request, name: str, number: int) -> ModelVersion:
    version = (ModelVersion.objects.select_related("model", "created_by")
               .filter(model__team=current_team(request), model__name=name, number=number).first())
    if version is None:
        raise Http404
    return version


@extend_schema(request=ModelSerializer, responses=ModelSerializer(many=True))
@api_view(["GET", "POST"])
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


@extend_schema(request=ModelUpdateSerializer, responses=ModelSerializer)
@api_view(["GET", "PATCH", "DELETE"])
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


@extend_schema(request=VersionCreateSerializer, responses=VersionSerializer(many=True))
@api_view(["GET", "POST"])
@parser_classes([MultiPartParser, BoundedJSONParser])
@idempotent
def versions_list(request: Request, name: str) -> Response:
    if request.method == "GET":
        versions = _get_model(request, name).versions.select_related("model", "created_by")
        return Response(VersionSerializer(versions, many=True).data)
    body = request_object(request)
    model = _get_or_new_model(request, name, body)
    if body.get("format") == Format.ENSEMBLE:
        return _create_pipeline(request, model)
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
               "max_batch_size": data.get("max_batch_size")}
    try:
        if data.get("file"):
            version = actions.create_version_from_file(model, request.user, data["file"], data["file"].name, **options)
        else:
            tus_upload = Upload.objects.filter(pk=data["upload_id"], team=model.team).first()
            if tus_upload is None:
                raise ValidationError({"upload_id": ["No finished upload with this id in your team (each upload can be used once)."]})
            version = actions.create_version_from_upload(model, request.user, tus_upload, **options)
    except ArtifactRejected as exc:
        raise ValidationError({"file" if data.get("file") else "upload_id": [str(exc)]}) from None
    return Response(VersionSerializer(version).data, status=status.HTTP_201_CREATED)


@extend_schema(responses=VersionSerializer)
@api_view(["GET", "DELETE"])
def version_detail(request: Request, name: str, number: int) -> Response:
    version = _get_version(request, name, number)
    if request.method == "DELETE":
        with transaction.atomic():
            actions.delete_version(version, request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
    return Response(VersionSerializer(version).data)
