"""State changes of tunes: each runs atomically, writes its event and audit row, and queues work after commit."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.db import transaction

from accounts.models import Team
from audit.log import record as audit
from deployments import actions as deployment_actions
from deployments import canary, planning
from deployments.events import record
from deployments.models import Deployment, Event, Revision
from deployments.spec import DynamicBatching, InstanceGroup
from infra.api_errors import Conflict
from models_registry.models import ModelVersion
from tuning import search
from tuning.changes import Change, narrowing, spec_changes
from tuning.models import TuneRun


@dataclass(frozen=True)
class TuneRequest:
    model_version: ModelVersion
    p99_target_ms: float
    budget_seconds: int
    concurrency_min: int
    concurrency_max: int
    sample: str
    request_body: dict[str, Any]


@transaction.atomic
def create_tune(deployment: Deployment, user: Any, request: TuneRequest) -> TuneRun:
    # The team's row serializes its tune requests: two at once cannot both pass the checks below. (NO KEY: rows
    # that merely reference the team, an event or an audit entry written meanwhile, are not held up by it.)
    Team.objects.select_for_update(no_key=True).filter(pk=deployment.team_id).first()
    if TuneRun.objects.filter(deployment=deployment, status__in=TuneRun.ACTIVE).exists():
        raise Conflict("A tune of this deployment is queued or running already: wait for it, or cancel it.")
    limit = settings.TUNE_MAX_ACTIVE_PER_TEAM
    if TuneRun.objects.filter(team_id=deployment.team_id, status__in=TuneRun.ACTIVE).count() >= limit:
        raise Conflict(f"Your team has {limit} tunes queued or running (the most it may have at once, "
                       "TUNE_MAX_ACTIVE_PER_TEAM): wait for one to end, or cancel one.")
    tune = TuneRun.objects.create(
        deployment=deployment, team=deployment.team, model_version=request.model_version, created_by=user,
        p99_target_ms=request.p99_target_ms, budget_seconds=request.budget_seconds,
        concurrency_min=request.concurrency_min, concurrency_max=request.concurrency_max, sample=request.sample,
        request_body=request.request_body, message="Queued.",
    )
    record(deployment, Event.Kind.INFO, f"Tune {tune.pk} queued by {user.get_username()}: p99 ≤ "
                                        f"{request.p99_target_ms:g} ms, budget {request.budget_seconds} s.")
    audit(user, deployment.team, "deployment.tune", deployment.name, tune=tune.pk)
    tune_id = tune.pk

    def queue() -> None:
        from tuning import tasks

        tasks.run_tune.delay(tune_id)

    transaction.on_commit(queue)
    return tune


@transaction.atomic
def cancel_tune(tune: TuneRun, user: Any) -> None:
    if not tune.active:
        raise Conflict(f"The tune is {tune.status} already.")
    # A queued tune ends now; a running one stops at its next measurement (the worker sees the flag).
    TuneRun.objects.filter(pk=tune.pk).update(cancel_requested=True)
    TuneRun.objects.filter(pk=tune.pk, status=TuneRun.Status.QUEUED).update(status=TuneRun.Status.CANCELLED,
                                                                           message="Cancelled.")
    record(tune.deployment, Event.Kind.INFO, f"Tune {tune.pk} cancelled by {user.get_username()}.")
    audit(user, tune.team, "deployment.tune.cancel", tune.deployment.name, tune=tune.pk)


def tuned_request(spec_request: planning.DeployRequest, model: str, settings: search.Config) -> planning.DeployRequest:
    """The deployment's request with the tuned settings for `model`."""
    models = []
    for item in spec_request.models:
        if item.name == model:
            # The tuned settings are chosen, no longer the model's defaults; the rest stays as the request has it.
            item = replace(
                item, max_batch_size=settings.max_batch_size if settings.batching else item.max_batch_size,
                # The batching options a tune does not vary (preferred sizes, ordering) stay as they are: an Apply
                # of the setting that serves (a tune that kept it) must change nothing.
                dynamic_batching=replace(item.dynamic_batching if isinstance(item.dynamic_batching, DynamicBatching)
                                         else DynamicBatching(), max_queue_delay_microseconds=settings.queue_delay_us)
                if settings.batching else None,
                instance_group=InstanceGroup(count=settings.instances, kind=item.instance_group.kind,
                                             gpus=item.instance_group.gpus),
                defaults=item.defaults - ({"max_batch_size", "dynamic_batching"} if settings.batching
                                          else {"dynamic_batching"}))
        models.append(item)
    # Everything else (placement included: a shared deployment stays in its pool) as the deployment has it.
    return replace(spec_request, models=tuple(models))


