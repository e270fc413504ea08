"""The reconciler's Celery tasks, and the one way to queue them.

Reconcile work is coalesced per deployment: `queue_reconcile` sends a task only when none is waiting for that
deployment (a conditional update of `reconcile_queued_at`), and the task clears the mark before it reads the
deployment, so a change committed while it waits is seen by it and a change committed after the mark is cleared
queues the next run. A burst of 700 PATCHes therefore costs one queued task and one rollout of the last revision,
instead of 700 tasks that delay every other deployment.

The broker is not a database: a task lost with it (a Redis restart, a worker killed) or one that could not be sent
(the broker down) is found again by `reconcile_all`, which beat runs every RECONCILE_INTERVAL_SECONDS, from what the
database says. A mark older than QUEUED_FOR_AT_MOST no longer holds a new task back.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import kombu.exceptions
from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from deployments import reconcile
from deployments.models import Deployment
from deployments.runtimes.local import triton as local_triton
from portal import worker_shutdown

log = logging.getLogger(__name__)

# A queued reconcile that has not started within this long is presumed lost (a broker restart, an expired message).
QUEUED_FOR_AT_MOST = timedelta(seconds=30)
# What publishing raises when the broker cannot be reached (after kombu's own short retries).
BROKER_DOWN = (kombu.exceptions.OperationalError, OSError)


def queue_reconcile(deployment_id: int, **options: Any) -> bool:
    """Queue a reconcile of the deployment unless one is waiting already; True when a task was sent."""
    now = timezone.now()
    waiting = Q(reconcile_queued_at__isnull=False) & Q(reconcile_queued_at__gte=now - QUEUED_FOR_AT_MOST)
    if not Deployment.objects.filter(pk=deployment_id).exclude(waiting).update(reconcile_queued_at=now):
        return False
    try:
        reconcile_deployment.apply_async((deployment_id,), **options)
    except BROKER_DOWN as exc:
        # The change is saved; the periodic reconcile acts on it once the broker is back.
        log.warning("could not queue a reconcile of deployment %s (broker unreachable: %s); the periodic "
                    "reconcile will pick it up", deployment_id, exc)
        Deployment.objects.filter(pk=deployment_id, reconcile_queued_at=now).update(reconcile_queued_at=None)
        return False
    return True


@worker_ready.connect
def check_the_sandbox(**kwargs: Any) -> None:
    """The worker starts the local Tritons: say at start-up whether it can sandbox them (and why not)."""
    from deployments.runtimes.local.runtime import sandbox_capabilities

    sandbox_capabilities()  # logs what it found, a warning when anything is missing


@shared_task(acks_late=True)
def reconcile_deployment(deployment_id: int) -> None:
    Deployment.objects.filter(pk=deployment_id).update(reconcile_queued_at=None)
    try:
        reconcile.reconcile(deployment_id)
    except worker_shutdown.WorkerStopping:
        # What was started (a Triton loading its models) keeps going; the next worker's reconcile adopts it.
        log.info("worker stopping: left deployment %s to the next reconcile", deployment_id)


@shared_task
def reconcile_all() -> int:
    """Periodic: restart dead servers, resume deployments stuck after a crash, finish stops and deletions."""
    # A server this process started and another process stopped (a delete runs in the web process) leaves its
    # launcher a zombie child here until collected.
    local_triton.reap_children()
    return sum(queue_reconcile(deployment_id, expires=settings.RECONCILE_INTERVAL_SECONDS * 2)
               for deployment_id in reconcile.needs_attention())


@shared_task
def refresh_repository_access() -> int:
    """Periodic: renew the presigned URLs that Triton's pods on Kubernetes fetch their repository with."""
    from deployments.runtimes.kubernetes.runtime import refresh_repository_access as refresh

    return refresh()


@shared_task
def sweep_orphan_servers() -> int:
    """Periodic: stop local Tritons of this var/ that the database does not know (see runtimes.local)."""
    from deployments.runtimes.local.runtime import sweep_orphans

    return len(sweep_orphans())
