"""The import a worker of the import lane runs (issue 35; the version it starts from: models_registry/imports.py).

`run_import` fetches the version's source into a working directory of its own through its kind's fetcher, reserving
the team's quota for the total as soon as the source declares it (a source larger than the quota is refused before its
bytes arrive), writing progress on the row, and stopping at the next chunk once the version is cancelled. What the
fetcher produced is then staged exactly as an upload's bytes are (quick_check, the store) and handed to the same
inspection. Nothing here opens or runs what was fetched. It queues nothing itself: the task passes the inspection
dispatch in, so that this module needs neither the tasks nor the actions.
"""

from __future__ import annotations

import logging
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from modelport.core import formats
from modelport.core.signature import signature_from_json
from models_registry import quota
from models_registry.import_identity import Declared, fetched_identity
from models_registry.models import ModelVersion
from models_registry.sources import fetcher_for
from models_registry.sources.base import FetchCancelled, FetchContext, Fetched, SourceRefused, TransientFetchError
from models_registry.storage import get_store
from models_registry.validation import ArtifactRejected, quick_check

log = logging.getLogger(__name__)

# Progress is written at most this often (a fetch reports every MiB): the page and the CLI poll about once a second.
_PROGRESS_EVERY_SECONDS = 0.5
# How far ahead of the bytes a source without a declared total reserves the team's quota.
_RESERVE_AHEAD_BYTES = 64 * 1024 * 1024


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
            # Without a declared total the reservation grows with the bytes: a step ahead at a time, so that a
            # source of gigabytes takes the team's lock (which its uploads wait on) every 64 MiB, not every MiB.
            ahead = need if total else min(self.max_bytes, need + _RESERVE_AHEAD_BYTES)
            self._reserve(need, ahead)
        now = time.monotonic()
        if total != self.written_total or now - self.written_at >= _PROGRESS_EVERY_SECONDS:
            self._write(done, total)
            self.written_at, self.written_total = now, total

    def _reserve(self, need: int, ahead: int) -> None:
        with transaction.atomic():
            quota.lock_team(self.team)
            if not ModelVersion.objects.filter(pk=self.version_id, status=ModelVersion.Status.IMPORTING).exists():
                raise FetchCancelled()
            # The version's own reservation is in the team's usage already: only the increase must fit. The step
            # ahead where it fits, else exactly what arrived (a quota nearly full still takes a source that fits).
            if ahead > need and self._fits(ahead):
                reserve = ahead
            else:
                reserve = need
                try:
                    quota.check_room(self.team, need - self.reserved)
                except quota.NoRoom as exc:  # its message names the quota or the disk
                    raise SourceRefused(str(exc).replace("The upload is", "The source is", 1)) from None
            ModelVersion.objects.filter(pk=self.version_id).update(size=reserve)
        self.reserved = reserve

    def _fits(self, reserve: int) -> bool:
        try:
            quota.check_room(self.team, reserve - self.reserved)
        except quota.NoRoom:
            return False
        return True

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


def run_import(version_id: int, attempt: int = 0, queue_inspection: Callable[[int], None] | None = None) -> None:
    """Fetch the version's source and hand its bytes to inspection (on a worker of the import lane). RetryLater for a
    transient fault while `attempt` < IMPORT_MAX_RETRIES; every other outcome is recorded on the version.
    `queue_inspection(team_id)` queues the team's inspections after commit (tasks.queue_inspections); None: the
    version is left validating for the dispatch sweep (tests that inspect in their own process)."""
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
            _stage(version, fetched, queue_inspection)
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


def _stage(version: ModelVersion, fetched: Fetched, queue_inspection: Callable[[int], None] | None) -> None:
    """The fetched file staged as an upload's bytes are, and the version on to inspection."""
    # What the team declared with the source wins over what the source says (Declared in imports.py).
    declared = (signature_from_json(version.declared_signature) if version.declared_signature
                else fetched.signature)
    declared_format = version.declared_format or fetched.declared_format
    max_batch_size = (version.declared_max_batch_size if version.declared_max_batch_size is not None
                      else fetched.max_batch_size)
    check = quick_check(fetched.path, fetched.filename, declared_format, declared)
    if version.decoupled and check.format != formats.PYTHON:  # actions.check_streamable's rule, for a detected format
        raise ArtifactRejected(f"decoupled=true is for python models only; the source is a "
                               f"{formats.get(check.format).label} model: leave decoupled out.")
    staged_key = f"staging/{uuid.uuid4()}"
    store = get_store()
    with open(fetched.path, "rb") as stream:
        size = store.save(staged_key, stream)
    source = {**(version.source or {}), "fetched": fetched.record}
    identity = _identity_fetched(version, fetched)
    with transaction.atomic():
        updated = ModelVersion.objects.filter(pk=version.pk, status=ModelVersion.Status.IMPORTING).update(
            status=ModelVersion.Status.VALIDATING, staged_key=staged_key, size=size, error="",
            original_filename=fetched.filename[:255], format=check.format, declared_format=declared_format,
            declared_signature=declared.to_json() if declared else None,
            declared_max_batch_size=max_batch_size, source=source, source_identity=identity,
            import_done_bytes=size, import_total_bytes=size)
        if updated != 1:  # cancelled while staging
            transaction.on_commit(lambda: store.delete(staged_key))
            return
        if queue_inspection is not None:
            queue_inspection(version.model.team_id)
    log.info("version %s imported (%s bytes), inspection queued", version, size)


def _identity_fetched(version: ModelVersion, fetched: Fetched) -> str:
    """The version's key once fetched: a moving reference keyed by what it named when fetched (an alias moved since
    the API pinned it makes the version one of its new target's), any other source's key as the API set it."""
    canonical = {key: value for key, value in (version.source or {}).items() if key not in ("kind", "fetched")}
    kind = str((version.source or {}).get("kind", ""))
    if fetcher_for(kind).identity(canonical) is not None:
        return version.source_identity
    # What the team declared, as the API keyed it (the version's fields before this fetch fills them in).
    declared = Declared(format=version.declared_format, max_batch_size=version.declared_max_batch_size,
                        signature=signature_from_json(version.declared_signature) if version.declared_signature
                        else None, decoupled=version.decoupled, chat_template=version.chat_template)
    return fetched_identity(kind, canonical, fetched.record, declared) or ""


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
