"""Imported versions (issue 35): the version a `source` makes, and the import a worker of the import lane runs.

The API validates the source (its kind's fetcher, models_registry/sources/) and `start_import` records a version in
IMPORTING with the source, then queues `tasks.import_version` after commit. The worker's `run_import` fetches into a
working directory of its own through the kind's fetcher, reserving the team's quota for the total as soon as the
source declares it (so a source larger than the quota is refused before its bytes arrive), writing progress on the
row, and stopping at the next chunk once the version is cancelled. What the fetcher produced is then staged exactly
as an upload's bytes are (quick_check, the store) and the version goes on to VALIDATING: the same inspection, archive
rules and sandbox as an upload. Nothing here opens or runs what was fetched.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.log import record as audit
from infra.api_errors import Conflict
from models_registry import quota
from models_registry.models import Model, ModelVersion
from models_registry.sources import fetcher_for
from models_registry.sources.base import (
    FetchCancelled,
    FetchContext,
    Fetched,
    SourceRefused,
    TransientFetchError,
)
from models_registry.storage import get_store
from models_registry.validation import ArtifactRejected, quick_check

log = logging.getLogger(__name__)

# Progress is written at most this often (a fetch reports every MiB): the page and the CLI poll about once a second.
_PROGRESS_EVERY_SECONDS = 0.5


def identity_of(kind: str, canonical: dict[str, Any]) -> str:
    """The sha256 of a validated source's canonical text: the key of "the same source twice"."""
    return hashlib.sha256(f"{kind}\n{fetcher_for(kind).identity(canonical)}".encode()).hexdigest()


def validate_source(source: Any, team_id: int) -> dict[str, Any]:
    """The API's check of a `source` object: its kind's fetcher validates the rest (SourceRefused, SourceForbidden).
    Returns {"kind": ..., **canonical fields}."""
    if not isinstance(source, dict):
        raise SourceRefused('source must be an object such as {"kind": "mlflow", "uri": "models:/fraud/3"}.')
    kind = source.get("kind")
    fetcher = fetcher_for(kind)
    fields = {key: value for key, value in source.items() if key != "kind"}
    return {"kind": kind, **fetcher.validate(fields, team_id)}


def existing_import(model: Model, identity: str) -> ModelVersion | None:
    """The version of `model` that imported this source already and did not fail (importing, validating, ready)."""
    if model.pk is None:
        return None
    return (ModelVersion.objects.filter(model=model, source_identity=identity)
            .exclude(status=ModelVersion.Status.INVALID).order_by("-number").first())


def start_import(model: Model, user: Any, source: dict[str, Any], *, new_version: bool = False,
                 example_request: dict[str, Any] | None = None) -> tuple[ModelVersion, bool]:
    """The version importing `source` (validated), and whether it is new: the same source into the same model again
    gives the version that imported it (unless `new_version`), so that a retried CI job makes one version."""
    from models_registry.actions import _save_new_model  # the registry's one way to save a model with its first version

    kind = source["kind"]
    canonical = {key: value for key, value in source.items() if key != "kind"}
    identity = identity_of(kind, canonical)
    with transaction.atomic():
        if model.pk is not None:
            quota.lock_team(model.team)  # two identical requests at once: the second sees the first's version
        if not new_version:
            found = existing_import(model, identity)
            if found is not None:
                return found, False
        model = _save_new_model(model, user)
        version = ModelVersion.objects.create(
            model=model, number=model.next_version_number(), status=ModelVersion.Status.IMPORTING,
            source=source, source_identity=identity, original_filename=_shown_name(source),
            example_request=example_request, created_by=user)
        audit(user, model.team, "model_version.import", f"{model.name}:{version.number}", kind=kind)
        transaction.on_commit(lambda: _queue(version.pk))
    return version, True


def _shown_name(source: dict[str, Any]) -> str:
    """What the version shows as its file until the fetch names one: the source's own address."""
    text = source.get("uri") or "@".join(str(source.get(k)) for k in ("repo", "revision") if source.get(k))
    return str(text)[:255]


