"""State changes of deployments: each runs atomically, writes its event, and queues the reconciler after commit."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from accounts.models import Team
from audit.log import record as audit
from deployments import ceilings
from deployments.events import record
from deployments.models import NO_CANARY, Deployment, Event, PoolLoad, Revision
from deployments.planning import Plan
from infra.api_errors import Conflict as Conflict  # re-exported: the callers of these actions catch it from here
from infra.api_errors import Invalid

if TYPE_CHECKING:
    from deployments.canary import Rollout



def _queue_reconcile(deployment: Deployment) -> None:
    from deployments import tasks

    deployment_id = deployment.pk
    transaction.on_commit(lambda: tasks.queue_reconcile(deployment_id))  # coalesced: one waits per deployment


def _new_revision(deployment: Deployment, user: Any, plan: Plan) -> Revision:
    number = (deployment.revisions.aggregate(n=Max("number"))["n"] or 0) + 1
    revision = Revision.objects.create(deployment=deployment, number=number, spec=plan.spec, created_by=user)
    revision.versions.set(plan.versions)
    return revision


@transaction.atomic
def create_deployment(team: Team, user: Any, name: str, plan: Plan) -> Deployment:
    """A deployment serving what `plan` (deployments.planning) says; its runtime is the plan's."""
    if Deployment.objects.filter(team=team, name=name).exists():
        raise Conflict(f"A deployment named {name!r} exists already in team {team.name!r}.")
    runtime = plan.spec.runtime
    deployment = Deployment.objects.create(team=team, name=name, runtime=runtime, created_by=user)
    revision = _new_revision(deployment, user, plan)
    deployment.revision = revision
    deployment.save(update_fields=["revision"])
    record(deployment, Event.Kind.INFO, f"Created by {user.get_username()} with revision 1.")
    audit(user, team, "deployment.create", name, runtime=runtime, revision=1)
    _queue_reconcile(deployment)
    return deployment


def _canary_in_progress(deployment: Deployment) -> str:
    canary = deployment.canary_revision
    number = canary.number if canary is not None else "?"
    return (f"A canary of revision {number} is in progress: promote it (POST .../promote) or roll it back "
            "(POST .../rollback) before changing the deployment again.")


def unchanged(deployment: Deployment, plan: Plan) -> bool:
    """Whether `plan` asks for exactly what the deployment's revision holds already. What a derived memory limit
    comes from is left out: a figure measured since (the server measures its models as it serves) is no change
    asked for, and a CI job deploying the same settings again must not restart the server for it."""
    current = deployment.revision
    if current is None:
        return False
    return bool(replace(current.spec, memory_basis=None).to_json()
                == replace(plan.spec, memory_basis=None).to_json())


@transaction.atomic
def update_deployment(deployment: Deployment, user: Any, plan: Plan, canary: Rollout | None = None) -> Revision | None:
    """A new revision; a running deployment rolls to it while the current one keeps serving. With `canary`, the
    new revision is launched beside the serving one and takes `canary.percent` of the requests once ready, until
    it is promoted or rolled back.

    A plan that changes nothing makes no revision and rolls nothing out (None), however it was asked for (the
    API's PATCH, the edit page, the CLI, a tune's Apply): a CI job that deploys the same settings again must not
    restart what serves. A canary of nothing is refused (Invalid): there would be nothing to compare. Nor does a
    plan that changes only a shared deployment's idle time (None too): it is set in place (timer_only)."""
    if plan.spec.runtime != deployment.runtime:
        raise Conflict("The runtime of a deployment cannot change: create a new deployment.")
    locked = (Deployment.objects.select_for_update(of=("self",)).select_related("revision", "canary_revision")
              .get(pk=deployment.pk))
    if unchanged(locked, plan):
        if canary is not None:
            raise Invalid("rollout", "a canary needs a change: these are the settings in effect already")
        return None
    if locked.canary_revision_id is not None:
        raise Conflict(_canary_in_progress(locked))
    if timer_only(locked, plan):
        if canary is not None:
            raise Invalid("rollout", "only the idle time changes, which is set in place with no new revision: "
                                     "there is nothing to compare in a canary, so send it without a rollout")
        _set_idle_unload(locked, user, plan.spec.placement.idle_unload_seconds)
        return None
    if canary is not None:
        return _start_canary(locked, user, plan, canary)
    return _roll_out(deployment, user, plan)


