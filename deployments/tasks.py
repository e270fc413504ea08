from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from deployments import local_triton, reconcile


@worker_ready.connect
def check_the_sandbox(**kwargs: Any) -> None:
    """The worker starts the local Tritons: say at start-up whether it can sandbox them (and why not)."""
    from deployments.runtimes.local import sandbox_capabilities

    sandbox_capabilities()  # logs what it found, a warning when anything is missing


@shared_task(acks_late=True)
def reconcile_deployment(deployment_id: int) -> None:
    reconcile.reconcile(deployment_id)


@shared_task
def reconcile_all() -> int:
    """Periodic: restart dead servers, resume deployments stuck after a crash, finish stops and deletions."""
    # A server this process started and another process stopped (a delete runs in the web process) leaves its
    # launcher a zombie child here until collected.
    local_triton.reap_children()
    ids = reconcile.needs_attention()
    for deployment_id in ids:
        reconcile_deployment.apply_async((deployment_id,), expires=settings.RECONCILE_INTERVAL_SECONDS * 2)
    return len(ids)


@shared_task
def sweep_orphan_servers() -> int:
    """Periodic: stop local Tritons of this var/ that the database does not know (see runtimes.local)."""
    from deployments.runtimes.local import sweep_orphans

    return len(sweep_orphans())
