from __future__ import annotations

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction

from models_registry import dispatch, imports, inspection, uploads


# The limits hold in the inspection lane's prefork pool (infra/lanes.py): the soft one raises here, the hard one
# kills the child that did not stop (a loop in C), and the sweep then marks the version invalid.
@shared_task(acks_late=True, soft_time_limit=settings.INSPECTION_TIME_LIMIT_SECONDS,
             time_limit=settings.INSPECTION_TIME_LIMIT_SECONDS + settings.INSPECTION_KILL_GRACE_SECONDS)
def inspect_version(version_id: int) -> None:
    if not dispatch.started(version_id):
        dispatch.finished(version_id, send_inspection)  # gone or inspected already: its slot (if any) goes to the next
        return
    try:
        inspection.inspect_version(version_id)
    except SoftTimeLimitExceeded:
        dispatch.mark_timed_out(version_id)
    finally:
        dispatch.finished(version_id, send_inspection)


def send_inspection(version_id: int) -> None:
    """Queue one inspection with the limits the settings say now. Celery puts the sender's limits into the message and
    the worker obeys the message; the task's own attributes are read once per process (Task._get_exec_options caches
    them), so a sender whose settings change (tests, a reloaded config) would otherwise send the stale ones."""
    inspect_version.apply_async(
        (version_id,), soft_time_limit=settings.INSPECTION_TIME_LIMIT_SECONDS,
        time_limit=settings.INSPECTION_TIME_LIMIT_SECONDS + settings.INSPECTION_KILL_GRACE_SECONDS)


@shared_task(expires=60)
def dispatch_inspections() -> int:
    """Periodic (on the reconcile queue, never behind a spinning inspection): dispatch.sweep(), and imports whose
    worker died."""
    imports.sweep_stuck_imports()
    return dispatch.sweep(send_inspection)


# On the import lane (infra/queues.py): a fetch waits on the network for up to IMPORT_TIME_LIMIT_SECONDS, never in
# front of an inspection or a reconcile tick. acks_late: a worker that dies mid-fetch leaves the message to another.
@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def import_version(self: Task, version_id: int) -> None:
    try:
        imports.run_import(version_id, attempt=self.request.retries)
    except imports.RetryLater as exc:
        raise self.retry(countdown=exc.countdown) from None


def queue_inspections(team_id: int) -> None:
    """After commit (the new version must be visible to the worker): fill the team's free inspection slots."""
    transaction.on_commit(lambda: dispatch.dispatch(team_id, send_inspection))


@shared_task(expires=300)
def delete_expired_uploads() -> int:
    """Expired uploads, then the S3 multipart uploads left behind (an abort that failed, a process that died)."""
    count = uploads.delete_expired_uploads()
    uploads.abort_stale_multipart_uploads()
    return count
