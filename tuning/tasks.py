"""The tune's Celery task, on its own queue ("tune", infra/queues.py): a tune runs for up to its budget (an hour at
most), so it must never hold back a rollout's ticks or an inspection.

acks_late is off for this task (the project's default is on): a tune outlives the broker's visibility timeout, and a
redelivered tune would only find itself running already (claim() is a conditional update). A worker killed mid-tune
loses it; the next tune on that machine marks it failed once its heartbeat is stale (tuning/runner.py)."""

from __future__ import annotations

import logging

from celery import shared_task

from tuning import runner

log = logging.getLogger(__name__)


@shared_task(acks_late=False, ignore_result=True)
def run_tune(tune_id: int) -> None:
    waiting = runner.run(tune_id)
    if waiting is not None:
        log.info("Tune %s waits: %s", tune_id, waiting)
        run_tune.apply_async((tune_id,), countdown=runner.WAIT_SECONDS)


@shared_task(ignore_result=True)
def sweep_servers() -> int:
    """Periodic (on the reconcile queue, never behind a tune): stop temporary Tritons whose tune no longer runs."""
    return len(runner.sweep_servers())