def timer_only(deployment: Deployment, plan: Plan) -> bool:
    """Whether `plan` differs from the deployment's revision only in its idle time (placement.idle_unload_seconds):
    how long a pool keeps the models loaded while unused, not what it serves. A revision is for what changes the
    model repository served (issue 31: a new idle time made one, and loaded the models again for nothing)."""
    current = deployment.revision
    if current is None or not (current.spec.placement.shared and plan.spec.placement.shared):
        return False
    wanted = plan.spec.placement.idle_unload_seconds
    same = replace(plan.spec, placement=replace(plan.spec.placement,
                                                idle_unload_seconds=current.spec.placement.idle_unload_seconds))
    return bool(wanted != current.spec.placement.idle_unload_seconds and same.to_json() == current.spec.to_json())


def _set_idle_unload(deployment: Deployment, user: Any, seconds: int) -> None:
    """The revision's idle time changed in place, and its loads' (the pools' idle passes read them next time):
    nothing reloads, no revision is made. The one field of a revision that changes after it was made: it is a
    setting of how the pool treats the models, not of what they are."""
    revision = deployment.revision
    assert revision is not None  # timer_only said so
    before = revision.spec.placement.idle_unload_seconds
    revision.spec = replace(revision.spec, placement=replace(revision.spec.placement, idle_unload_seconds=seconds))
    revision.save(update_fields=["spec"])
    PoolLoad.objects.filter(revision=revision).update(idle_unload_seconds=seconds)
    never = " (0: never unload)" if seconds == 0 else ""
    record(deployment, Event.Kind.INFO, f"Idle time set to {seconds} s{never} (it was {before} s) by "
                                        f"{user.get_username()}, on revision {revision.number} in place: nothing "
                                        "was loaded again.")
    audit(user, deployment.team, "deployment.update", deployment.name, revision=revision.number,
          idle_unload_seconds=seconds)


def _roll_out(deployment: Deployment, user: Any, plan: Plan) -> Revision:
    revision = _new_revision(deployment, user, plan)
    fields: dict[str, Any] = {"revision": revision}
    if deployment.desired_state == Deployment.Desired.RUNNING:
        deployment.set_status(Deployment.Status.PENDING, f"Rolling out revision {revision.number}.", **fields)
    else:
        deployment.revision = revision
        Deployment.objects.filter(pk=deployment.pk).update(**fields)
    record(deployment, Event.Kind.INFO, f"Revision {revision.number} created by {user.get_username()}.")
    audit(user, deployment.team, "deployment.update", deployment.name, revision=revision.number)
    _queue_reconcile(deployment)
    return revision


@transaction.atomic
def rerender_deployment(deployment: Deployment, user: Any) -> Revision:
    """An operator's re-render: a new revision with the same spec, rendered and rolled out afresh (after a fix to
    the renderer, say). The one change of nothing that makes a revision, and on purpose."""
    locked = (Deployment.objects.select_for_update(of=("self",)).select_related("revision", "canary_revision")
              .get(pk=deployment.pk))
    if locked.revision is None:
        raise Conflict("it has no revision")
    if locked.canary_revision_id is not None:
        raise Conflict(_canary_in_progress(locked))
    return _roll_out(deployment, user, Plan(spec=locked.revision.spec, versions=tuple(locked.revision.versions.all())))


