"""The Celery beat schedule, in one place. Periodic tasks carry `expires` so that a backlog (beat running while
no worker is) does not pile up duplicates."""

from __future__ import annotations

from typing import Any


def beat_schedule(reconcile_interval: float, canary_check_interval: float = 5.0,
                  snapshot_interval: float = 60.0) -> dict[str, dict[str, Any]]:
    return {
        # The serving Tritons' statistics, for the performance panel (performance/snapshots.py).
        "take-performance-snapshots": {
            "task": "performance.tasks.take_snapshots",
            "schedule": snapshot_interval,
            "options": {"expires": snapshot_interval},
        },
        # A canary's guardrails (gateway/canary.py): a rollback within seconds of a window going bad.
        "check-canaries": {
            "task": "gateway.tasks.check_canaries",
            "schedule": canary_check_interval,
            "options": {"expires": canary_check_interval},
        },
        "reconcile-deployments": {
            "task": "deployments.tasks.reconcile_all",
            "schedule": reconcile_interval,
            "options": {"expires": reconcile_interval},
        },
        # Presigned repository URLs live at least an hour (KUBERNETES_REPOSITORY_URL_SECONDS) and are renewed at
        # half-life: a pass every 5 minutes renews each well before it expires.
        "refresh-repository-access": {
            "task": "deployments.tasks.refresh_repository_access",
            "schedule": 300.0,
            "options": {"expires": 300},
        },
        # Shared servers (deployments/pools.py): models idle past their idle_unload_seconds are unloaded.
        "unload-idle-pool-models": {
            "task": "deployments.tasks.unload_idle_pool_models",
            "schedule": 5.0,
            "options": {"expires": 5},
        },
        "sweep-orphan-tritons": {
            "task": "deployments.tasks.sweep_orphan_servers",
            "schedule": 30.0,
            "options": {"expires": 30},
        },
        # Temporary Tritons of tunes whose worker died mid-tune (tuning/runner.py).
        "sweep-tune-tritons": {
            "task": "tuning.tasks.sweep_servers",
            "schedule": 30.0,
            "options": {"expires": 30},
        },
        # Inspection slots (models_registry/dispatch.py): what the hard time limit killed or the broker lost.
        "dispatch-inspections": {
            "task": "models_registry.tasks.dispatch_inspections",
            "schedule": 30.0,
            "options": {"expires": 30},
        },
        # The gateway's request buckets past REQUEST_STATS_KEEP_HOURS (gateway/stats.py prune).
        "prune-request-stats": {
            "task": "gateway.tasks.prune_request_stats",
            "schedule": 600.0,
            "options": {"expires": 600},
        },
        "delete-expired-idempotency-records": {
            "task": "accounts.tasks.delete_expired_idempotency_records",
            "schedule": 3600.0,
            "options": {"expires": 600},
        },
        # An upload that receives no bytes expires in minutes (UPLOAD_STALL_EXPIRY_SECONDS): its quota is free at
        # once, and this removes its row and file within a minute more.
        "delete-expired-uploads": {
            "task": "models_registry.tasks.delete_expired_uploads",
            "schedule": 60.0,
            "options": {"expires": 60},
        },
    }
