"""The reconciler: moves a deployment toward what the user asked for (serving its current revision, stopped, or
deleted) through its runtime, one step per tick.

A tick reads the desired state (the Deployment row) and what was recorded of the observed state (the launch serving,
the launch starting and its deadline, a drain's end), asks the runtime one question or has it take one step
(render, launch, look at a starting launch, switch the route, retire what drained, stop, delete), records the
outcome and returns how soon it wants the next tick. Nothing waits inside a worker: a launch that takes minutes to
load is looked at every `runtime.poll_seconds` by a new tick, a drain is a recorded deadline. The tasks
(deployments/tasks.py) queue the next tick; beat ticks every deployment not at rest, which also health-checks the
serving ones and picks up whatever a crashed tick left (a crashed tick is simply the next tick).

Every step is idempotent and every write is conditional on what the tick read (Deployment.advance): a user who
changes the deployment meanwhile wins, and the next tick acts on that. A lease (a conditional update) keeps two
workers from ticking one deployment at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from deployments.events import record
from deployments.models import NO_CANARY, Deployment, Event, Revision, bounded_message
from deployments.render import RenderError
from deployments.runtimes.base import Launch, Preparation, PreparationFailed, Runtime, RuntimeUnavailable
from deployments.runtimes.registry import runtime_for

log = logging.getLogger(__name__)

# A tick takes seconds; a worker killed mid-tick holds the deployment this long at most.
LEASE_SECONDS = 30.0
# Another worker ticks this deployment right now: look again this soon (it may have read the state before a change).
BUSY_RETRY_SECONDS = 1.0
NOW = 0.0  # the next step can be taken at once

S = Deployment.Status

# Queues the build of a revision's environment on a worker; False when it could not (the broker is down). The
# tasks (deployments.tasks.queue_build) hand theirs to each tick: they sit above the reconciler, which never imports
# them.
QueueBuild = Callable[[int], bool]


def _no_task_queue(revision_id: int) -> bool:
    return False


def reconcile(deployment_id: int, queue_build: QueueBuild = _no_task_queue) -> float | None:
    """One tick. Returns in how many seconds the deployment wants the next one (None: only when something changes,
    or at the next periodic tick). Without `queue_build` (a test's tick) an environment to build waits as for a
    broker that is down."""
    deployment = (Deployment.objects.select_related("team", "revision", "serving_revision", "canary_revision")
                  .filter(pk=deployment_id).first())
    if deployment is None:
        return None
    if not deployment.claim(LEASE_SECONDS):
        log.info("%s is being reconciled by another worker", deployment)
        return BUSY_RETRY_SECONDS
    runtime = runtime_for(deployment)
    try:
        if deployment.desired_state == Deployment.Desired.DELETED:
            return _delete(deployment, runtime)
        if deployment.desired_state == Deployment.Desired.STOPPED:
            return _stop(deployment, runtime)
        return _run(deployment, runtime, queue_build)
    except RuntimeUnavailable as exc:
        _unavailable(deployment, str(exc))
        return None
    finally:
        Deployment.objects.filter(pk=deployment_id).update(lease_until=None)


# --- Running ------------------------------------------------------------------------------------------------------


def _run(deployment: Deployment, runtime: Runtime, queue_build: QueueBuild) -> float | None:
    wait = _run_stable(deployment, runtime, queue_build)
    if deployment.canary_revision is None or deployment.status == S.FAILED or wait == NOW:
        return wait
    canary_wait = _canary(deployment, runtime, queue_build)
    return canary_wait if wait is None else wait if canary_wait is None else min(wait, canary_wait)


def _run_stable(deployment: Deployment, runtime: Runtime, queue_build: QueueBuild) -> float | None:
    target = deployment.revision
    if target is None:
        return None
    if _drained(deployment):
        _retire(deployment, runtime)
        return NOW
    if deployment.status == S.FAILED:
        return _drain_left(deployment)  # a failed deployment waits for the user: a new revision, start or retry
    if deployment.status in (S.PENDING, S.RENDERING, S.BUILDING):
        return _prepare(deployment, runtime, target, queue_build)
    if deployment.status == S.STARTING:
        return _start(deployment, runtime, target)
    if deployment.status == S.READY and deployment.serving_revision_id == target.pk:
        return _check(deployment, runtime, target)
    # Ready, but on another revision than asked for (or stopping, from an interrupted stop): roll out again.
    deployment.advance(S.PENDING, f"Rolling out revision {target.number}.")
    return NOW


def _ask_prepare(runtime: Runtime, revision: Revision, queue_build: QueueBuild) -> Preparation:
    """The runtime's preparation of the revision; an environment it asks to have built is queued here."""
    preparation = runtime.prepare(revision)
    if not preparation.build:
        return preparation
    if queue_build(revision.pk):
        return replace(preparation, build=False, retry_seconds=NOW)  # look at once: an eager build is done already
    return Preparation(False, f"Waiting for the task queue to build the python environment of revision "
                              f"{revision.number} (the broker is unreachable).", retry_seconds=5.0, building=True)


def _prepare(deployment: Deployment, runtime: Runtime, target: Revision, queue_build: QueueBuild) -> float | None:
    if deployment.status == S.PENDING:
        # A new revision (or a start, or a retry): what was starting for another one will not serve.
        stale = deployment.launch
        if stale is not None:
            runtime.abandon(stale)
        if not deployment.advance(S.RENDERING, f"Rendering the model repository of revision {target.number}.",
                                  launch=None, launch_deadline=None):
            return NOW
    try:
        preparation = _ask_prepare(runtime, target, queue_build)
    except RenderError as exc:
        _fail(deployment, f"Revision {target.number} cannot be rendered: {exc}")
        return _drain_left(deployment)
    except PreparationFailed as exc:
        _fail(deployment, f"Revision {target.number} cannot be prepared: {exc}", exc.detail)
        return _drain_left(deployment)
    if not preparation.done:
        status = S.BUILDING if preparation.building else S.RENDERING
        if preparation.message and (bounded_message(preparation.message), status) != (deployment.status_message,
                                                                                     deployment.status):
            with transaction.atomic():
                if deployment.advance(status, preparation.message) and status == S.BUILDING:
                    record(deployment, Event.Kind.INFO, preparation.message)
        return preparation.retry_seconds
    if deployment.advance(S.STARTING, f"Starting Triton for revision {target.number}."):
        record(deployment, Event.Kind.INFO, f"Rendered the model repository of revision {target.number}.")
    return NOW


def _start(deployment: Deployment, runtime: Runtime, target: Revision) -> float | None:
    launch = deployment.launch
    if launch is None or launch.revision_id != target.pk:
        if launch is not None:
            runtime.abandon(launch)
        launch = runtime.launch(target)
        deadline = timezone.now() + timedelta(seconds=runtime.ready_timeout_seconds)
        if not deployment.advance(S.STARTING, deployment.status_message, launch=launch,
                                  launch_deadline=deadline):
            runtime.abandon(launch)  # the user changed the deployment meanwhile: nobody would know of this server
            return NOW
        record(deployment, Event.Kind.INFO, f"Triton for revision {target.number} is starting ({launch.description}).")
        return runtime.poll_seconds
    seen = runtime.observe(launch)
    if seen.state == "ready":
        _switch(deployment, target, launch)
        return _drain_left(deployment)
    timed_out = deployment.launch_deadline is not None and timezone.now() >= deployment.launch_deadline
    if seen.state == "failed" or timed_out:
        runtime.abandon(launch)
        message = seen.message if seen.state == "failed" else \
            f"not ready after {runtime.ready_timeout_seconds:g} s: {seen.message}"
        _fail(deployment, f"Revision {target.number} failed to start: {message}", seen.detail)
        return _drain_left(deployment)
    return runtime.poll_seconds


def _switch(deployment: Deployment, target: Revision, launch: Launch) -> None:
    """The switch the gateway sees: one UPDATE of the upstream and the serving revision. A new server that took over
    (a new revision, or the same one restarted with other sandbox settings) leaves the old one answering what was
    routed to it (in flight, or from a gateway's route cache) until the drain ends. In a shared pool the new
    revision is in the same Triton (the same URL) under other names: the old one drains too, else a gateway whose
    route cache still names it would send a request to a model just unloaded."""
    previous_url = deployment.upstream_url
    drain_until = deployment.drain_until
    other_revision = deployment.serving_revision_id is not None and deployment.serving_revision_id != target.pk
    if previous_url and (previous_url != launch.url or other_revision):
        ends = timezone.now() + timedelta(seconds=settings.ROLLOUT_DRAIN_SECONDS)
        drain_until = max(drain_until, ends) if drain_until else ends
    elif drain_until is None:
        drain_until = timezone.now()  # nothing routed elsewhere: retire the rest at the next tick
    with transaction.atomic():
        if deployment.advance(S.READY, f"Serving revision {target.number}.", serving_revision=target,
                              upstream_url=launch.url, grpc_upstream=launch.grpc_target,
                              serving_launch=launch, launch=None,
                              launch_deadline=None, drain_until=drain_until):
            record(deployment, Event.Kind.INFO,
                   f"Revision {target.number} is ready and serving ({launch.description}).")


CANNOT_TELL_PREFIX = "Serving; the runtime cannot tell whether it still serves revision"


def _check(deployment: Deployment, runtime: Runtime, target: Revision) -> float | None:
    """A ready deployment: is what serves it still serving? If not, start it again (the gateway answers 503 until
    then rather than sending requests to a dead server)."""
    serving = deployment.serving_launch
    if serving is None:
        # Made ready before launches were recorded: adopt what serves it (launch() adopts a live server).
        serving = runtime.launch(target)
        if serving.url == deployment.upstream_url:
            deployment.advance(S.READY, deployment.status_message, serving_launch=serving,
                               grpc_upstream=serving.grpc_target)
        else:  # not the server the gateway routes to, which is gone: this one takes over once ready
            deployment.advance(S.STARTING, f"Restarting revision {target.number}.", launch=serving,
                               launch_deadline=timezone.now() + timedelta(seconds=runtime.ready_timeout_seconds))
        return NOW
    health = runtime.check(deployment, serving)
    if health.unknown:
        # Keep the route (what serves most likely still does) and say why nobody can tell, once.
        message = f"{CANNOT_TELL_PREFIX} {target.number}: {health.message}"
        if deployment.status_message != bounded_message(message) and deployment.advance(S.READY, message):
            record(deployment, Event.Kind.WARNING, f"Cannot tell whether revision {target.number} still serves: "
                                                   f"{health.message}")
        return _drain_left(deployment)
    if health.ok:
        if deployment.status_message.startswith(CANNOT_TELL_PREFIX):
            deployment.advance(S.READY, f"Serving revision {target.number}.")
        return _drain_left(deployment)
    if deployment.advance(S.STARTING, f"Restarting: {health.message}.", upstream_url="", grpc_upstream="",
                          serving_launch=None):
        record(deployment, Event.Kind.INFO if health.expected else Event.Kind.ERROR,
               f"Revision {target.number} stopped serving: {health.message}; "
               + ("starting it again." if health.expected else "restarting it.")
               + (f" Last log lines:\n{health.detail}" if health.detail else ""))
    return NOW


# --- A canary beside the serving revision (deployments/canary.py) -------------------------------------------------


def _canary_advance(deployment: Deployment, **fields: Any) -> bool:
    """Record a step of the canary, only if it is still the canary the tick read (a promote or a rollback made
    meanwhile wins)."""
    done = Deployment.objects.filter(pk=deployment.pk, canary_revision_id=deployment.canary_revision_id,
                                     desired_state=Deployment.Desired.RUNNING).update(**fields)
    if done:
        for key, value in fields.items():
            setattr(deployment, key, value)
    return done == 1


def _canary_ended(deployment: Deployment, canary: Revision, message: str, detail: str = "") -> None:
    stable = deployment.serving_revision
    serving = f" Revision {stable.number} keeps serving all requests." if stable is not None else ""
    if _canary_advance(deployment, **NO_CANARY):
        record(deployment, Event.Kind.ERROR, f"Canary revision {canary.number} {message}.{serving}"
               + (f"\n{detail}" if detail else ""))


def _canary(deployment: Deployment, runtime: Runtime, queue_build: QueueBuild) -> float | None:
    """One step of the canary: prepare and launch it, look at it until ready, then give it its route (the gateway
    sends it `canary_percent` of the requests); health-check it while it serves. A canary that fails to start is
    ended, the stable revision untouched."""
    canary = deployment.canary_revision
    assert canary is not None
    launch = deployment.canary_launch
    if launch is None:
        try:
            preparation = _ask_prepare(runtime, canary, queue_build)
            if not preparation.done:
                return preparation.retry_seconds
            launch = runtime.launch(canary)
        except RenderError as exc:
            _canary_ended(deployment, canary, f"cannot be rendered: {exc}")
            return None
        except PreparationFailed as exc:  # its python packages could not be installed: pip's lines beside it
            _canary_ended(deployment, canary, f"cannot be prepared: {exc}", exc.detail)
            return None
        except RuntimeUnavailable as exc:  # the canary's trouble: the serving revision is left as it is
            _canary_ended(deployment, canary, f"cannot be launched: {exc}")
            return None
        deadline = timezone.now() + timedelta(seconds=runtime.ready_timeout_seconds)
        if not _canary_advance(deployment, canary_launch=launch, canary_deadline=deadline):
            runtime.abandon(launch)  # rolled back or promoted meanwhile: nobody would know of this server
            return NOW
        record(deployment, Event.Kind.INFO, f"Triton for canary revision {canary.number} is starting "
                                            f"({launch.description}).")
        return runtime.poll_seconds
    if not deployment.canary_upstream_url:
        seen = runtime.observe(launch)
        if seen.state == "ready":
            if _canary_advance(deployment, canary_upstream_url=launch.url, canary_grpc_upstream=launch.grpc_target,
                               canary_serving_since=timezone.now(), canary_deadline=None):
                record(deployment, Event.Kind.INFO, f"Canary revision {canary.number} is ready and serving "
                                                    f"{deployment.canary_percent}% of the requests "
                                                    f"({launch.description}).")
            return None
        timed_out = deployment.canary_deadline is not None and timezone.now() >= deployment.canary_deadline
        if seen.state == "failed" or timed_out:
            runtime.abandon(launch)
            message = seen.message if seen.state == "failed" else \
                f"not ready after {runtime.ready_timeout_seconds:g} s: {seen.message}"
            _canary_ended(deployment, canary, f"failed to start: {message}", seen.detail)
            return None
        return runtime.poll_seconds
    health = runtime.check(deployment, launch)
    if health.ok:
        return None
    # Its share goes back to the stable revision until it is launched again.
    if _canary_advance(deployment, canary_upstream_url="", canary_grpc_upstream="", canary_launch=None,
                       canary_deadline=None, canary_serving_since=None):
        record(deployment, Event.Kind.ERROR, f"Canary revision {canary.number} stopped serving: {health.message}; "
               "restarting it." + (f" Last log lines:\n{health.detail}" if health.detail else ""))
    return NOW


def _drained(deployment: Deployment) -> bool:
    return deployment.drain_until is not None and deployment.drain_until <= timezone.now()


def _drain_left(deployment: Deployment) -> float | None:
    """Seconds until the drain ends (when the next tick retires what drained), None without a drain."""
    if deployment.drain_until is None:
        return None
    return max(0.0, (deployment.drain_until - timezone.now()).total_seconds())


def _retire(deployment: Deployment, runtime: Runtime) -> None:
    """The drain is over: stop what serves neither the route nor the rollout."""
    keep = [launch for launch in (deployment.serving_launch, deployment.launch,
                                  deployment.canary_launch)
            if launch is not None]
    messages = runtime.retire(deployment, keep)
    if deployment.advance(deployment.status, deployment.status_message, drain_until=None):
        for message in messages:
            record(deployment, Event.Kind.INFO, message)


def _fail(deployment: Deployment, message: str, detail: str = "") -> None:
    serving = deployment.serving_revision
    if serving is not None and deployment.upstream_url:
        message += f" Revision {serving.number} keeps serving."
    full = message + (f"\n{detail}" if detail else "")
    if deployment.advance(S.FAILED, full, launch=None, launch_deadline=None):
        record(deployment, Event.Kind.ERROR, full)


def _unavailable(deployment: Deployment, message: str) -> None:
    if deployment.desired_state == Deployment.Desired.RUNNING:
        _fail(deployment, message)
        return
    # Stopping or deleting: the periodic tick tries again until the runtime answers.
    waiting = f"Waiting for the runtime: {message}"
    if deployment.status_message != bounded_message(waiting) and deployment.advance(S.STOPPING, waiting):
        record(deployment, Event.Kind.WARNING, waiting)


# --- Stopping and deleting ----------------------------------------------------------------------------------------

_NOTHING_RUNS: dict[str, Any] = {"upstream_url": "", "grpc_upstream": "", "serving_revision": None,
                                 "serving_launch": None, "launch": None, "launch_deadline": None, "drain_until": None,
                                 **NO_CANARY}


def _stop(deployment: Deployment, runtime: Runtime) -> float | None:
    if deployment.status == S.STOPPED:
        return None
    # (A message saying what the stop waits for stays, so that a retry every tick does not repeat its event.)
    message = deployment.status_message if deployment.status == S.STOPPING else "Stopping Triton."
    if not deployment.advance(S.STOPPING, message, **_NOTHING_RUNS):
        return NOW
    runtime.stop(deployment)
    if deployment.advance(S.STOPPED, "Stopped."):
        record(deployment, Event.Kind.INFO, "Stopped.")
    return None


def _delete(deployment: Deployment, runtime: Runtime) -> float | None:
    runtime.teardown(deployment)
    Deployment.objects.filter(pk=deployment.pk, desired_state=Deployment.Desired.DELETED).delete()
    return None


def needs_attention() -> list[int]:
    """Deployments a periodic tick should look at: anything not at rest where the user wants it, and drains that
    end (also of a failed rollout's leftovers)."""
    running = Q(desired_state=Deployment.Desired.RUNNING) & ~Q(status=S.FAILED)
    stopping = Q(desired_state=Deployment.Desired.STOPPED) & ~Q(status=S.STOPPED)
    deleting = Q(desired_state=Deployment.Desired.DELETED)
    draining = Q(drain_until__isnull=False)
    return list(Deployment.objects.filter(running | stopping | deleting | draining).order_by("pk")
                .values_list("pk", flat=True))
