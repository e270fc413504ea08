"""The Celery queues, in one place. Reconciliation and inspection run on queues of their own, so that uploads being
inspected (up to TRIAL_RUN_TIMEOUT_SECONDS each) never hold back a rollout's ticks, and the other way round. A worker
started without -Q consumes every queue declared here (portal/celery.py); an operator who wants dedicated workers
starts them with `-Q reconcile` and `-Q inspection`."""

from __future__ import annotations

from enum import StrEnum


class Queue(StrEnum):
    # The reconciler's ticks and the periodic work on deployments: short tasks, latency-sensitive.
    RECONCILE = "reconcile"
    # Inspection of uploaded versions, building python models' environments (pip), and housekeeping (expired
    # uploads, idempotency records): may take minutes.
    INSPECTION = "inspection"
    # Tunes (tuning/tasks.py): each measures temporary Tritons for up to its budget, an hour at most.
    TUNE = "tune"


# Where each task goes; anything not named goes to INSPECTION (the default queue), never ahead of a rollout.
ROUTES: dict[str, dict[str, str]] = {
    # Exact names win over the patterns below: pip may run for minutes, never ahead of a tick.
    "deployments.tasks.build_python_env": {"queue": Queue.INSPECTION},
    # A short sweep: never queued behind an hour-long tune.
    "tuning.tasks.sweep_servers": {"queue": Queue.RECONCILE},
    "deployments.tasks.*": {"queue": Queue.RECONCILE},
    "models_registry.tasks.*": {"queue": Queue.INSPECTION},
    "accounts.tasks.*": {"queue": Queue.INSPECTION},
    "tuning.tasks.*": {"queue": Queue.TUNE},
}
DEFAULT = Queue.INSPECTION
