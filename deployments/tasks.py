from __future__ import annotations

from celery import shared_task
from django.conf import settings

from deployments import reconcile


@shared_task(acks_late=True)
def reconcile_deployment(deployment_id: int) -> None:
    reconcile.reconcile(deployment_id)


@shared_task
def reconcile_all() -> int:
    """Periodic: restart dead servers, resume deployments stuck after a crash, finish stops and deletions."""
    ids = reconcile.needs_attention()
    for deployment_id in ids:
        reconcile_deployment.apply_async((deployment_id,), expires=settings.RECONCILE_INTERVAL_SECONDS * 2)
    return len(ids)


@shared_task
def sweep_orphan_servers() -> int:
    """Periodic: stop local Tritons of this var/ that the database does not know (see runtimes.local)."""
    from deployments.runtimes.local import sweep_orphans

    return len(sweep_orphans())
