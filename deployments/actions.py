"""State changes of deployments: each runs atomically, writes its event, and queues the reconciler after commit."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Max

from accounts.models import Team
from audit.log import record as audit
from deployments.events import record
from deployments.models import Deployment, Event, Revision
from deployments.planning import Plan
from portal.api_errors import Conflict


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


@transaction.atomic
def update_deployment(deployment: Deployment, user: Any, plan: Plan) -> Revision:
    """A new revision; a running deployment rolls to it while the current one keeps serving."""
    if plan.spec.runtime != deployment.runtime:
        raise Conflict("The runtime of a deployment cannot change: create a new deployment.")
    Deployment.objects.select_for_update().filter(pk=deployment.pk).first()
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
def stop_deployment(deployment: Deployment, user: Any) -> None:
    if deployment.desired_state == Deployment.Desired.STOPPED:
        raise Conflict("The deployment is stopped already.")
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=Deployment.Desired.STOPPED)
    deployment.desired_state = Deployment.Desired.STOPPED
    deployment.set_status(Deployment.Status.STOPPING, "Stopping Triton.")
    record(deployment, Event.Kind.INFO, f"Stop requested by {user.get_username()}.")
    audit(user, deployment.team, "deployment.stop", deployment.name)
    _queue_reconcile(deployment)


@transaction.atomic
def start_deployment(deployment: Deployment, user: Any) -> None:
    """Start a stopped deployment, or retry a failed one."""
    if deployment.desired_state == Deployment.Desired.RUNNING and deployment.status != Deployment.Status.FAILED:
        raise Conflict("The deployment is running already.")
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
                          upstream_url="", grpc_upstream="", serving_revision=None)
    audit(user, deployment.team, "deployment.delete", deployment.name)
    _queue_reconcile(deployment)
