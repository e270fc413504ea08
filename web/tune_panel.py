"""The deployment page's Tune panel and the deploy form's suggestion: what the templates show of tunes."""

from __future__ import annotations

from typing import Any

from django import forms

from deployments import planning
from deployments.models import Deployment
from deployments.runtimes import registry
from infra.api_errors import Conflict
from models_registry.models import ModelVersion
from tuning import actions
from tuning.api import MAX_BUDGET_SECONDS, MAX_CONCURRENCY, MAX_P99_MS, MIN_BUDGET_SECONDS, MIN_P99_MS
from tuning.changes import Change
from tuning.models import TuneRun
from web.tune_chart import frontier_svg

BUDGETS = [(60, "1 minute"), (300, "5 minutes"), (600, "10 minutes"), (1800, "30 minutes"), (3600, "1 hour")]


class TuneForm(forms.Form):
    p99_ms = forms.FloatField(label="p99 target (ms)", min_value=MIN_P99_MS, max_value=MAX_P99_MS, initial=50)
    budget_seconds = forms.TypedChoiceField(label="Time budget", choices=BUDGETS, coerce=int, initial=300)
    concurrency_max = forms.IntegerField(label="Up to clients", min_value=1, max_value=MAX_CONCURRENCY, initial=16)

    def clean_budget_seconds(self) -> int:
        value: int = self.cleaned_data["budget_seconds"]
        if not MIN_BUDGET_SECONDS <= value <= MAX_BUDGET_SECONDS:
            raise forms.ValidationError(f"choose a budget from {MIN_BUDGET_SECONDS} s to {MAX_BUDGET_SECONDS} s")
        return value


def tune_context(deployment: Deployment) -> dict[str, Any]:
    """The latest tune of the deployment (with its chart), whether a tune is possible, and the form."""
    tune = (TuneRun.objects.filter(deployment=deployment).select_related("model_version__model", "created_by")
            .first())
    chart = frontier_svg(tune.results, tune.frontier, tune.p99_target_ms, tune.recommendation) if tune else ""
    # The form starts from the values the last tune ran with, so that a second tune changes one thing, not three.
    form = TuneForm(initial={"p99_ms": tune.p99_target_ms, "budget_seconds": tune.budget_seconds,
                             "concurrency_max": tune.concurrency_max} if tune else None)
    changes, problem = _apply_preview(tune)
    return {"tune": tune, "tune_chart": chart, "tune_form": form, "tune_changes": changes,
            "tune_narrows": any(c.narrows for c in changes), "tune_apply_problem": problem,
            "can_tune": deployment.revision_id is not None and registry.can_tune(deployment)}


def _apply_preview(tune: TuneRun | None) -> tuple[list[Change], str]:
    """What Apply would change (shown before the button, so that nothing changes unsaid), or why it cannot."""
    if tune is None or tune.status != TuneRun.Status.DONE or not tune.recommendation or tune.applied_revision:
        return [], ""
    try:
        return actions.preview_tune(tune), ""
    except (Conflict, planning.PlanError) as exc:
        return [], str(exc)


def suggestion_for(version: ModelVersion) -> TuneRun | None:
    """The last finished tune of this model version with a recommendation (any deployment of the team)."""
    return (TuneRun.objects.filter(model_version=version, status=TuneRun.Status.DONE, recommendation__isnull=False)
            .order_by("-finished_at", "-id").first())


def initial_from(tune: TuneRun, initial: dict[str, Any]) -> dict[str, Any]:
    """The deploy form's initial values with the tune's recommended settings."""
    settings = tune.recommended_settings() or {}
    tuned = dict(initial, instance_count=settings.get("instances", initial.get("instance_count", 1)),
                 dynamic_batching=bool(settings.get("batching")))
    if settings.get("batching"):
        tuned.update(max_batch_size=settings["max_batch_size"],
                     max_queue_delay_microseconds=settings["queue_delay_us"], preferred_batch_size="")
    return tuned
