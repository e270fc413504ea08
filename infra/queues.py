"""The Celery queues, in one place, and the lanes (worker processes) that consume them (infra/lanes.py).

Work that keeps deployments alive (reconcile ticks: start, stop, rollout, health) has a queue and worker processes
of its own, so that nothing a team can make slow (an inspection that spins until its time limit, a pip build, an
hour-long tune) ever holds back another team's stop. A worker started without -Q consumes every queue declared here
(portal/celery.py); bin/run-portal, docker-compose and the Kubernetes manifests start one worker per lane."""

from __future__ import annotations

from enum import StrEnum


class Queue(StrEnum):
    # The reconciler's ticks and the periodic work on deployments: short tasks, latency-sensitive.
    RECONCILE = "reconcile"
    # Inspection of uploaded versions (bounded by INSPECTION_TIME_LIMIT_SECONDS, at most
    # INSPECTION_MAX_ACTIVE_PER_TEAM queued or running per team) and housekeeping (expired uploads, idempotency
    # records).
    INSPECTION = "inspection"
    # Building python models' environments (pip, up to MODELPORT_PIP_TIMEOUT_SECONDS): a lane of its own, so that a
    # team's builds never take the inspection slots of the others, nor the other way round.
    BUILD = "build"
    # Imports of versions from MLflow, Hugging Face, s3/https (issue 35): network-bound fetches of up to
    # IMPORT_TIME_LIMIT_SECONDS, never ahead of an inspection or a tick.
    IMPORT = "import"
    # Tunes (tuning/tasks.py): each measures temporary Tritons for up to its budget, an hour at most.
    TUNE = "tune"


# Where each task goes; anything not named goes to INSPECTION (the default queue), never ahead of a rollout.
ROUTES: dict[str, dict[str, str]] = {
    # Exact names win over the patterns below: pip may run for minutes, never ahead of a tick.
    "deployments.tasks.build_python_env": {"queue": Queue.BUILD},
    # Short sweeps: never queued behind an hour-long tune or a spinning inspection.
    "tuning.tasks.sweep_servers": {"queue": Queue.RECONCILE},
    "models_registry.tasks.dispatch_inspections": {"queue": Queue.RECONCILE},
    "deployments.tasks.*": {"queue": Queue.RECONCILE},
    # A canary's guardrails act within seconds of a window going bad: beside the ticks, never behind an inspection.
    "gateway.tasks.check_canaries": {"queue": Queue.RECONCILE},
    # A pass reads every serving Triton at once with a 2 s timeout: seconds, on a thread of that lane, never behind
    # an inspection a team can make spin.
    "performance.tasks.take_snapshots": {"queue": Queue.RECONCILE},
    "models_registry.tasks.import_version": {"queue": Queue.IMPORT},
    "models_registry.tasks.*": {"queue": Queue.INSPECTION},
    "accounts.tasks.*": {"queue": Queue.INSPECTION},
    "tuning.tasks.*": {"queue": Queue.TUNE},
}
DEFAULT = Queue.INSPECTION
