from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.db.models import F, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from accounts.models import Team
from infra.names import validate_name
from modelport.core import formats
from modelport.core.definitions import Definition, PipelineDefinition, PythonDefinition
from modelport.core.signature import Signature, signature_from_json


def _choice(name: str) -> tuple[str, str]:
    return name, formats.REGISTRY[name].label


class Format(models.TextChoices):
    """The formats of modelport.core.formats (its registry holds what each one is), as model field choices."""

    ONNX = _choice(formats.ONNX)
    TORCHSCRIPT = _choice(formats.TORCHSCRIPT)
    SAVEDMODEL = _choice(formats.SAVEDMODEL)
    TENSORRT = _choice(formats.TENSORRT)
    PYTHON = _choice(formats.PYTHON)
    TNN = _choice(formats.TNN)
    ENSEMBLE = _choice(formats.ENSEMBLE)


# Formats whose artifact carries no readable signature: the uploader declares it.
FORMATS_NEEDING_SIGNATURE = {Format(name) for name in formats.FORMATS_NEEDING_SIGNATURE}


class Model(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="models")
    name = models.CharField(max_length=63, validators=[validate_name])
    description = models.TextField(blank=True)
    # The last version number handed out; bumped with an UPDATE so concurrent uploads never share a number.
    last_version = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="model_name_unique_per_team")]

    def __str__(self) -> str:
        return f"{self.team}/{self.name}"

    def next_version_number(self) -> int:
        """Reserve the next version number. Call inside a transaction: the UPDATE locks the row until commit."""
        assert transaction.get_connection().in_atomic_block
        Model.objects.filter(pk=self.pk).update(last_version=F("last_version") + 1)
        self.refresh_from_db(fields=["last_version"])
        return self.last_version


class Blob(models.Model):
    """Content-addressed artifact bytes: identical uploads are stored once."""

    sha256 = models.CharField(max_length=64, primary_key=True)
    size = models.BigIntegerField()
    key = models.CharField(max_length=255, unique=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.sha256[:12]} ({self.size} bytes)"

    @staticmethod
    def key_for(sha256: str) -> str:
        return f"blobs/sha256/{sha256[:2]}/{sha256}"


