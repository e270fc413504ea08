"""The Tune panel's actions on the deployment page: start a tune, cancel it, apply its recommendation."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from accounts.models import Team
from deployments import canary, planning
from deployments.runtimes import registry
from infra.api_errors import Conflict, Invalid
from models_registry.models import ModelVersion
from tuning import actions
from tuning.api import generated_problem
from tuning.models import TuneRun
from web import inference
from web.tune_panel import TuneForm
from web.views import _get_deployment, team_required


@require_POST
@team_required
def deployment_tune(request: HttpRequest, team: Team, name: str) -> HttpResponse:
    deployment = _get_deployment(team, name)
    form = TuneForm(request.POST)
    spec = deployment.revision.spec if deployment.revision else None
    entry = next((m for m in (spec.models if spec else ()) if not m.is_pipeline and m.version_id), None)
    if not form.is_valid():
        messages.error(request, "Not tuned: " + "; ".join(f"{form.fields[k].label}: {' '.join(str(m) for m in v)}"
                                                          for k, v in form.errors.items()))
    elif not registry.can_tune(deployment) or entry is None:
        messages.error(request, "Not tuned: only a local deployment serving a model (not only a pipeline) can be "
                                "tuned on this machine.")
    elif problem := generated_problem(body := inference.example_request(inference.served_signature(entry))):
        messages.error(request, f"Not tuned: {problem} (the API's POST .../tune takes one).")
    else:
        data = form.cleaned_data
        try:
            actions.create_tune(deployment, request.user, actions.TuneRequest(
                model_version=ModelVersion.objects.get(pk=entry.version_id), p99_target_ms=data["p99_ms"],
                budget_seconds=data["budget_seconds"], concurrency_min=1, concurrency_max=data["concurrency_max"],
                sample="generated", request_body=body))
        except Conflict as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, f"Tune of {entry.name} queued: its progress shows below.")
    return redirect("deployment-detail", name=deployment.name)


def _tune(team: Team, name: str, tune_id: int) -> TuneRun:
    tune = TuneRun.objects.filter(deployment=_get_deployment(team, name), pk=tune_id).first()
    if tune is None:
        raise Http404
    return tune


@require_POST
@team_required
def deployment_tune_apply(request: HttpRequest, team: Team, name: str, tune_id: int) -> HttpResponse:
    tune = _tune(team, name, tune_id)
    percent_text = request.POST.get("canary_percent", "").strip()
    rollout = None
    if percent_text:
        # Length first: int() of a few thousand digits raises ValueError (a 500), not a refusal.
        if (not percent_text.isascii() or not percent_text.isdigit() or len(percent_text) > 2
                or not 1 <= int(percent_text) <= 99):
            messages.error(request, f"A canary takes 1 to 99 percent of the requests, not {percent_text[:20]!r}; "
                                    "leave it empty to apply to all of them at once.")
            return redirect("deployment-detail", name=name)
        rollout = canary.Rollout(percent=int(percent_text))
    try:
        applied = actions.apply_tune(tune, request.user, rollout, narrow=request.POST.get("narrow") == "on")
    except Conflict as exc:  # NarrowingRefused included: its message lists what would narrow
        messages.error(request, str(exc))
    except planning.PlanError as exc:
        messages.error(request, f"The recommended settings no longer fit: {exc}")
    except Invalid as exc:
        messages.error(request, f"{exc.message[:1].upper()}{exc.message[1:]}: apply it to every request instead.")
    else:
        if applied.revision is None:
            messages.info(request, "The tuned settings are the ones serving already: nothing to roll out.")
            return redirect("deployment-detail", name=name)
        how = f"as a canary for {rollout.percent}% of the requests" if rollout else "to every request once ready"
        changed = "; ".join(c.text() for c in applied.changes) or "no setting differs from the serving revision"
        messages.success(request, f"Revision {applied.revision.number} rolls out the tuned settings {how}. "
                                  f"Changed: {changed}.")
    return redirect("deployment-detail", name=name)


@require_POST
@team_required
def deployment_tune_cancel(request: HttpRequest, team: Team, name: str, tune_id: int) -> HttpResponse:
    tune = _tune(team, name, tune_id)
    try:
        actions.cancel_tune(tune, request.user)
    except Conflict as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Tune cancelled.")
    return redirect("deployment-detail", name=name)
