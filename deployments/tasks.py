"""The reconciler's Celery tasks, and the one way to queue them.

Each task is one tick of deployments/reconcile.py: it returns in seconds, and queues the next tick itself when the
deployment wants one (a launch to look at again, a drain that ends) with a countdown. Beat runs `reconcile_all`
every RECONCILE_INTERVAL_SECONDS for every deployment not at rest, which also health-checks the serving ones.

Ticks are coalesced per deployment: `queue_reconcile` sends a task only when none is waiting that runs no later
(`reconcile_due_at`, a conditional update), and the task clears its mark before it reads the deployment, so a
change committed while it waits is seen by it and a change committed after the mark is cleared queues the next
tick. A burst of 700 PATCHes therefore costs one queued task and one rollout of the last revision, instead of 700
tasks that delay every other deployment; a follow-up due in a few seconds does not delay a user's change (that
one is due now, so it is sent).

The broker is not a database: a task lost with it (a Redis restart, a worker killed) or one that could not be sent
(the broker down) is found again by `reconcile_all` from what the database says. A mark due more than
QUEUED_FOR_AT_MOST ago no longer holds a new task back.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Any

import kombu.exceptions
from celery import Task, shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from deployments import reconcile
from deployments.models import Deployment
from deployments.runtimes.local import triton as local_triton

log = logging.getLogger(__name__)

# A queued tick that has not started this long after it was due is presumed lost (a broker restart, an expired
# message).
QUEUED_FOR_AT_MOST = timedelta(seconds=30)
# What publishing raises when the broker cannot be reached (after kombu's own short retries).
BROKER_DOWN = (kombu.exceptions.OperationalError, OSError)


def queue_reconcile(deployment_id: int, countdown: float = 0.0, **options: Any) -> bool:
    """Queue a tick of the deployment in `countdown` seconds unless one is waiting that runs no later; True when a
    task was sent."""
    now = timezone.now()
    due = now + timedelta(seconds=countdown)
    waiting = (Q(reconcile_due_at__isnull=False) & Q(reconcile_due_at__lte=due)
               & Q(reconcile_due_at__gte=now - QUEUED_FOR_AT_MOST))
    if not Deployment.objects.filter(pk=deployment_id).exclude(waiting).update(reconcile_due_at=due):
        return False
    if countdown > 0:
        options["countdown"] = countdown
    try:
        reconcile_deployment.apply_async((deployment_id,), kwargs={"due": due.isoformat()}, **options)
    except BROKER_DOWN as exc:
        # The change is saved; the periodic reconcile acts on it once the broker is back.
        log.warning("could not queue a reconcile of deployment %s (broker unreachable: %s); the periodic "
                    "reconcile will pick it up", deployment_id, exc)
        Deployment.objects.filter(pk=deployment_id, reconcile_due_at=due).update(reconcile_due_at=None)
        return False
    return True


@worker_ready.connect
def check_the_sandbox(**kwargs: Any) -> None:
    """The worker starts the local Tritons: say at start-up whether it can sandbox them (and why not)."""
    from infra import sandbox_settings

    sandbox_settings.sandbox_capabilities()  # logs what it found, a warning when anything is missing


@shared_task(bind=True, acks_late=True)
def reconcile_deployment(self: Task, deployment_id: int, due: str | None = None) -> None:
    """One tick; `due`: when this task was due (its mark, cleared here unless a later tick replaced it)."""
    mine = Q(reconcile_due_at=datetime.fromisoformat(due)) if due else Q()
    Deployment.objects.filter(mine, pk=deployment_id).update(reconcile_due_at=None)
    wait = reconcile.reconcile(deployment_id, queue_build=queue_build)
    if self.request.is_eager:
        # No worker at all (CELERY_TASK_ALWAYS_EAGER: some tests, a shell): the caller's thread takes the next
        # ticks itself, in a loop rather than through ever deeper nested eager tasks.
        while wait is not None:
            time.sleep(wait)
            wait = reconcile.reconcile(deployment_id, queue_build=queue_build)
    elif wait is not None:
        queue_reconcile(deployment_id, countdown=wait)


def queue_build(revision_id: int) -> bool:
    """Queue the build of a revision's python environment, which its runtime asked for (the reconciler calls this:
    it sits below the tasks, so they hand it the means); False when the broker cannot be reached (a later tick asks
    again)."""
    from deployments.runtimes.local import pyenv

    key = pyenv.mark_build_requested(revision_id)
    if key is None:
        return True  # nothing to build any more: the next tick finds it prepared
    try:
        build_python_env.delay(revision_id)
    except BROKER_DOWN as exc:
        log.warning("could not queue the build of python environment %s: %s", key, exc)
        pyenv.forget_build_request(key)
        return False
    return True


@shared_task(bind=True)
def build_python_env(self: Task, revision_id: int) -> None:
    """Install a revision's python requirements (deployments/pyenvs.py): on the inspection queue, since pip may take
    minutes, which no tick may. The deployment's next tick then starts Triton."""
    from deployments.runtimes.local.pyenv import build_python_env as build

    deployment_id = build(revision_id)
    if deployment_id is not None and not self.request.is_eager:  # eagerly, the waiting tick looks again itself
        queue_reconcile(deployment_id)


@shared_task
def reconcile_all() -> int:
    """Periodic: health-check serving deployments, move every deployment not at rest (rollouts whose follow-up
    tick was lost, stops and deletions waiting for their runtime), end drains."""
    # A server this process started and another process stopped leaves its launcher a zombie child here until
    # collected.
    local_triton.reap_children()
    return sum(queue_reconcile(deployment_id, expires=settings.RECONCILE_INTERVAL_SECONDS * 2)
               for deployment_id in reconcile.needs_attention())


@shared_task
def refresh_repository_access() -> int:
    """Periodic: renew the presigned URLs that Triton's pods on Kubernetes fetch their repository with."""
    from deployments.runtimes.registry import runtimes

    return sum(runtime.refresh_access() for runtime in runtimes())


@shared_task
def sweep_orphan_servers() -> int:
    """Periodic: stop the servers each runtime started that no row knows (a local Triton of this var/ a worker
    spawned just before it died, say)."""
    from deployments.runtimes.registry import runtimes

    return sum(len(runtime.sweep_orphans()) for runtime in runtimes())


@shared_task
def unload_idle_pool_models() -> int:
    """Periodic: in each runtime's pools, unload the models unused for their idle_unload_seconds (the next request
    loads them again), load those a held request woke, and stop the pool servers that have had no deployment's
    models for POOL_EMPTY_SERVER_STOP_SECONDS. Returns how many revisions were unloaded or loaded again and servers
    stopped."""
    from deployments.runtimes.registry import runtimes

    return sum(len(runtime.unload_idle()) for runtime in runtimes())