class ModelVersion(models.Model):
    class Status(models.TextChoices):
        UPLOADING = "uploading"
        # Fetched by a worker from a source (issue 35: MLflow, Hugging Face, s3/https), then VALIDATING as an upload.
        IMPORTING = "importing"
        VALIDATING = "validating"
        READY = "ready"
        INVALID = "invalid"

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    format = models.CharField(max_length=32, choices=Format.choices, blank=True)
    declared_format = models.CharField(max_length=32, choices=Format.choices, blank=True)
    # Where the bytes are while validating (an upload or a staged file); replaced by `blob` once validated.
    staged_key = models.CharField(max_length=255, blank=True)
    blob = models.ForeignKey(Blob, null=True, blank=True, on_delete=models.PROTECT, related_name="versions")
    original_filename = models.CharField(max_length=255, blank=True)
    size = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    signature = models.JSONField(default=dict, blank=True)
    declared_signature = models.JSONField(null=True, blank=True)
    max_batch_size = models.PositiveIntegerField(default=0)
    declared_max_batch_size = models.PositiveIntegerField(null=True, blank=True)
    # The format's definition as JSON (modelport/core/definitions.py; read it as `parsed_definition`): a pipeline's
    # validated steps (models_registry.pipelines), a python model's requirements.txt lines (installed by the local
    # runtime when deployed), a SavedModel's SignatureDef, a trial's note.
    definition = models.JSONField(null=True, blank=True)
    # The uploader's example request (a KServe v2 JSON inference request, checked against the signature; BYTES
    # elements as {"b64": ...}): the trial call's request in place of zeros (modelport/core/example_request.py).
    example_request = models.JSONField(null=True, blank=True)
    # What the version's model was measured to take on this machine (issue 31), its own processes' peak: at its
    # python trial call at inspection, at a load in a local pool, in a dedicated local Triton; the most seen. A
    # dedicated local deployment that gives no memory is limited from it (deployments/server_memory.py).
    measured_memory_bytes = models.BigIntegerField(null=True, blank=True)
    measured_memory_by = models.CharField(max_length=200, blank=True)
    # A streaming (decoupled) python model (issue 33): it answers a request with any number of responses, rendered with
    # `model_transaction_policy { decoupled: true }`, served by /generate_stream and gRPC's stream, refused on /infer.
    # Declared at upload (only python models can be), never detected: Triton cannot tell from model.py.
    decoupled = models.BooleanField(default=False)
    # A text model's chat template (issue 33): how the OpenAI-compatible chat endpoint turns messages into its
    # text_input, rendered in the gateway's sandbox (modelport/core/chat_template.py). Empty: the default template.
    chat_template = models.TextField(blank=True, default="")
    # An imported version's source (issue 35; models_registry/sources/): {"kind", the validated fields, and once
    # fetched "fetched": what the fetcher recorded (registry version, run id, commit, each file's sha256)}; null for an
    # upload. Never a credential: those are the operator's settings. `source_identity`: the canonical pinned source
    # (a moving reference's pinned target: an alias's registry version, a branch's commit, an s3 object's ETag) and the
    # declared options (models_registry/import_identity.py), so that importing one twice into one model gives one
    # version; empty where nothing pins it (an s3 folder, an https object), which is a new version at every import.
    source = models.JSONField(null=True, blank=True)
    source_identity = models.CharField(max_length=64, blank=True, db_index=True)
    # While importing: bytes fetched, and of how many (null until the source says). `size` meanwhile holds what the
    # import reserved of the team's quota (the total as soon as it is known), so that it counts before the bytes do.
    import_done_bytes = models.BigIntegerField(default=0)
    import_total_bytes = models.BigIntegerField(null=True, blank=True)
    import_started_at = models.DateTimeField(null=True, blank=True)
    # Pipelines: the versions their steps call, so that none of them is deleted while a pipeline uses it.
    step_versions = models.ManyToManyField("self", symmetrical=False, related_name="pipelines", blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.VALIDATING)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    validated_at = models.DateTimeField(null=True, blank=True)
    # A validating version holds one of its team's inspection slots once queued (models_registry/dispatch.py);
    # unset, it waits for one. `inspection_started_at`: when a worker began it (for the time-limit sweep).
    inspection_queued_at = models.DateTimeField(null=True, blank=True)
    inspection_started_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["model", "-number"]
        constraints = [models.UniqueConstraint(fields=["model", "number"], name="version_number_unique_per_model")]

    def __str__(self) -> str:
        return f"{self.model}:{self.number}"

    @property
    def parsed_signature(self) -> Signature:
        return signature_from_json(self.signature)

    @property
    def parsed_definition(self) -> Definition | None:
        return formats.definition_from_json(self.format, self.definition)

    @property
    def has_example_request(self) -> bool:
        return self.example_request is not None

    def example_data(self) -> dict[str, list[Any]]:
        """The example request's data per input, as a JSON request can carry it (for Try it): BYTES elements as
        text where they are printable UTF-8; an input with binary elements (an image) is left out."""
        data: dict[str, list[Any]] = {}
        inputs = self.example_request.get("inputs") if isinstance(self.example_request, dict) else None
        for tensor in inputs if isinstance(inputs, list) else []:
            values = tensor.get("data") if isinstance(tensor, dict) else None
            if not isinstance(values, list) or not isinstance(tensor.get("name"), str):
                continue
            if tensor.get("datatype") == "BYTES":
                values = [_text(v) for v in values]
                if None in values:
                    continue
            data[tensor["name"]] = values
        return data

    @property
    def notes(self) -> list[str]:
        """What the uploader should know of an accepted version: a trial that did not pass (not run, or not
        checked because the model raised on inputs of zeros), in the trial's own words."""
        definition = self.definition if isinstance(self.definition, dict) else {}
        trial = definition.get("trial_call") or definition.get("trial_run") or ""
        return [str(trial)] if trial and not str(trial).startswith("passed") else []

    @property
    def requirements(self) -> list[str]:
        """A python model's requirements.txt lines (as parsed at inspection); [] for other formats."""
        definition = self.parsed_definition
        return list(definition.requirements) if isinstance(definition, PythonDefinition) else []

    @property
    def step_references(self) -> tuple[tuple[str, int], ...]:
        """A pipeline's (model, version) per step, in order; () for other formats."""
        definition = self.parsed_definition
        return definition.step_references if isinstance(definition, PipelineDefinition) else ()

    @property
    def artifact_key(self) -> str:
        return self.blob.key if self.blob_id else self.staged_key  # type: ignore[union-attr]

    def to_summary(self) -> dict[str, Any]:
        return {"model": self.model.name, "version": self.number, "format": self.format, "status": self.status}

    @property
    def identical_to(self) -> int | None:
        """The first earlier version of this model with the same bytes, or None (also until the bytes are hashed
        at inspection). Pushing the same file again makes a version of its own (the numbers a CI job prints stay
        one per push, and the bytes are stored once), but it says so: a retrain that changed nothing is news."""
        annotated = getattr(self, "identical_number", _NOT_ANNOTATED)
        if annotated is not _NOT_ANNOTATED:
            return annotated if isinstance(annotated, int) else None
        if not self.sha256:
            return None
        return (ModelVersion.objects.filter(model_id=self.model_id, sha256=self.sha256, number__lt=self.number)
                .order_by("number").values_list("number", flat=True).first())


