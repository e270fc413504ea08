"""Imported versions (issue 35): a version whose bytes a worker fetches from a `source` (sources/), then hands to the
same inspection as an upload.

The API validates the source (`fetcher_for(kind).validate`) and creates the version `importing` with `size` 0; the
import lane's task (`tasks.import_version`) runs `run_import` on a worker: it fetches into a temporary directory
through the fetcher, with `progress` as the one front door for sizes, cancellation and quota; then stores the one
file it produced as `staged_key` exactly as an upload (quick_check, store.save) and makes the version `validating`,
where the inspection dispatch (dispatch.py) takes it: inspection, sandbox and archive rules are the upload's.

While importing, the version's `size` is the bytes reserved in the team's quota (quota.usage_of counts it): the
declared total as soon as the fetcher knows it (refused before the bytes when the quota cannot hold it), otherwise
what has arrived so far.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import Any

import kombu.exceptions
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.log import record as audit
from modelport.core.signature import Signature, signature_from_json
from models_registry import quota
from models_registry.actions import _save_new_model, check_streamable
from models_registry.models import Model, ModelVersion
from models_registry.sources import fetcher_for
from models_registry.sources.base import FetchCancelled, FetchContext, Fetched, SourceRefused, TransientFetchError
from models_registry.storage import best_effort, get_store
from models_registry.validation import ArtifactRejected, quick_check

log = logging.getLogger(__name__)

V = ModelVersion.Status
# Progress is written to the row at most this often: a fetch reports every MiB.
PROGRESS_EVERY_SECONDS = 0.5
# An import queued but never begun within this long was lost with the broker: queued again by the sweep.
QUEUED_LOST_AFTER = timedelta(hours=1)
BROKER_DOWN = (kombu.exceptions.OperationalError, OSError)
GENERIC_ERROR = ("The import failed on the server (an internal error, logged for the operators); try again, or "
                 "upload the model's file instead.")


class Outcome(Enum):
    DONE = "done"  # validating, or invalid with a message, or cancelled/gone: nothing more to do
    RETRY = "retry"  # a transient fault: the task retries with backoff


def identity_key(identity: str) -> str:
    """What `source_identity` stores: the identity itself, or a digest of one too long for the column."""
    if len(identity) <= 1000:
        return identity
    return "sha256:" + hashlib.sha256(identity.encode()).hexdigest()


def existing_import(model: Model, identity: str) -> ModelVersion | None:
    """The model's latest version imported from this source that is not invalid (cancelled ones are invalid)."""
    if model.pk is None:
        return None
    return (ModelVersion.objects.select_related("model", "created_by")
            .filter(model=model, source_identity=identity_key(identity)).exclude(status=V.INVALID)
            .order_by("-number").first())


def create_version_from_source(model: Model, user: Any, source: dict[str, Any], identity: str, *,
                               new_version: bool = False, declared_format: str = "",
                               signature: Signature | None = None, max_batch_size: int | None = None,
                               example_request: dict[str, Any] | None = None, decoupled: bool = False,
                               chat_template: str = "") -> tuple[ModelVersion, bool]:
    """An importing version of a validated source, its fetch queued after commit; (version, created). The same
    source identity again into one model gives the existing version (created False) unless `new_version`, or
    unless that one is invalid (failed or cancelled)."""
    check_streamable(declared_format, decoupled)
    with transaction.atomic():
        quota.lock_team(model.team)  # two requests of one source at once: the second finds the first's version
        existing = None if new_version else existing_import(model, identity)
        if existing is not None:
            return existing, False
        model = _save_new_model(model, user)
        version = ModelVersion.objects.create(
            model=model, number=model.next_version_number(), declared_format=declared_format,
            declared_signature=signature.to_json() if signature else None, declared_max_batch_size=max_batch_size,
            example_request=example_request, decoupled=decoupled, chat_template=chat_template,
            status=V.IMPORTING, source=source, source_identity=identity_key(identity), created_by=user)
        audit(user, model.team, "model_version.import", f"{model.name}:{version.number}",
              kind=source.get("kind", ""), source=identity[:500])
        transaction.on_commit(lambda: send(version.pk))
    return version, True


def cancel_message(user: Any) -> str:
    return f"cancelled by {getattr(user, 'username', '') or 'someone'}"


def cancel(version: ModelVersion, user: Any) -> bool:
    """Mark an importing version cancelled (invalid, error "cancelled by <user>"): its fetch stops at its next
    progress call. False when it was no longer importing."""
    changed = ModelVersion.objects.filter(pk=version.pk, status=V.IMPORTING).update(
        status=V.INVALID, error=cancel_message(user), validated_at=timezone.now(), size=0)
    if changed:
        audit(user, version.model.team, "model_version.import_cancel", f"{version.model.name}:{version.number}")
    return bool(changed)