def _queue(version_id: int) -> None:
    from models_registry import tasks

    tasks.import_version.delay(version_id)


def cancel_import(version: ModelVersion, user: Any) -> ModelVersion:
    """Cancel an import under way: the version becomes invalid at once (its reservation is given back) and the fetch
    stops at its next chunk. 409 when the version is not importing."""
    who = getattr(user, "username", "") or "someone"
    cancelled = ModelVersion.objects.filter(pk=version.pk, status=ModelVersion.Status.IMPORTING).update(
        status=ModelVersion.Status.INVALID, error=f"Import cancelled by {who}.", size=0,
        validated_at=timezone.now())
    if cancelled != 1:
        version.refresh_from_db()
        raise Conflict(f"Version {version.number} is {version.status}, not importing: only an import under way can be "
                       "cancelled (delete the version instead).")
    audit(user, version.model.team, "model_version.import_cancel", f"{version.model.name}:{version.number}")
    version.refresh_from_db()
    return version


@dataclass
class _Progress:
    """FetchContext.progress for one version: quota reservation, progress on the row, cancellation."""

    version_id: int
    team: Any
    max_bytes: int
    reserved: int = 0
    written_at: float = 0.0
    written_total: int | None = None

    def __call__(self, done: int, total: int | None) -> None:
        need = max(done, total or 0)
        if need > self.max_bytes:
            what = f"declares {quota.size_text(total)}" if total and total >= done else \
                f"has sent {quota.size_text(done)} already"
            raise SourceRefused(f"The source {what}, more than a version may hold here "
                                f"({quota.size_text(self.max_bytes)}: MAX_UPLOAD_SIZE).")
        if need > self.reserved:
            self._reserve(need)
        now = time.monotonic()
        if total != self.written_total or now - self.written_at >= _PROGRESS_EVERY_SECONDS:
            self._write(done, total)
            self.written_at, self.written_total = now, total

    def _reserve(self, need: int) -> None:
        with transaction.atomic():
            quota.lock_team(self.team)
            if not ModelVersion.objects.filter(pk=self.version_id, status=ModelVersion.Status.IMPORTING).exists():
                raise FetchCancelled()
            try:
                # The version's own reservation is in the team's usage already: only the increase must fit.
                quota.check_room(self.team, need - self.reserved)
            except quota.NoRoom as exc:
                raise SourceRefused(str(exc).replace("The upload is", "The source is", 1)) from None
            ModelVersion.objects.filter(pk=self.version_id).update(size=need)
        self.reserved = need

    def _write(self, done: int, total: int | None) -> None:
        updated = ModelVersion.objects.filter(pk=self.version_id, status=ModelVersion.Status.IMPORTING).update(
            import_done_bytes=done, import_total_bytes=total)
        if updated != 1:
            raise FetchCancelled()


class RetryLater(Exception):
    """A transient fault with retries left: the task retries after `countdown` seconds."""

    def __init__(self, message: str, countdown: float) -> None:
        super().__init__(message)
        self.countdown = countdown


