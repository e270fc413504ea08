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
def refresh_repository_access() -> int:
    """Periodic: renew the presigned URLs that Triton's pods on Kubernetes fetch their repository with."""
    from deployments.runtimes.kubernetes import refresh_repository_access as refresh

    return refresh()