def send(version_id: int, countdown: float | None = None) -> None:
    """Queue the import (after commit, by the caller); a broker that is down leaves it to the sweep."""
    from models_registry import tasks

    try:
        tasks.import_version.apply_async((version_id,), countdown=countdown)
    except BROKER_DOWN as exc:
        log.warning("could not queue the import of version %s (broker unreachable: %s)", version_id, exc)


def _claim(version_id: int) -> ModelVersion | None:
    """Mark the fetch begun (for the time-limit sweep); None when the version is gone, cancelled or fetched by
    another worker that has not passed the limit (a message delivered twice)."""
    now = timezone.now()
    stale = now - timedelta(seconds=settings.IMPORT_TIME_LIMIT_SECONDS)
    claimed = (ModelVersion.objects.filter(pk=version_id, status=V.IMPORTING)
               .filter(Q(import_started_at__isnull=True) | Q(import_started_at__lt=stale))
               .update(import_started_at=now))
    if not claimed:
        return None
    return ModelVersion.objects.select_related("model__team").filter(pk=version_id).first()


def _mark_invalid(version_id: int, message: str) -> None:
    ModelVersion.objects.filter(pk=version_id, status=V.IMPORTING).update(
        status=V.INVALID, error=message[:10_000], validated_at=timezone.now(), size=0, import_started_at=None)


def make_progress(version: ModelVersion, max_bytes: int) -> Callable[[int, int | None], None]:
    """FetchContext.progress for `version`: refuses what exceeds `max_bytes` or the declared total, reserves the
    team's quota for the total (or the bytes so far) under the team's lock, records done/total on the row at most
    every PROGRESS_EVERY_SECONDS, and raises FetchCancelled once the version is no longer importing."""
    team = version.model.team
    state: dict[str, Any] = {"written_at": 0.0, "reserved": 0, "total": None}

    def progress(done: int, total: int | None) -> None:
        if total is not None and total > max_bytes:
            raise SourceRefused(_too_large(total, max_bytes))
        if done > max_bytes:
            raise SourceRefused(_too_large(done, max_bytes))
        if total is not None:
            state["total"] = total
        declared = state["total"]
        if declared is not None and done > declared:
            raise SourceRefused(f"The source sent more bytes ({done}) than it declared ({declared}): refused.")
        needed = declared if declared is not None else done
        now = time.monotonic()
        if needed > state["reserved"]:
            _reserve(version.pk, team, needed, state["reserved"])
            state["reserved"] = needed
        elif now - state["written_at"] < PROGRESS_EVERY_SECONDS:
            if not ModelVersion.objects.filter(pk=version.pk, status=V.IMPORTING).exists():
                raise FetchCancelled()
            return
        state["written_at"] = now
        if not ModelVersion.objects.filter(pk=version.pk, status=V.IMPORTING).update(
                import_done_bytes=done, import_total_bytes=declared):
            raise FetchCancelled()

    return progress


def _too_large(size: int, max_bytes: int) -> str:
    return (f"The source is {quota.size_text(size)}, more than this import may take: {quota.size_text(max_bytes)} "
            "(the smaller of MAX_UPLOAD_SIZE and what is left of the team's storage quota). Delete versions you no "
            "longer need, or ask an operator for a larger quota.")


def _reserve(version_id: int, team: Any, needed: int, reserved: int) -> None:
    """Grow the version's reservation (its `size`) to `needed`, under the team's lock: NoRoom (a SourceRefused's
    sibling, an ArtifactRejected) when the quota cannot hold it. The reservation already held counts as used."""
    with transaction.atomic():
        quota.lock_team(team)
        quota.check_room(team, needed - reserved, disk=False)
        if not ModelVersion.objects.filter(pk=version_id, status=V.IMPORTING).update(size=needed):
            raise FetchCancelled()


def run_import(version_id: int, attempt: int = 0) -> Outcome:
    """Fetch one version's bytes and hand it to inspection; never raises (the row records what went wrong)."""
    version = _claim(version_id)
    if version is None:
        return Outcome.DONE
    try:
        return _run(version, attempt)
    except FetchCancelled:
        return Outcome.DONE
    except TransientFetchError as exc:
        if attempt < settings.IMPORT_MAX_RETRIES:
            log.info("version %s: transient fault fetching (attempt %s): %s", version_id, attempt + 1, exc)
            # Unclaimed, so that the retry (a new delivery) can claim it.
            ModelVersion.objects.filter(pk=version_id, status=V.IMPORTING).update(import_started_at=None)
            return Outcome.RETRY
        _mark_invalid(version_id, f"{exc} (gave up after {attempt + 1} attempts, IMPORT_MAX_RETRIES)")
    except ArtifactRejected as exc:  # SourceRefused, SourceForbidden, NoRoom, a quick_check refusal
        _mark_invalid(version_id, str(exc))
    except Exception:
        log.exception("version %s: the import failed", version_id)
        _mark_invalid(version_id, GENERIC_ERROR)
    return Outcome.DONE


