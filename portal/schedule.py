"""The Celery beat schedule, in one place. Periodic tasks carry `expires` so that a backlog (beat running while
no worker is) does not pile up duplicates."""

from __future__ import annotations

from typing import Any


def beat_schedule(reconcile_interval: float) -> dict[str, dict[str, Any]]:
    return {
        "reconcile-deployments": {
            "task": "deployments.tasks.reconcile_all",
            "schedule": reconcile_interval,
            "options": {"expires": reconcile_interval},
        },
        "sweep-orphan-tritons": {
            "task": "deployments.tasks.sweep_orphan_servers",
            "schedule": 30.0,
            "options": {"expires": 30},
        },
        "delete-expired-idempotency-records": {
            "task": "accounts.tasks.delete_expired_idempotency_records",
            "schedule": 3600.0,
            "options": {"expires": 600},
        },
        "delete-expired-uploads": {
            "task": "models_registry.tasks.delete_expired_uploads",
            "schedule": 3600.0,
            "options": {"expires": 600},
        },
    }
