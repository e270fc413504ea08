"""State changes of the registry. Views validate; these run the change atomically and queue work after commit."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from accounts.models import Team
from audit.log import record as audit
from infra.api_errors import Conflict
from modelport.core import formats
from modelport.core.signature import Signature
from models_registry import quota
from models_registry.models import Blob, Format, Model, ModelVersion, Upload
from models_registry.pipelines import Lookup, Pipeline, StepVersion
from models_registry.storage import best_effort, get_store
from models_registry.validation import ArtifactRejected, quick_check


def create_model(team: Team, user: Any, name: str, description: str = "") -> Model:
    try:
        with transaction.atomic():
            model = Model.objects.create(team=team, name=name, description=description, created_by=user)
            audit(user, team, "model.create", name)
            return model
    except IntegrityError:
        raise Conflict(f"A model named {name!r} exists already in team {team.name!r}.") from None


def _save_new_model(model: Model, user: Any) -> Model:
    """A model created with its first version (`create_model`): saved inside the version's transaction, so that a
    refused first version leaves no empty model behind. Created meanwhile by someone else: that one is used."""
    if model.pk is not None:
        return model
    try:
        with transaction.atomic():
            model.save()
    except IntegrityError:
        return Model.objects.get(team=model.team, name=model.name)
    audit(user, model.team, "model.create", model.name)
    return model


def _dispatch_after_commit(team_id: int) -> None:
    # Through the team's inspection slots (models_registry/dispatch.py), after commit: the change must be visible.
    from models_registry import tasks

    tasks.queue_inspections(team_id)


def _queue_inspection(version: ModelVersion) -> None:
    _dispatch_after_commit(version.model.team_id)


class NotStreamable(ArtifactRejected):
    """decoupled=true on a model that is not a python one: the API names the field."""


def check_streamable(fmt: str, decoupled: bool) -> None:
    """Only a python model can stream (Triton's decoupled mode is the python backend's, and ours renders every other
    format as a one-answer model): decoupled=true on another format is refused, naming it."""
    if decoupled and fmt and fmt != formats.PYTHON:
        raise NotStreamable(f"decoupled=true is for python models only (a model.py that sends its pieces with "
                            f"a response sender); this is a {formats.get(fmt).label} model: leave decoupled out.")


def _new_version(model: Model, user: Any, *, staged_key: str, filename: str, size: int, fmt: str,
                 declared_format: str, signature: Signature | None, max_batch_size: int | None,
                 example_request: dict[str, Any] | None = None, decoupled: bool = False,
                 chat_template: str = "") -> ModelVersion:
    version = ModelVersion.objects.create(
        model=model,
        number=model.next_version_number(),
        format=fmt,
        declared_format=declared_format,
        staged_key=staged_key,
        original_filename=filename[:255],
        size=size,
        declared_signature=signature.to_json() if signature else None,
        declared_max_batch_size=max_batch_size,
        example_request=example_request,
        decoupled=decoupled,
        chat_template=chat_template,
        status=ModelVersion.Status.VALIDATING,
        created_by=user,
    )
    _queue_inspection(version)
    audit(user, model.team, "model_version.create", f"{model.name}:{version.number}", format=fmt, size=size)
    return version


def create_version_from_file(model: Model, user: Any, stream: IO[bytes], filename: str, *, declared_format: str = "",
                             signature: Signature | None = None, max_batch_size: int | None = None,
                             example_request: dict[str, Any] | None = None, decoupled: bool = False,
                             chat_template: str = "") -> ModelVersion:
    """A small artifact sent in the request body: checked locally first, stored only if it passes."""
    check_streamable(declared_format, decoupled)
    with tempfile.TemporaryDirectory(prefix="modelport-upload-") as tmp:
        path = Path(tmp) / "artifact"
        with open(path, "wb") as out:
            shutil.copyfileobj(stream, out, 1024 * 1024)
        check = quick_check(path, filename, declared_format, signature)
        check_streamable(check.format, decoupled)
        quota.check_room(model.team, path.stat().st_size)
        staged_key = f"staging/{uuid.uuid4()}"
        store = get_store()
        with open(path, "rb") as source:
            size = store.save(staged_key, source)
    try:
        with transaction.atomic():
            # Again under the team's lock, where the version that holds the bytes is recorded, so that two
            # requests of one team cannot both pass; the disk was checked before the bytes were stored.
            quota.lock_team(model.team)
            quota.check_room(model.team, size, disk=False)
            return _new_version(_save_new_model(model, user), user, staged_key=staged_key, filename=filename, size=size,
                                fmt=check.format, declared_format=declared_format, signature=signature,
                                max_batch_size=max_batch_size, example_request=example_request,
                                decoupled=decoupled, chat_template=chat_template)
    except BaseException:
        store.delete(staged_key)
        raise


def create_version_from_upload(model: Model, user: Any, upload: Upload, *, declared_format: str = "",
                               signature: Signature | None = None, max_batch_size: int | None = None,
                               example_request: dict[str, Any] | None = None, decoupled: bool = False,
                               chat_template: str = "") -> ModelVersion:
    """A finished resumable upload becomes a version; the upload can be used once."""
    check_streamable(declared_format, decoupled)
    if not upload.is_complete:
        raise ArtifactRejected(f"The upload is not finished: {upload.offset} of {upload.length} bytes received.")
    store = get_store()
    filename = upload.metadata.get("filename", "")
    fmt = ""
    try:
        with store.local_copy(upload.key) as path:
            fmt = quick_check(path, filename, declared_format, signature).format
    except ArtifactRejected:
        _discard_upload(upload)
        raise
    check_streamable(fmt, decoupled)  # the upload is kept: the same one can be sent again without the flag
    with transaction.atomic():
        claimed, _ = Upload.objects.filter(pk=upload.pk, completed_at__isnull=False).delete()
        if claimed != 1:
            raise Conflict("This upload was already used for a model version; upload the file again.")
        return _new_version(_save_new_model(model, user), user, staged_key=upload.key, filename=filename,
                            size=upload.length, fmt=fmt,
                            declared_format=declared_format, signature=signature, max_batch_size=max_batch_size,
                            example_request=example_request, decoupled=decoupled, chat_template=chat_template)


def _discard_upload(upload: Upload) -> None:
    """A refused upload's bytes go at once, not at its expiry a day later: a team pushing bad files again and
    again must not fill the disk. The upload is used up; the uploader sends the file again (the CLI does)."""
    with best_effort(f"delete refused upload {upload.pk} at", upload.key):
        get_store().delete(upload.key)
    Upload.objects.filter(pk=upload.pk).delete()


def create_pipeline_version(model: Model, user: Any, pipeline: Pipeline) -> ModelVersion:
    """A validated pipeline becomes a ready version at once: it has no artifact to inspect."""
    step_ids = sorted({v.id for v in pipeline.step_versions if v.id is not None})
    with transaction.atomic():
        # Locked, so that no step version is deleted between the validation and this commit.
        still_ready = ModelVersion.objects.select_for_update().filter(
            pk__in=step_ids, status=ModelVersion.Status.READY, model__team=model.team)
        if len(list(still_ready)) != len(step_ids):
            raise Conflict("A step version of the pipeline was deleted meanwhile; send the request again.")
        model = _save_new_model(model, user)
        version = ModelVersion.objects.create(
            model=model,
            number=model.next_version_number(),
            format=Format.ENSEMBLE,
            declared_format=Format.ENSEMBLE,
            signature=pipeline.signature.to_json(),
            max_batch_size=pipeline.max_batch_size,
            definition=pipeline.to_definition(),
            decoupled=pipeline.decoupled,  # it streams when a step does: served as a streaming model
            status=ModelVersion.Status.READY,
            created_by=user,
            validated_at=timezone.now(),
        )
        version.step_versions.set(step_ids)
        audit(user, model.team, "model_version.create", f"{model.name}:{version.number}", format=Format.ENSEMBLE,
              steps=[f"{s.model}:{s.version}" for s in pipeline.steps])
    return version


def version_in_use(version: ModelVersion) -> list[str]:
    """Names of deployments that serve this version (they keep it from being deleted)."""
    from models_registry.signals import version_users

    return sorted({name for _, names in version_users.send(ModelVersion, version=version) for name in names or ()})


def _refuse_if_used(version: ModelVersion, deleting: set[int] | frozenset[int] = frozenset()) -> None:
    users = version_in_use(version)
    if users:
        raise Conflict(f"Version {version.number} is used by deployment(s) {', '.join(users)}: "
                       "delete or change them first.")
    pipelines = sorted(f"{p.model.name}:{p.number}"
                       for p in version.pipelines.select_related("model").exclude(pk__in=deleting))
    if pipelines:
        raise Conflict(f"Version {version.number} of {version.model.name!r} is a step of pipeline version(s) "
                       f"{', '.join(pipelines)}: delete those first.")


def _refuse_if_inspecting(versions: QuerySet[ModelVersion]) -> None:
    """Refuse to delete a version whose inspection runs: its task and trial run go on to their end whatever happens
    to the row, and the team's inspection slots are counted from its rows (models_registry/dispatch.py), so deleting
    it would free a slot for another run beside this one. The rows are locked first: a queued task that starts
    meanwhile (dispatch.started, a conditional update) waits for this transaction and then finds nothing to do.
    A worker killed at the hard limit leaves the row validating until the sweep marks it invalid: deletable then."""
    running = [v for v in versions.select_for_update(of=("self",)).order_by("number")
               if v.status == ModelVersion.Status.VALIDATING and v.inspection_started_at is not None]
    if running:
        which = ("Version {} is" if len(running) == 1 else "Versions {} are").format(
            ", ".join(str(v.number) for v in running))
        raise Conflict(f"{which} being inspected (for at most {settings.INSPECTION_TIME_LIMIT_SECONDS:g} s, "
                       "INSPECTION_TIME_LIMIT_SECONDS): delete it once its inspection ends.")


def delete_version(version: ModelVersion, user: Any = None) -> None:
    _refuse_if_inspecting(ModelVersion.objects.filter(pk=version.pk))
    _refuse_if_used(version)
    blob_sha = version.blob_id
    staged = version.staged_key if not version.blob_id else ""
    audit(user, version.model.team, "model_version.delete", f"{version.model.name}:{version.number}")
    validating = version.status == ModelVersion.Status.VALIDATING
    team_id = version.model.team_id
    version.delete()
    transaction.on_commit(lambda: _release_bytes(blob_sha, staged))
    if validating:  # it may have held one of the team's inspection slots: the next upload takes it
        _dispatch_after_commit(team_id)


def model_in_use(model: Model) -> list[str]:
    """Names of deployments that serve any version of the model (they keep it from being deleted)."""
    return sorted({name for version in model.versions.all() for name in version_in_use(version)})


def delete_model(model: Model, user: Any = None) -> None:
    _refuse_if_inspecting(model.versions.all())
    own = {v.pk for v in model.versions.all()}
    for version in model.versions.all():
        _refuse_if_used(version, deleting=own)
    leftovers = [(v.blob_id, v.staged_key if not v.blob_id else "") for v in model.versions.all()]
    audit(user, model.team, "model.delete", model.name)
    validating = model.versions.filter(status=ModelVersion.Status.VALIDATING).exists()
    model.delete()
    if validating:
        _dispatch_after_commit(model.team_id)
    for blob_sha, staged in leftovers:
        transaction.on_commit(lambda b=blob_sha, s=staged: _release_bytes(b, s))  # type: ignore[misc]


def _release_bytes(blob_sha: str | None, staged_key: str) -> None:
    store = get_store()
    if staged_key:
        store.delete(staged_key)
    if blob_sha and not ModelVersion.objects.filter(blob_id=blob_sha).exists():
        blob = Blob.objects.filter(pk=blob_sha).first()
        if blob is not None:
            with best_effort(f"delete blob {blob_sha} at", blob.key):
                blob.delete()
                store.delete(blob.key)


def pipeline_step_lookup(team: Team) -> Lookup:
    """A step's version among the team's models (another team's models do not exist for it)."""

    def lookup(name: str, number: int | None) -> StepVersion | str:
        versions = ModelVersion.objects.select_related("model").filter(model__team=team, model__name=name)
        if number is not None:
            version = versions.filter(number=number).first()
            if version is None:
                return (f"model {name!r} has no version {number}" if versions.exists()
                        else f"no model named {name!r} in your team")
        else:
            version = versions.filter(status=ModelVersion.Status.READY).order_by("-number").first()
            if version is None:
                return (f"model {name!r} has no ready version yet" if versions.exists()
                        else f"no model named {name!r} in your team")
        return step_version(version)

    return lookup


def step_version(version: ModelVersion) -> StepVersion:
    """What pipeline validation knows of `version` as a step (its model must be loaded: select_related)."""
    return StepVersion(model=version.model.name, version=version.number, format=version.format,
                       status=version.status, signature=version.parsed_signature,
                       max_batch_size=version.max_batch_size, error=version.error, id=version.id,
                       decoupled=version.decoupled)