def _run(version: ModelVersion, attempt: int) -> Outcome:
    source = dict(version.source or {})
    fetcher = fetcher_for(str(source.get("kind", "")))
    team = version.model.team
    room = quota.room_for(team)
    left = max(room.quota - room.used + version.size, 0)  # its own reservation is its to use
    max_bytes = min(int(settings.MAX_UPLOAD_SIZE), left)
    with tempfile.TemporaryDirectory(prefix="modelport-import-") as tmp:
        workdir = Path(tmp) / "work"
        workdir.mkdir()
        ctx = FetchContext(team_id=team.pk, team_name=team.name, workdir=workdir, max_bytes=max_bytes,
                           progress=make_progress(version, max_bytes),
                           deadline=time.monotonic() + settings.IMPORT_TIME_LIMIT_SECONDS)
        fetched = fetcher.fetch(source, ctx)
        _store(version, source, fetched, ctx)
    return Outcome.DONE


def _store(version: ModelVersion, source: dict[str, Any], fetched: Fetched, ctx: FetchContext) -> None:
    path = Path(fetched.path)
    if not path.resolve().is_relative_to(ctx.workdir.resolve()) or not path.is_file() or path.is_symlink():
        raise RuntimeError(f"fetcher {source.get('kind')!r} returned a path outside its working directory: {path}")
    size = path.stat().st_size
    ctx.progress(size, size)  # the final size: refused beyond the limits, reserved, recorded
    declared_format = version.declared_format or fetched.declared_format
    signature = version.declared_signature
    parsed = signature_from_json(signature) if signature else fetched.signature
    check = quick_check(path, fetched.filename, declared_format, parsed)
    check_streamable(check.format, version.decoupled)
    quota.check_room(version.model.team, 0)  # the disk: the quota was reserved above
    staged_key = f"staging/{uuid.uuid4()}"
    store = get_store()
    with open(path, "rb") as stream:
        stored = store.save(staged_key, stream)
    record = {k: v for k, v in fetched.record.items() if k not in source}
    max_batch = version.declared_max_batch_size
    if max_batch is None:
        max_batch = fetched.max_batch_size
    with transaction.atomic():
        changed = ModelVersion.objects.filter(pk=version.pk, status=V.IMPORTING).update(
            status=V.VALIDATING, staged_key=staged_key, size=stored, format=check.format,
            declared_format=declared_format, original_filename=fetched.filename[:255],
            declared_signature=parsed.to_json() if parsed else None, declared_max_batch_size=max_batch,
            source={**source, **record}, import_done_bytes=stored, import_total_bytes=stored)
        if changed:
            from models_registry import tasks

            tasks.queue_inspections(version.model.team_id)
    if not changed:  # cancelled or deleted meanwhile
        with best_effort("delete the bytes of a cancelled import at", staged_key):
            store.delete(staged_key)


def time_limit_message() -> str:
    return (f"The import did not finish within {settings.IMPORT_TIME_LIMIT_SECONDS:g} s "
            "(IMPORT_TIME_LIMIT_SECONDS; its worker may have stopped): import it again.")


def sweep() -> int:
    """Periodic (with the inspections' sweep): imports begun and not ended past the time limit (a worker that died)
    are marked invalid; imports never begun within QUEUED_LOST_AFTER (lost with the broker) are queued again.
    Returns how many were queued again."""
    now = timezone.now()
    past = now - timedelta(seconds=settings.IMPORT_TIME_LIMIT_SECONDS + 60)
    for version_id in ModelVersion.objects.filter(status=V.IMPORTING, import_started_at__lt=past
                                                  ).values_list("pk", flat=True):
        _mark_invalid(version_id, time_limit_message())
        log.warning("version %s: its import passed the time limit; marked invalid", version_id)
    lost = list(ModelVersion.objects.filter(status=V.IMPORTING, import_started_at__isnull=True,
                                            created_at__lt=now - QUEUED_LOST_AFTER).values_list("pk", flat=True))
    for version_id in lost:
        send(version_id)
    return len(lost)