def _start_canary(deployment: Deployment, user: Any, plan: Plan, canary: Rollout) -> Revision:
    if (deployment.desired_state != Deployment.Desired.RUNNING or deployment.status != Deployment.Status.READY
            or deployment.serving_revision_id is None):
        raise Conflict("A canary needs a deployment that is running and ready (a stable revision serving it); "
                       f"this one is {deployment.status}.")
    revision = _new_revision(deployment, user, plan)
    Deployment.objects.filter(pk=deployment.pk).update(**{**NO_CANARY, "canary_revision": revision,
                                                          **canary.fields()})
    record(deployment, Event.Kind.INFO, f"Revision {revision.number} created by {user.get_username()} as a canary "
                                        f"for {canary.percent}% of the requests.")
    audit(user, deployment.team, "deployment.canary", deployment.name, revision=revision.number,
          percent=canary.percent, max_error_rate=canary.max_error_rate, max_p99_ratio=canary.max_p99_ratio,
          window_seconds=canary.window_seconds, min_requests=canary.min_requests, auto_promote=canary.auto_promote)
    _queue_reconcile(deployment)
    return revision


def _actor(user: Any, reason: str) -> str:
    return f"by {user.get_username()}" if user is not None else f"automatically: {reason}"


@transaction.atomic
def promote_canary(deployment: Deployment, user: Any, reason: str = "", expect_revision: int | None = None) -> int:
    """The canary becomes the serving revision: one UPDATE of the route; the old revision's server drains and is
    stopped. `user` None: its guardrails promote it (`reason` says why). Returns the promoted revision's number."""
    locked = (Deployment.objects.select_for_update(of=("self",))
              .select_related("canary_revision", "serving_revision", "team")
              .get(pk=deployment.pk))
    canary = locked.canary_revision
    if canary is None or (expect_revision is not None and canary.number != expect_revision):
        raise Conflict("There is no canary to promote: start one with a PATCH that has "
                       "\"rollout\": {\"strategy\": \"canary\", \"percent\": N}.")
    if not locked.canary_upstream_url:
        raise Conflict(f"The canary of revision {canary.number} is not serving yet (it is starting): promote it "
                       "once it serves, or roll it back.")
    previous = locked.serving_revision
    drain = timezone.now() + timedelta(seconds=settings.ROLLOUT_DRAIN_SECONDS)
    drain_until = max(locked.drain_until, drain) if locked.drain_until else drain
    locked.set_status(Deployment.Status.READY, f"Serving revision {canary.number} (promoted from canary).",
                      revision=canary, serving_revision=canary, upstream_url=locked.canary_upstream_url,
                      grpc_upstream=locked.canary_grpc_upstream, serving_launch=locked.canary_launch,
                      launch=None, launch_deadline=None, drain_until=drain_until, **NO_CANARY)
    was = f"; revision {previous.number} drains and stops" if previous is not None else ""
    record(locked, Event.Kind.INFO, f"Canary revision {canary.number} promoted {_actor(user, reason)}: it serves "
                                    f"all requests{was}.")
    audit(user, locked.team, "deployment.promote", locked.name, revision=canary.number,
          **({"reason": reason} if user is None else {}))
    _queue_reconcile(locked)
    return canary.number


@transaction.atomic
def rollback_canary(deployment: Deployment, user: Any, reason: str = "", expect_revision: int | None = None) -> int:
    """End the canary: the route loses it at once (the stable revision takes every request) and its server stops
    after the drain. `user` None: its guardrails roll it back (`reason` quotes the figures)."""
    locked = (Deployment.objects.select_for_update(of=("self",))
              .select_related("canary_revision", "serving_revision", "team")
              .get(pk=deployment.pk))
    canary = locked.canary_revision
    if canary is None or (expect_revision is not None and canary.number != expect_revision):
        raise Conflict("There is no canary to roll back.")
    now = timezone.now()
    ends = now + timedelta(seconds=settings.ROLLOUT_DRAIN_SECONDS) if locked.canary_upstream_url else now
    drain_until = max(locked.drain_until, ends) if locked.drain_until else ends
    Deployment.objects.filter(pk=locked.pk).update(drain_until=drain_until, **NO_CANARY)
    stable = locked.serving_revision
    serving = f"; revision {stable.number} serves all requests" if stable is not None else ""
    kind = Event.Kind.INFO if user is not None else Event.Kind.WARNING
    record(locked, kind, f"Canary revision {canary.number} rolled back {_actor(user, reason)}{serving}.")
    audit(user, locked.team, "deployment.rollback", locked.name, revision=canary.number,
          **({"reason": reason} if user is None else {}))
    _queue_reconcile(locked)
    return canary.number