def run_import(version_id: int, attempt: int = 0) -> None:
    """Fetch the version's source and hand its bytes to inspection (on a worker of the import lane). RetryLater for a
    transient fault while `attempt` < IMPORT_MAX_RETRIES; every other outcome is recorded on the version."""
    version = ModelVersion.objects.select_related("model__team").filter(pk=version_id).first()
    if version is None or version.status != ModelVersion.Status.IMPORTING or not isinstance(version.source, dict):
        log.info("import of version %s: gone, cancelled or imported already", version_id)
        return
    ModelVersion.objects.filter(pk=version_id, import_started_at__isnull=True).update(import_started_at=timezone.now())
    team = version.model.team
    source = dict(version.source)
    kind = str(source.pop("kind", ""))
    source.pop("fetched", None)
    with tempfile.TemporaryDirectory(prefix="modelport-import-") as tmp:
        progress = _Progress(version_id, team, max_bytes=settings.MAX_UPLOAD_SIZE, reserved=version.size)
        ctx = FetchContext(team_id=team.pk, team_name=team.name, workdir=Path(tmp), max_bytes=settings.MAX_UPLOAD_SIZE,
                           progress=progress, deadline=time.monotonic() + settings.IMPORT_TIME_LIMIT_SECONDS)
        try:
            fetched = fetcher_for(kind).fetch(source, ctx)
            _stage(version, fetched)
        except FetchCancelled:
            log.info("import of version %s cancelled", version)
        except TransientFetchError as exc:
            if attempt < settings.IMPORT_MAX_RETRIES:
                countdown = settings.IMPORT_RETRY_BACKOFF_SECONDS * 2**attempt
                ModelVersion.objects.filter(pk=version_id, status=ModelVersion.Status.IMPORTING).update(
                    error=f"Retrying in {countdown:g} s (attempt {attempt + 2} of {settings.IMPORT_MAX_RETRIES + 1}): "
                          f"{str(exc)[:500]}")
                raise RetryLater(str(exc), countdown) from None
            _fail(version_id, f"The source could not be fetched after {attempt + 1} attempts: {str(exc)[:800]}")
        except ArtifactRejected as exc:  # SourceRefused and SourceForbidden too
            _fail(version_id, str(exc))
        except Exception:
            log.exception("import of version %s failed", version)
            _fail(version_id, "The import failed on the server's side (the operator's logs say why); try again, or "
                              "ask an operator.")


def _stage(version: ModelVersion, fetched: Fetched) -> None:
    """The fetched file staged as an upload's bytes are, and the version on to inspection."""
    declared = fetched.signature
    check = quick_check(fetched.path, fetched.filename, fetched.declared_format, declared)
    staged_key = f"staging/{uuid.uuid4()}"
    store = get_store()
    with open(fetched.path, "rb") as stream:
        size = store.save(staged_key, stream)
    source = {**(version.source or {}), "fetched": fetched.record}
    with transaction.atomic():
        updated = ModelVersion.objects.filter(pk=version.pk, status=ModelVersion.Status.IMPORTING).update(
            status=ModelVersion.Status.VALIDATING, staged_key=staged_key, size=size, error="",
            original_filename=fetched.filename[:255], format=check.format, declared_format=fetched.declared_format,
            declared_signature=declared.to_json() if declared else None,
            declared_max_batch_size=fetched.max_batch_size, source=source,
            import_done_bytes=size, import_total_bytes=size)
        if updated != 1:  # cancelled while staging
            transaction.on_commit(lambda: store.delete(staged_key))
            return
        from models_registry import tasks

        tasks.queue_inspections(version.model.team_id)
    log.info("version %s imported (%s bytes), inspection queued", version, size)


def _fail(version_id: int, message: str) -> None:
    ModelVersion.objects.filter(pk=version_id, status=ModelVersion.Status.IMPORTING).update(
        status=ModelVersion.Status.INVALID, error=message, size=0, validated_at=timezone.now())


def sweep_stuck_imports() -> int:
    """Imports under way for longer than IMPORT_TIME_LIMIT_SECONDS and a grace (their worker died, or their task was
    lost): marked invalid, giving back their reservation. The count."""
    limit = timezone.now() - timedelta(seconds=settings.IMPORT_TIME_LIMIT_SECONDS + 300)
    stuck = ModelVersion.objects.filter(status=ModelVersion.Status.IMPORTING).exclude(
        import_started_at__isnull=True).filter(import_started_at__lt=limit)
    return stuck.update(status=ModelVersion.Status.INVALID, size=0, validated_at=timezone.now(),
                        error=f"The import did not finish within {settings.IMPORT_TIME_LIMIT_SECONDS} s "
                              "(IMPORT_TIME_LIMIT_SECONDS): its worker stopped. Import it again.")