class NarrowingRefused(Conflict):
    """Applying would narrow what clients may send, and the user did not choose that: `changes` lists them all."""

    def __init__(self, changes: list[Change]) -> None:
        self.changes = changes
        narrows = "; ".join(c.text() for c in narrowing(changes))
        super().__init__(f"Applying this tune would narrow what clients may send: {narrows}. Apply again choosing "
                         "to narrow (the API's \"narrow\": true, the CLI's --narrow, the page's checkbox) if no "
                         "client needs that, or tune again with the settings you serve.")


@dataclass(frozen=True)
class Applied:
    revision: Revision | None  # None: the recommendation is what serves already, and nothing rolls out
    changes: list[Change]


def _tuned_plan(tune: TuneRun, deployment: Deployment, *, canary: bool = False) -> tuple[planning.Plan, list[Change]]:
    """The revision the tune's recommendation makes of the deployment's current one, and every change it makes.
    PlanError: the settings no longer fit; Conflict: nothing to apply."""
    settings = tune.recommended_settings()
    if tune.status != TuneRun.Status.DONE or settings is None:
        raise Conflict("The tune has no recommendation to apply: it is not done, or no setting met the target.")
    if deployment.revision is None:
        raise Conflict("The deployment has no revision to change.")
    spec = deployment.revision.spec
    entry = next((m for m in spec.models if m.version_id == tune.model_version_id), None)
    if entry is None:
        raise Conflict("The deployment no longer serves the model version that was tuned: tune it again.")
    request = tuned_request(planning.request_for(spec), entry.name, search.Config.from_json(settings))
    plan = planning.plan(deployment.team, request, deployment=deployment, canary=canary)
    return plan, spec_changes(spec, plan.spec)


def preview_tune(tune: TuneRun) -> list[Change]:
    """What applying the tune would change now, before and after, for the page to show before Apply."""
    return _tuned_plan(tune, Deployment.objects.get(pk=tune.deployment_id))[1]


@transaction.atomic
def apply_tune(tune: TuneRun, user: Any, rollout: canary.Rollout | None = None, *, narrow: bool = False) -> Applied:
    """A new revision of the deployment with the tune's recommendation, planned and rolled out as a PATCH is: at
    once, or as a canary beside the serving revision when `rollout` says so (the guardrails then judge the tuned
    settings on live traffic). A tune must not narrow what clients may send (a lower max_batch_size, other shapes)
    unless the user chooses it (`narrow`): NarrowingRefused otherwise, naming every change. PlanError: the settings
    no longer fit (the deployment changed meanwhile). A recommendation that is what serves already makes no
    revision (the tune counts as applied to the current one); as a canary it is refused (Invalid), as any canary
    of no change is."""
    deployment = Deployment.objects.select_for_update().get(pk=tune.deployment_id)
    plan, changes = _tuned_plan(tune, deployment, canary=rollout is not None)
    if narrowing(changes) and not narrow:
        raise NarrowingRefused(changes)
    revision = deployment_actions.update_deployment(deployment, user, plan, canary=rollout)
    assert deployment.revision is not None  # _tuned_plan refused a deployment without one
    number = revision.number if revision is not None else deployment.revision.number
    TuneRun.objects.filter(pk=tune.pk).update(applied_revision=number, applied_unchanged=revision is None)
    if changes and revision is not None:
        record(deployment, Event.Kind.INFO, f"Tune {tune.pk} applied as revision {number}: "
                                            + "; ".join(c.text() for c in changes) + ".")
    audit(user, tune.team, "deployment.tune.apply", deployment.name, tune=tune.pk, revision=number,
          unchanged=revision is None, changes=[c.to_json() for c in changes],
          **({"canary_percent": rollout.percent} if rollout else {}),
          **({"narrowed": True} if narrowing(changes) else {}))
    return Applied(revision, changes)
