"""The reconciler: moves a deployment toward what the user asked for (serving its current revision, stopped, or
deleted) through its runtime. Every step is idempotent, so running it twice, or again after a worker was killed
half-way, is safe; a lease (a conditional update) keeps two workers from acting on one deployment at once."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from deployments.events import record
from deployments.models import Deployment, Event
from deployments.render import RenderError
from deployments.runtimes.base import Runtime, RuntimeUnavailable
from deployments.runtimes.registry import runtime_for
from portal import worker_shutdown

log = logging.getLogger(__name__)

LEASE_SECONDS = 30.0

S = Deployment.Status


def reconcile(deployment_id: int) -> None:
    deployment = Deployment.objects.select_related("revision", "serving_revision").filter(pk=deployment_id).first()
    if deployment is None:
        return
    if not deployment.claim(LEASE_SECONDS):
        log.info("%s is being reconciled by another worker", deployment)
        return
    runtime = runtime_for(deployment)
    try:
        if deployment.desired_state == Deployment.Desired.DELETED:
            runtime.teardown(deployment)
            deployment.delete()
        elif deployment.desired_state == Deployment.Desired.STOPPED:
            _stop(deployment, runtime)
        else:
            _run(deployment, runtime)
    except RuntimeUnavailable as exc:
        _unavailable(deployment, str(exc))
    finally:
        Deployment.objects.filter(pk=deployment_id).update(lease_until=None)


def _run(deployment: Deployment, runtime: Runtime) -> None:
    target = deployment.revision
    if target is None or deployment.status == S.FAILED:
        return  # a failed deployment waits for the user: a new revision (PATCH) or start makes it pending again
    if deployment.status == S.READY and deployment.serving_revision_id == target.pk:
        health = runtime.check(deployment)
        if health.ok:
            return
        record(deployment, Event.Kind.ERROR, f"Revision {target.number} stopped serving: {health.message}; restarting it."
               + (f" Last log lines:\n{health.detail}" if health.detail else ""))
        deployment.set_status(S.STARTING, f"Restarting: {health.message}.", upstream_url="")
    _roll_out(deployment, runtime)


def _roll_out(deployment: Deployment, runtime: Runtime) -> None:
    target = deployment.revision
    assert target is not None
    if deployment.status in (S.PENDING, S.RENDERING):
        deployment.set_status(S.RENDERING, f"Rendering the model repository of revision {target.number}.")
        try:
            runtime.prepare(target)
        except RenderError as exc:
            _fail(deployment, f"Revision {target.number} cannot be rendered: {exc}")
            return
        record(deployment, Event.Kind.INFO, f"Rendered the model repository of revision {target.number}.")
    if deployment.status != S.STARTING:
        deployment.set_status(S.STARTING, f"Starting Triton for revision {target.number}.")
    launch = runtime.launch(target)
    record(deployment, Event.Kind.INFO, f"Triton for revision {target.number} is starting ({launch.description}).")

    def keep_waiting() -> bool:
        # A stopping worker gives up the wait (leaving Triton to start); the next reconcile adopts the server.
        worker_shutdown.raise_if_stopping()
        deployment.renew(LEASE_SECONDS)
        now = Deployment.objects.filter(pk=deployment.pk).values("desired_state", "revision_id").first()
        return now is not None and now["desired_state"] == Deployment.Desired.RUNNING and now["revision_id"] == target.pk

    ready = runtime.wait_ready(launch, keep_waiting)
    if not ready.ready:
        runtime.abandon(launch)
        if not ready.cancelled:  # else the user changed the deployment meanwhile; the next reconcile acts on that
            _fail(deployment, f"Revision {target.number} failed to start: {ready.message}", ready.detail)
        return
    previous_url = deployment.upstream_url
    with transaction.atomic():
        # The switch the gateway sees: one UPDATE of the upstream and the serving revision.
        deployment.set_status(S.READY, f"Serving revision {target.number}.", serving_revision=target, upstream_url=launch.url)
        record(deployment, Event.Kind.INFO, f"Revision {target.number} is ready and serving ({launch.description}).")
    if previous_url and previous_url != launch.url:
        # A new server took over (a new revision, or the same one restarted with other sandbox settings): in-flight
        # requests and cached routes to the old one finish before retire() stops it.
        time.sleep(settings.ROLLOUT_DRAIN_SECONDS)
    for message in runtime.retire(deployment, keep=launch):
        record(deployment, Event.Kind.INFO, message)


def _fail(deployment: Deployment, message: str, detail: str = "") -> None:
    serving = deployment.serving_revision
    if serving is not None and deployment.upstream_url:
        message += f" Revision {serving.number} keeps serving."
    full = message + (f"\n{detail}" if detail else "")
    deployment.set_status(S.FAILED, full)
    record(deployment, Event.Kind.ERROR, full)


def _unavailable(deployment: Deployment, message: str) -> None:
    if deployment.desired_state == Deployment.Desired.RUNNING:
        _fail(deployment, message)
        return
    # Stopping or deleting: the periodic reconcile tries again until the runtime answers.
    waiting = f"Waiting for the runtime: {message}"
    if deployment.status_message != waiting:
        deployment.set_status(S.STOPPING, waiting)
        record(deployment, Event.Kind.WARNING, waiting)


def _stop(deployment: Deployment, runtime: Runtime) -> None:
    if deployment.status == S.STOPPED:
        return
    deployment.set_status(S.STOPPING, "Stopping Triton.", upstream_url="", serving_revision=None)
    runtime.stop(deployment)
    deployment.set_status(S.STOPPED, "Stopped.")
    record(deployment, Event.Kind.INFO, "Stopped.")


def needs_attention() -> list[int]:
    """Deployments a periodic reconcile should look at: anything not at rest where the user wants it."""
    running = Q(desired_state=Deployment.Desired.RUNNING) & ~Q(status=S.FAILED)
    stopping = Q(desired_state=Deployment.Desired.STOPPED) & ~Q(status=S.STOPPED)
    deleting = Q(desired_state=Deployment.Desired.DELETED)
    return list(Deployment.objects.filter(running | stopping | deleting).order_by("pk").values_list("pk", flat=True))