_NOT_ANNOTATED = object()


def record_memory(version_id: int, measured_bytes: int, by: str) -> bool:
    """Keep `measured_bytes` as the version's measured memory where it is the most seen yet (a reading right after
    a load never lowers what use showed); whether it was kept."""
    if measured_bytes <= 0:
        return False
    larger = Q(measured_memory_bytes__isnull=True) | Q(measured_memory_bytes__lt=measured_bytes)
    return ModelVersion.objects.filter(larger, pk=version_id).update(
        measured_memory_bytes=measured_bytes, measured_memory_by=by[:200]) == 1


def _text(element: Any) -> str | None:
    """A BYTES element of a stored example request ({"b64": ...}) as printable text (line breaks and tabs allowed: a
    prompt such as the text generator's "First Citizen:\n" ends in one), or None."""
    import base64
    import binascii

    if isinstance(element, str):
        return element
    try:
        text = base64.b64decode(element["b64"], validate=True).decode()
    except (TypeError, KeyError, binascii.Error, UnicodeDecodeError):
        return None
    return text if text.replace("\n", "").replace("\t", "").isprintable() else None


def with_identical_to(versions: QuerySet[ModelVersion]) -> QuerySet[ModelVersion]:
    """`versions` with `identical_to` read in the same query (a list of versions makes no query per version)."""
    earlier = (ModelVersion.objects.filter(model=OuterRef("model"), sha256=OuterRef("sha256"),
                                           number__lt=OuterRef("number")).exclude(sha256="")
               .order_by("number").values("number")[:1])
    return versions.annotate(identical_number=Subquery(earlier))


class Upload(models.Model):
    """A resumable (tus 1.0) upload in progress or finished, waiting to become a model version. The row is deleted
    when a version takes over its bytes, so an upload is used at most once."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="uploads")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    length = models.BigIntegerField()
    offset = models.BigIntegerField(default=0)
    metadata = models.JSONField(default=dict, blank=True)
    # Backend-specific state of the partial object (e.g. the S3 multipart upload id and its parts).
    storage_state = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)
    # Claimed by the one PATCH request writing to it (a conditional update), so two requests never interleave bytes.
    busy_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"upload {self.id} ({self.offset}/{self.length})"

    @property
    def key(self) -> str:
        return f"uploads/{self.id}"

    @property
    def is_complete(self) -> bool:
        return self.offset == self.length


class TeamStorageQuota(models.Model):
    """An operator's storage quota for one team, in place of TEAM_STORAGE_QUOTA_BYTES (set in the admin console).
    Its own small model rather than a field of the team, so that the registry owns what it measures."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="storage_quota")
    bytes = models.PositiveBigIntegerField(help_text="What the team's models, versions and uploads may hold, in bytes.")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.team}: {self.bytes} bytes"


class TeamSources(models.Model):
    """What an operator allows one team to import versions from (issue 35), set in the admin console. A team without
    a row gets the settings' defaults (IMPORT_MLFLOW_MODELS, IMPORT_HUGGINGFACE_REPOS; no bucket, no host); a row
    replaces them for its team. Read through models_registry.sources.allowed, never here."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="sources")
    mlflow_models = models.TextField(
        blank=True, help_text="Registered model names of the operator's MLflow registry the team may import, one glob "
                              "pattern a line ('fraud-*', '*' for all); empty: none.")
    huggingface_repos = models.TextField(
        blank=True, help_text="Hugging Face repositories the team may import, one glob pattern a line ('acme/*', "
                              "'*' for all); empty: none.")
    huggingface_token = models.BooleanField(
        default=False, help_text="Send the operator's HF_TOKEN with this team's Hugging Face imports (private and "
                                 "gated repositories the token can read). Off: anonymous.")
    s3_buckets = models.TextField(
        blank=True, help_text="S3 buckets the team may import from with the operator's credentials, one a line, "
                              "optionally with a key prefix ('models', 'shared/fraud/'); empty: none.")
    https_hosts = models.TextField(
        blank=True, help_text="Host names the team may import https:// URLs from, one a line (needs "
                              "IMPORT_HTTPS_ENABLED); empty: none.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "team sources"

    def __str__(self) -> str:
        return f"{self.team}: import sources"
