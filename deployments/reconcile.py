"""The reconciler: moves a deployment's servers toward what the user asked for (running the current revision,
stopped, or deleted). Every step is idempotent, so running it twice, or again after a worker was killed half-way,
is safe; a lease (a conditional update) keeps two workers from acting on one deployment at the same time."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import transaction

from deployments.events import record
from deployments.models import Deployment, Event, TritonServer
from deployments.render import RenderError
from deployments.runtimes import local as runtime

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
    try:
        if deployment.desired_state == Deployment.Desired.DELETED:
            _delete(deployment)
        elif deployment.desired_state == Deployment.Desired.STOPPED:
            _stop(deployment)
        else:
            _run(deployment)
    finally:
        Deployment.objects.filter(pk=deployment_id).update(lease_until=None)


def _run(deployment: Deployment) -> None:
    target = deployment.revision
    if target is None:
        return
    if deployment.status == S.FAILED:
        return  # waits for the user: a new revision (PATCH) or start makes it pending again
    servers = runtime.running_servers(deployment)
    if deployment.status == S.READY and deployment.serving_revision_id == target.pk:
        current = [s for s in servers if s.revision_id == target.pk and s.state == TritonServer.State.READY]
        if current and runtime.health(current[0]).ok:
            _stop_others(deployment, keep=current[0])
            return
        dead = current[0] if current else TritonServer.objects.filter(revision=target).order_by("-started_at").first()
        report = runtime.death_report(dead) if dead else ""
        if dead:
            runtime.stop(dead)
        record(deployment, Event.Kind.ERROR,
               f"The Triton process of revision {target.number} died; restarting it."
               + (f" Its last log lines:\n{report}" if report else ""))
        deployment.set_status(S.STARTING, "Restarting Triton after it died.", upstream_url="")
    _roll_out(deployment)


def _roll_out(deployment: Deployment) -> None:
    target = deployment.revision
    assert target is not None
    if deployment.status in (S.PENDING, S.RENDERING):
        deployment.set_status(S.RENDERING, f"Rendering the model repository of revision {target.number}.")
        try:
            runtime.render(target)
        except RenderError as exc:
            _fail(deployment, f"Revision {target.number} cannot be rendered: {exc}")
            return
        record(deployment, Event.Kind.INFO, f"Rendered the model repository of revision {target.number}.")
    if deployment.status != S.STARTING:
        deployment.set_status(S.STARTING, f"Starting Triton for revision {target.number}.")
    server = runtime.launch(target)
    record(deployment, Event.Kind.INFO, f"Triton for revision {target.number} is starting (pid {server.pid}, port {server.http_port}).")

    def keep_waiting() -> bool:
        deployment.renew(LEASE_SECONDS)
        current = Deployment.objects.filter(pk=deployment.pk).values("desired_state", "revision_id").first()
        return bool(current) and current["desired_state"] == Deployment.Desired.RUNNING and current["revision_id"] == target.pk

    result = runtime.wait_ready(server, keep_waiting)
    if not result.ready:
        runtime.stop(server)
        if result.message == "cancelled":
            return  # the user changed the deployment meanwhile; the next reconcile acts on that
        detail = "\n".join(result.errors[-5:]) if result.errors else ""
        _fail(deployment, f"Revision {target.number} failed to start: {result.message}", detail)
        return
    TritonServer.objects.filter(pk=server.pk).update(state=TritonServer.State.READY)
    previous = deployment.serving_revision
    with transaction.atomic():
        # The switch the gateway sees: one UPDATE of the upstream and the serving revision.
        deployment.set_status(S.READY, f"Serving revision {target.number}.", serving_revision=target, upstream_url=server.url)
        record(deployment, Event.Kind.INFO, f"Revision {target.number} is ready and serving (Triton pid {server.pid}).")
    if previous is not None and previous.pk != target.pk:
        time.sleep(settings.ROLLOUT_DRAIN_SECONDS)  # in-flight and cached routes to the old server finish first
    _stop_others(deployment, keep=server)


def _stop_others(deployment: Deployment, keep: TritonServer) -> None:
    for server in runtime.running_servers(deployment):
        if server.pk != keep.pk:
            runtime.stop(server)
            record(deployment, Event.Kind.INFO, f"Stopped the Triton of revision {server.revision.number} (pid {server.pid}).")


def _fail(deployment: Deployment, message: str, detail: str = "") -> None:
    serving = deployment.serving_revision
    if serving is not None and deployment.upstream_url:
        message += f" Revision {serving.number} keeps serving."
    deployment.set_status(S.FAILED, message + (f"\n{detail}" if detail else ""))
    record(deployment, Event.Kind.ERROR, message + (f"\n{detail}" if detail else ""))


def _stop(deployment: Deployment) -> None:
    servers = runtime.running_servers(deployment)
    if deployment.status == S.STOPPED and not servers:
        return
    deployment.set_status(S.STOPPING, "Stopping Triton.", upstream_url="", serving_revision=None)
    for server in servers:
        runtime.stop(server)
    deployment.set_status(S.STOPPED, "Stopped.")
    record(deployment, Event.Kind.INFO, "Stopped.")


def _delete(deployment: Deployment) -> None:
    runtime.teardown(deployment)
    deployment.delete()


def needs_attention() -> list[int]:
    """Deployments a periodic reconcile should look at: anything not at rest where the user wants it."""
    running = Deployment.objects.filter(desired_state=Deployment.Desired.RUNNING).exclude(status=S.FAILED)
    stopping = Deployment.objects.filter(desired_state=Deployment.Desired.STOPPED).exclude(status=S.STOPPED)
    deleting = Deployment.objects.filter(desired_state=Deployment.Desired.DELETED)
    return sorted(set(running.values_list("pk", flat=True)) | set(stopping.values_list("pk", flat=True))
                  | set(deleting.values_list("pk", flat=True)))