@transaction.atomic
def stop_deployment(deployment: Deployment, user: Any) -> None:
    if deployment.desired_state == Deployment.Desired.STOPPED:
        raise Conflict("The deployment is stopped already.")
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=Deployment.Desired.STOPPED)
    deployment.desired_state = Deployment.Desired.STOPPED
    deployment.set_status(Deployment.Status.STOPPING, "Stopping Triton.", **NO_CANARY)
    record(deployment, Event.Kind.INFO, f"Stop requested by {user.get_username()}.")
    audit(user, deployment.team, "deployment.stop", deployment.name)
    _queue_reconcile(deployment)


@transaction.atomic
def start_deployment(deployment: Deployment, user: Any) -> None:
    """Start a stopped deployment, or retry a failed one."""
    if deployment.desired_state == Deployment.Desired.RUNNING and deployment.status != Deployment.Status.FAILED:
        raise Conflict("The deployment is running already.")
    if deployment.desired_state != Deployment.Desired.RUNNING and deployment.revision is not None:
        # A stopped deployment holds nothing: starting it must fit the team's ceilings as a new one would.
        refused = ceilings.check(deployment.team, deployment.revision.spec, deployment=deployment, starting=True)
        if refused:
            raise Conflict(" ".join(f"{key}: {message}" for key, messages in sorted(refused.items())
                                    for message in messages))
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=Deployment.Desired.RUNNING)
    deployment.desired_state = Deployment.Desired.RUNNING
    deployment.set_status(Deployment.Status.PENDING, "Starting.")
    record(deployment, Event.Kind.INFO, f"Start requested by {user.get_username()}.")
    audit(user, deployment.team, "deployment.start", deployment.name)
    _queue_reconcile(deployment)


@transaction.atomic
def set_egress(deployment: Deployment, user: Any, allowed: bool) -> None:
    """An operator lets the deployment's models open outgoing connections, or stops them; a running local
    deployment restarts its Triton with the new setting (the current one keeps serving until then)."""
    Deployment.objects.filter(pk=deployment.pk).update(allow_egress=allowed)
    deployment.allow_egress = allowed
    if allowed:
        record(deployment, Event.Kind.WARNING, f"Outgoing connections allowed by operator {user.get_username()}: "
                                               "its models may now connect to other machines.")
    else:
        record(deployment, Event.Kind.INFO, f"Outgoing connections blocked again by operator {user.get_username()}.")
    audit(user, deployment.team, "deployment.egress", deployment.name, allow_egress=allowed)
    if (deployment.runtime == Deployment.Runtime.LOCAL and deployment.desired_state == Deployment.Desired.RUNNING
            and deployment.status != Deployment.Status.FAILED):
        deployment.set_status(Deployment.Status.PENDING, "Restarting Triton with the new egress setting.")
        _queue_reconcile(deployment)


@transaction.atomic
def delete_deployment(deployment: Deployment, user: Any) -> None:
    """Tear everything down: the gateway stops routing at once, and the reconciler stops its servers and removes
    its files (or cluster objects), then the row, in a worker (a stop can take seconds, a cluster longer)."""
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=Deployment.Desired.DELETED)
    deployment.desired_state = Deployment.Desired.DELETED
    deployment.set_status(Deployment.Status.STOPPING, f"Deleting (requested by {user.get_username()}).",
                          upstream_url="", grpc_upstream="", serving_revision=None, **NO_CANARY)
    audit(user, deployment.team, "deployment.delete", deployment.name)
    _queue_reconcile(deployment)
