"""The portal's pages: short views that find what the user may see (404 for anything of another team), validate
with a form and the API's serializer, run one action, and redirect or render."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.db.models import Count, OuterRef, Subquery
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from accounts import actions as token_actions
from accounts.context import SESSION_TEAM_KEY, acting_user, current_team, is_team_admin
from accounts.models import ApiToken, Membership, Team, max_token_lifetime_days
from audit.log import record as audit
from deployments import actions as deployment_actions
from deployments import log_revision, planning
from deployments.local_env import local_framework_status
from deployments.models import Deployment, Event
from deployments.revision_spec import Resources, RevisionSpec
from deployments.runtimes.registry import runtime_for
from infra.api_errors import Invalid
from infra.names import NAME_RE, NAME_RULE
from modelport.core import datatypes, formats
from models_registry import actions as registry_actions
from models_registry import imports
from models_registry.models import FORMATS_NEEDING_SIGNATURE, Format, Model, ModelVersion, with_identical_to
from models_registry.pipelines import pipeline_graph
from models_registry.sources.base import SourceForbidden, SourceRefused
from models_registry.validation import ArtifactRejected
from web import deployment_page, new_token, perf_panel, pipeline_form, placement, samples
from web.forms import (
    DeploymentForm,
    ImportForm,
    ServedModelForm,
    TokenForm,
    UploadForm,
    add_plan_errors,
    deploy_request,
    initial_for_entry,
    initial_for_version,
    placement_initial,
)
from web.logs import fold_gpu_noise
from web.serving import serving
from web.tasks import deploy_sample
from web.traffic import WINDOW_MINUTES as TRAFFIC_WINDOW_MINUTES
from web.traffic import traffic_by_deployment
from web.tune_panel import initial_from, suggestion_for

LOG_LINES = 200

TeamView = Callable[..., HttpResponse]


def team_required(view: TeamView) -> Callable[..., HttpResponse]:
    """Signed in, and acting in one of the user's teams (passed to the view as `team`)."""

    @login_required
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        team = current_team(request)
        if team is None:
            return render(request, "web/no_team.html", status=403)
        return view(request, team, *args, **kwargs)

    return wrapper


def _get_model(team: Team, name: str) -> Model:
    model = Model.objects.filter(team=team, name=name).first()
    if model is None:
        raise Http404("No such model in your team.")
    return model


def _get_deployment(team: Team, name: str) -> Deployment:
    deployment = (Deployment.objects.select_related("revision", "serving_revision", "canary_revision")
                  .filter(team=team, name=name).exclude(desired_state=Deployment.Desired.DELETED).first())
    if deployment is None:
        raise Http404("No such deployment in your team.")
    return deployment


# --- Team ---------------------------------------------------------------------------------------------------


@login_required
@require_POST
def switch_team(request: HttpRequest) -> HttpResponse:
    assert request.user.is_authenticated
    team_id = _int(request.POST.get("team"))
    membership = (Membership.objects.select_related("team").filter(user=request.user, team_id=team_id).first()
                  if team_id is not None else None)
    if membership is None:
        raise Http404("You are not a member of this team.")
    request.session[SESSION_TEAM_KEY] = membership.team_id
    messages.success(request, f"Now working in team {membership.team.name}.")
    # Not back to the page we came from: it showed the other team's model or deployment, a 404 in this one.
    return redirect("dashboard")


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


# --- Dashboard ----------------------------------------------------------------------------------------------


def _dashboard_live(team: Team) -> dict[str, Any]:
    deployments = list(Deployment.objects.filter(team=team).exclude(desired_state=Deployment.Desired.DELETED)
                       .select_related("revision", "serving_revision"))
    traffic = traffic_by_deployment([d.pk for d in deployments])
    where = placement.placement_words(deployments)
    rows = [{"deployment": d, "models": deployment_page.spec_models(d), "traffic": traffic.get(d.pk),
             "placement": where.get(d.pk, "")} for d in deployments]
    events = (Event.objects.filter(deployment__team=team).exclude(deployment__desired_state=Deployment.Desired.DELETED)
              .select_related("deployment")[:10])
    return {"rows": rows, "events": events, "traffic_minutes": TRAFFIC_WINDOW_MINUTES}


@require_GET
@team_required
def dashboard(request: HttpRequest, team: Team) -> HttpResponse:
    context = _dashboard_live(team)
    context["has_models"] = bool(context["rows"]) or Model.objects.filter(team=team).exists()
    # Both samples stay one click away once the team has models: a deployed one's button opens it.
    context["deployed_samples"] = samples.deployed(team, [row["deployment"] for row in context["rows"]])
    if not context["has_models"]:
        context["local_formats_note"] = serving().note()
    return render(request, "web/dashboard.html", context)


@require_GET
@team_required
def dashboard_live(request: HttpRequest, team: Team) -> HttpResponse:
    return render(request, "web/_dashboard_live.html", _dashboard_live(team))


# --- Models -------------------------------------------------------------------------------------------------


@require_GET
@team_required
def models_list(request: HttpRequest, team: Team) -> HttpResponse:
    latest = ModelVersion.objects.filter(model=OuterRef("pk")).order_by("-number")
    models = (Model.objects.filter(team=team).select_related("created_by")
              .annotate(version_count=Count("versions"),
                        latest_number=Subquery(latest.values("number")[:1]),
                        latest_status=Subquery(latest.values("status")[:1]),
                        latest_format=Subquery(latest.values("format")[:1])))
    return render(request, "web/models_list.html", {"models": models})


def _versions_context(model: Model) -> dict[str, Any]:
    versions = list(with_identical_to(model.versions.select_related("created_by")).order_by("-number"))
    return {"model": model, "versions": versions,
            "validating": any(v.status in (ModelVersion.Status.VALIDATING, ModelVersion.Status.IMPORTING)
                              for v in versions)}


@require_GET
@team_required
def model_detail(request: HttpRequest, team: Team, name: str) -> HttpResponse:
    context = _versions_context(_get_model(team, name))
    # The newest pipeline version is drawn as a diagram of its steps and tensors.
    pipeline = next((v for v in context["versions"] if v.format == Format.ENSEMBLE and v.definition), None)
    context["pipeline"] = pipeline
    context["graph"] = pipeline_graph(pipeline.definition) if pipeline else None
    context["can_delete"] = is_team_admin(request)
    context["graph_down"] = pipeline_graph(pipeline.definition, "down") if pipeline else None
    return render(request, "web/model_detail.html", context)


@require_GET
@team_required
def model_versions(request: HttpRequest, team: Team, name: str) -> HttpResponse:
    return render(request, "web/_versions.html", _versions_context(_get_model(team, name)))


@require_POST
@team_required
def version_cancel(request: HttpRequest, team: Team, name: str, number: int) -> HttpResponse:
    """Cancel a version's import (issue 35): any member may, as through the API."""
    version = get_object_or_404(ModelVersion.objects.select_related("model"), model__team=team, model__name=name,
                                number=number)
    try:
        imports.cancel_import(version, request.user)
        messages.success(request, f"Cancelled the import of {name} version {number}.")
    except registry_actions.Conflict as exc:
        messages.error(request, str(exc))
    return redirect("model-detail", name=name)


@require_http_methods(["GET", "POST"])
@team_required
def model_delete(request: HttpRequest, team: Team, name: str) -> HttpResponse:
    """Team admins delete a model that no deployment serves (with its versions and their files)."""
    model = _get_model(team, name)
    admin = is_team_admin(request)
    in_use = registry_actions.model_in_use(model)
    if request.method == "POST" and admin and not in_use:
        try:
            with transaction.atomic():
                registry_actions.delete_model(model, request.user)
        except registry_actions.Conflict as exc:  # a version is a step of a pipeline, or a deployment came meanwhile
            messages.error(request, str(exc))
            return redirect("model-detail", name=model.name)
        messages.success(request, f"Deleted {name}.")
        return redirect("models")
    status = 403 if not admin else (409 if request.method == "POST" else 200)
    return render(request, "web/model_delete.html", {
        "model": model, "team": team, "is_admin": admin, "in_use": in_use, "version_count": model.versions.count(),
    }, status=status)


@require_http_methods(["GET", "POST"])
@team_required
def upload(request: HttpRequest, team: Team) -> HttpResponse:
    """The page's script uploads through tus and the API; this POST is the fallback without JavaScript."""
    form = UploadForm(request.POST or None, request.FILES or None, initial={"name": request.GET.get("model", "")})
    if request.method == "POST" and form.is_valid():
        version = _create_version(request, team, form)
        if version is not None:
            messages.success(request, f"Pipeline {version.model.name} version {version.number} created."
                             if version.format == Format.ENSEMBLE
                             else f"Version {version.number} of {version.model.name} uploaded; inspecting it now.")
            return redirect("model-detail", name=version.model.name)
    return render(request, "web/upload.html", {
        "form": form,
        "model_names": Model.objects.filter(team=team).values_list("name", flat=True),
        "formats_needing_signature": sorted(f.value for f in FORMATS_NEEDING_SIGNATURE),
        "datatypes": datatypes.FORM_ORDER,
        "chunk_size": 5 * 1024 * 1024,
        # The script checks the name before a long upload: the model is only created with its first version.
        "name_pattern": NAME_RE.pattern.removeprefix("^").removesuffix("$").removesuffix(r"\Z"),
        "name_rule": NAME_RULE,
        "example_max_bytes": settings.EXAMPLE_REQUEST_MAX_BYTES,
        **_serving_context(),
    })


# Where a refusal of the source's fetcher is shown: the field of the kind's main input.
_SOURCE_FIELD = {"mlflow": "mlflow_uri", "huggingface": "hf_repo", "uri": "uri"}


@require_http_methods(["GET", "POST"])
@team_required
def upload_import(request: HttpRequest, team: Team) -> HttpResponse:
    """The upload page's "From a registry" tab: the API's import (the source checked by its kind's fetcher, what the
    operator allowed the team, the same source twice the same version), then the model's page, where the version
    shows its import's progress and can be cancelled."""
    form = ImportForm(request.POST or None, initial={"name": request.GET.get("model", "")})
    if request.method == "POST" and form.is_valid() and "source" in form.cleaned_data:
        raw = form.cleaned_data["source"]
        field = _SOURCE_FIELD[raw["kind"]]
        try:
            source = imports.validate_source(raw, team.pk)
            model = (Model.objects.filter(team=team, name=form.cleaned_data["name"]).first()
                     or Model(team=team, name=form.cleaned_data["name"], created_by=acting_user(request)))
            version, created = imports.start_import(model, request.user, source)
        except (SourceForbidden, SourceRefused) as exc:
            form.add_error(field, str(exc))
        else:
            messages.success(request, f"Importing {version.model.name} version {version.number}." if created else
                             f"{version.model.name} version {version.number} was imported from this source already.")
            return redirect("model-detail", name=version.model.name)
    return render(request, "web/upload.html", {
        "import_form": form, "mode": "import",
        "model_names": Model.objects.filter(team=team).values_list("name", flat=True),
        **_serving_context(),
    })


def _serving_context() -> dict[str, Any]:
    """What the upload page says before anything is sent: the formats this portal's local runtime serves."""
    where = serving()
    reason = ("it needs the Kubernetes runtime" if where.kubernetes_ready
              else "it needs a Kubernetes cluster, which no operator has configured here")
    return {"serving_note": where.note(), "not_local": where.not_local, "not_local_reason": reason,
            "format_hints": _format_hints()}


def _format_hints() -> dict[str, dict[str, str]]:
    """For upload.js, from the format registry: the format a file name's extension suggests, and each format in
    a sentence ("A TensorRT plan cannot be served ...")."""
    registry = formats.REGISTRY.values()
    return {
        "extensions": {ext: fmt.name for fmt in registry for ext in fmt.extensions},
        "names": {fmt.name: fmt.description[:1].upper() + fmt.description[1:] for fmt in registry},
    }


def _create_version(request: HttpRequest, team: Team, form: UploadForm) -> ModelVersion | None:
    data = form.cleaned_data
    file = data["file"]
    if file.size > settings.MAX_MULTIPART_UPLOAD_SIZE:
        form.add_error("file",
                       f"Without JavaScript files up to {settings.MAX_MULTIPART_UPLOAD_SIZE:,} bytes can be sent; "
                               "turn JavaScript on for a resumable upload.")
        return None
    if file.size <= pipeline_form.MAX_DEFINITION_BYTES:
        text = file.read().decode("utf-8", errors="replace")
        file.seek(0)
        if pipeline_form.looks_like_pipeline(text):
            return _create_pipeline_version(request, team, form, text)
    try:
        with transaction.atomic():
            model = (Model.objects.filter(team=team, name=data["name"]).first()
                     or registry_actions.create_model(team, request.user, data["name"]))
            return registry_actions.create_version_from_file(
                model, request.user, file, file.name, declared_format=data["format"] or "",
                signature=data["signature"], max_batch_size=data["max_batch_size"],
                example_request=data["example_request"], decoupled=data["decoupled"])
    except registry_actions.NotStreamable as exc:
        form.add_error("decoupled", str(exc))
    except ArtifactRejected as exc:
        form.add_error("signature" if "signature" in str(exc) else "file", str(exc))
    except registry_actions.Conflict as exc:
        form.add_error(None, str(exc))
    return None


def _create_pipeline_version(request: HttpRequest, team: Team, form: UploadForm, text: str) -> ModelVersion | None:
    """A pipeline definition sent through the upload form (without JavaScript): created, or its problems listed."""
    checked = pipeline_form.check(team, form.cleaned_data["name"], text, form.cleaned_data["max_batch_size"])
    if checked.ok:
        try:
            return pipeline_form.create(team, request.user, checked)
        except registry_actions.Conflict as exc:
            form.add_error(None, str(exc))
            return None
    for problem in checked.problems:
        for what, message in problem.items:
            form.add_error("file", f"{problem.where}{' · ' + what if what else ''}: {message}")
    return None


# --- Deploy form --------------------------------------------------------------------------------------------


def _ready_versions(team: Team, model_names: list[str]) -> dict[str, list[ModelVersion]]:
    found: dict[str, list[ModelVersion]] = {name: [] for name in model_names}
    for version in (ModelVersion.objects.select_related("model")
                    .filter(model__team=team, model__name__in=model_names, status=ModelVersion.Status.READY)
                    .order_by("-number")):
        found[version.model.name].append(version)
    return found


def _plan_and_run(team: Team, form: DeploymentForm, model_forms: list[ServedModelForm], current: RevisionSpec | None,
                  run: Callable[[planning.Plan], Deployment],
                  deployment: Deployment | None = None) -> Deployment | None:
    """Plan what the parsed forms ask for (deployments.planning), as a change of `deployment` if given; its errors
    go back beside the fields."""
    if not (form.is_valid() and all(f.is_valid() for f in model_forms)):
        return None
    try:
        plan = planning.plan(team, deploy_request(form, model_forms, current), deployment=deployment,
                             canary=bool(form.cleaned_data.get("canary_percent")))
    except planning.PlanError as exc:
        add_plan_errors(exc.errors, form, model_forms)
        return None
    try:
        return run(plan)
    except deployment_actions.Conflict as exc:
        form.add_error("name" if not form.fields["name"].disabled else None, str(exc))
        return None
    except Invalid as exc:  # the rule's field is the API's ("rollout"): the page's is the canary's share
        sentence = f"{exc.message[:1].upper()}{exc.message[1:]}."
        form.add_error("canary_percent" if exc.field == "rollout" else None, sentence)
        return None


@require_http_methods(["GET", "POST"])
@team_required
def deployment_new(request: HttpRequest, team: Team) -> HttpResponse:
    model_name = request.GET.get("model", "")
    if not model_name:
        ready = Model.objects.filter(team=team, versions__status=ModelVersion.Status.READY).distinct()
        return render(request, "web/deploy_choose.html", {"models": ready})
    model = _get_model(team, model_name)
    versions = _ready_versions(team, [model.name])[model.name]
    if not versions:
        return render(request, "web/deploy_form.html", {"model": model, "no_ready_version": True})
    requested = _int(request.GET.get("version"))
    chosen = next((v for v in versions if v.number == requested), versions[0])
    data = request.POST if request.method == "POST" else None
    form = DeploymentForm(data, pools=placement.pool_choices(team, placement.versions_to_deploy(team, chosen)),
                          initial={"name": model.name, "runtime": Deployment.Runtime.LOCAL, "replicas": 1, "gpu": 0,
                                   **placement_initial(None)})
    # The last tune of this version on this machine, offered; "Use these" (?tuned=1) fills the form with it.
    tuned = suggestion_for(chosen)
    initial = initial_for_version(chosen)
    if tuned is not None and request.GET.get("tuned") == "1":
        initial = initial_from(tuned, initial)
    model_forms = [ServedModelForm(data, prefix="m0", model_name=model.name, versions=versions, initial=initial)]
    if request.method == "POST":
        deployment = _plan_and_run(team, form, model_forms, None, lambda plan: deployment_actions.create_deployment(
            team, request.user, form.cleaned_data["name"], plan))
        if deployment is not None:
            messages.success(request, f"Deployment {deployment.name} created. Its status below follows the start.")
            return redirect("deployment-detail", name=deployment.name)
    return render(request, "web/deploy_form.html", {"form": form, "model_forms": model_forms, "model": model,
                                                    "chosen": chosen, "runtime_frameworks": local_framework_status(),
                                                    "tuned": tuned, "tuned_applied": request.GET.get("tuned") == "1",
                                                    "unavailable_version": (requested
                                                                            if requested not in (None, chosen.number)
                                                                            else None)})


@require_http_methods(["GET", "POST"])
@team_required
def deployment_edit(request: HttpRequest, team: Team, name: str) -> HttpResponse:
    deployment = _get_deployment(team, name)
    spec = deployment.revision.spec if deployment.revision else None
    entries = spec.models if spec else ()
    versions = _ready_versions(team, [e.name for e in entries])
    resources = spec.resources if spec else Resources()
    data = request.POST if request.method == "POST" else None
    served = list(deployment.revision.versions.select_related("model")) if deployment.revision else []
    form = DeploymentForm(data, editing=True, pools=placement.pool_choices(team, served), initial={
        "name": deployment.name, "runtime": deployment.runtime, "replicas": spec.replicas if spec else 1,
        "gpu": resources.gpu, "gpu_type": resources.gpu_type, "cpu": resources.cpu, "memory": resources.memory,
        **placement_initial(spec)})
    model_forms = []
    for index, entry in enumerate(entries):
        model_forms.append(ServedModelForm(data, prefix=f"m{index}", model_name=entry.name, current=entry,
                                           versions=versions.get(entry.name, []), initial=initial_for_entry(entry)))

    changed = True
    idle_set: int | None = None

    def update(plan: planning.Plan) -> Deployment:
        nonlocal changed, idle_set
        rollout = form.rollout()
        if deployment_actions.timer_only(deployment, plan):
            idle_set = plan.spec.placement.idle_unload_seconds
        changed = deployment_actions.update_deployment(deployment, request.user, plan, canary=rollout) is not None
        return deployment

    if request.method == "POST" and _plan_and_run(team, form, model_forms, spec, update, deployment):
        if idle_set is not None and not changed:
            messages.success(request, f"Saved: {deployment.name} now unloads its models after {idle_set} s unused "
                                      "(0: never), in place: nothing was loaded again and no new revision was made.")
        elif not changed:
            messages.info(request, f"Nothing changed: {deployment.name} keeps serving these settings, and no new "
                                   "revision was made.")
        elif form.cleaned_data.get("canary_percent"):
            messages.success(request, f"Saved: {deployment.name} starts the new settings as a canary for "
                                      f"{form.cleaned_data['canary_percent']}% of the requests.")
        else:
            messages.success(request, f"Saved: {deployment.name} rolls out the new settings while the current "
                                      "ones keep serving.")
        return redirect("deployment-detail", name=deployment.name)
    return render(request, "web/deploy_form.html", {"form": form, "model_forms": model_forms, "deployment": deployment,
                                                    "runtime_frameworks": local_framework_status()})


# --- Deployment page ----------------------------------------------------------------------------------------


@require_GET
@team_required
def deployment_detail(request: HttpRequest, team: Team, name: str) -> HttpResponse:
    deployment = _get_deployment(team, name)
    base_url = request.build_absolute_uri("/").rstrip("/")
    return render(request, "web/deployment_detail.html", {
        **deployment_page.detail_context(deployment, base_url),
        **perf_panel.panel_context(deployment, request.GET.get("window"))})


@require_GET
@team_required
def deployment_live(request: HttpRequest, team: Team, name: str) -> HttpResponse:
    try:
        deployment = _get_deployment(team, name)
    except Http404:
        if request.htmx:  # type: ignore[attr-defined]
            return HttpResponseClientRedirect(reverse("dashboard"))  # deleted meanwhile (by someone else)
        raise
    # `refresh`: the buttons in the page's head follow the status too (an out-of-band swap of #deployment-actions).
    return render(request, "web/_deployment_live.html", {**deployment_page.live_context(deployment),
                                                         **deployment_page.settings_context(deployment),
                                                         "refresh": True})


@require_GET
@team_required
def deployment_logs(request: HttpRequest, team: Team, name: str) -> HttpResponse:
    deployment = _get_deployment(team, name)
    # The serving revision's log, never the newest server's (a rolled-back canary's, say); the panel says whose.
    choice = log_revision.choose(deployment)
    try:
        log = runtime_for(deployment).logs(deployment, LOG_LINES, choice.revision) if choice.revision else ""
    except Exception as exc:  # a display aid: a runtime that cannot answer must not break the page
        log = f"(the log cannot be read: {exc})"
    folded = fold_gpu_noise(log)
    return render(request, "web/_deployment_logs.html", {"deployment": deployment, "log": folded.text,
                                                         "gpu_noise": folded.gpu_noise,
                                                         "log_of": choice.label(),
                                                         "canary": deployment.canary_revision})


def _state_change(action: Callable[[Deployment, Any], object], done: str) -> Callable[..., HttpResponse]:
    @require_POST
    @team_required
    def view(request: HttpRequest, team: Team, name: str) -> HttpResponse:
        deployment = _get_deployment(team, name)
        try:
            action(deployment, request.user)
        except deployment_actions.Conflict as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, f"{deployment.name}: {done}")
        return redirect("deployment-detail", name=deployment.name)

    return view


deployment_stop = _state_change(deployment_actions.stop_deployment, "stopping.")
deployment_promote = _state_change(deployment_actions.promote_canary,
                                   "the canary is promoted: it serves every request.")
deployment_rollback = _state_change(deployment_actions.rollback_canary,
                                    "the canary is rolled back: the serving revision takes every request.")
deployment_start = _state_change(deployment_actions.start_deployment, "starting.")


@require_http_methods(["GET", "POST"])
@team_required
def deployment_delete(request: HttpRequest, team: Team, name: str) -> HttpResponse:
    deployment = _get_deployment(team, name)
    if request.method == "GET":
        return render(request, "web/deployment_delete.html", {"deployment": deployment})
    deployment_actions.delete_deployment(deployment, request.user)
    messages.success(request, f"{name} is being deleted: it no longer serves, and disappears in a moment.")
    return redirect("dashboard")


# --- API tokens ---------------------------------------------------------------------------------------------


@never_cache
@require_http_methods(["GET", "POST"])
@team_required
def tokens(request: HttpRequest, team: Team) -> HttpResponse:
    assert request.user.is_authenticated
    form = TokenForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        days = form.cleaned_data["expires_in_days"]
        token, raw = token_actions.issue_token(request.user, team, name=form.cleaned_data["name"],
                                               expires_in=timedelta(days=days) if days else None,
                                               scopes=form.scopes(), by=request.user, via="session")
        # Shown by the page this redirects to (so that a reload does not post again), stored nowhere meanwhile.
        created = redirect("tokens")
        new_token.keep_for_display(request, created, token.pk, token.prefix, raw, path=reverse("tokens"))
        return created
    shown = new_token.take_for_display(request) if request.method == "GET" else None
    user_tokens = ApiToken.objects.filter(user=request.user).select_related("team")
    response = render(request, "web/tokens.html", {
        "form": form, "tokens": user_tokens, "new_token": shown, "max_lifetime_days": max_token_lifetime_days(),
        "lifetime_is_capped": bool(settings.API_TOKEN_MAX_LIFETIME_DAYS),
    })
    if request.method == "GET":
        new_token.forget_pad(request, response, path=reverse("tokens"))
    return response


@require_POST
@login_required
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    assert request.user.is_authenticated
    token = ApiToken.objects.filter(pk=token_id, user=request.user).first()
    if token is None:
        raise Http404("No such token.")
    revoked = token_actions.revoke_token(token, by=request.user, via="session")
    others = f" and {len(revoked) - 1} token(s) it created" if len(revoked) > 1 else ""
    messages.success(request, f"Revoked token {token.prefix}… ({token.name or 'unnamed'}){others}.")
    return redirect(reverse("tokens"))



# --- Samples ------------------------------------------------------------------------------------------------


@require_POST
@team_required
def sample_deploy(request: HttpRequest, team: Team) -> HttpResponse:
    """The empty dashboard's "Deploy the sample ..." buttons (web/samples.py): the worker makes the sample, and the
    click lands at once on its progress page; a click on a deployed sample lands on its deployment."""
    which = request.POST.get("sample", "")
    if which not in samples.SAMPLES:
        return HttpResponseBadRequest(f"Unknown sample {which[:40]!r}: choose one of {', '.join(samples.SAMPLES)}.",
                                      content_type="text/plain")
    with transaction.atomic():
        # One run per team and sample at a time: clicks while one runs join it rather than queue more inspections
        # in the lane every team's uploads share (the team's row serialises two clicks at once).
        Team.objects.select_for_update(no_key=True).filter(pk=team.pk).first()
        progress = samples.progress(team, which)
        if progress.deployment is None and not progress.running:
            audit(request.user, team, samples.STARTED, which)
            user_id = request.user.pk
            transaction.on_commit(lambda: deploy_sample.delay(team.pk, user_id, which))
    if progress.deployment is not None:
        messages.info(request, f"{progress.deployment.name} was deployed already: here it is.")
        return redirect("deployment-detail", name=progress.deployment.name)
    return redirect("sample-progress", which=which)


@require_GET
@team_required
def sample_progress(request: HttpRequest, team: Team, which: str) -> HttpResponse:
    """Each step of the sample's making as the worker commits it (the fragment polls itself), then its deployment."""
    if which not in samples.SAMPLES:
        raise Http404("No such sample.")
    progress = samples.progress(team, which)
    if progress.deployment is not None:
        name = progress.deployment.name
        messages.success(request, f"Created the sample models in your team and the deployment {name}. Its status "
                                  "below follows the start; Try it opens when it serves.")
        url = reverse("deployment-detail", args=[name])
        return HttpResponseClientRedirect(url) if request.htmx else redirect(url)  # type: ignore[attr-defined]
    template = "web/_sample_progress.html" if request.htmx else "web/sample_progress.html"  # type: ignore[attr-defined]
    return render(request, template, {"which": which, "progress": progress,
                                      "deployment_name": samples.DEPLOYMENT_NAMES[which]})


@require_GET
@login_required
def sample_digit(request: HttpRequest) -> HttpResponse:
    """A held-out handwritten 7 as a PNG, for trying models that take images (the sample pipeline)."""
    response = HttpResponse(_sample_digit_png(), content_type="image/png")
    response["Content-Disposition"] = 'inline; filename="digit-7.png"'
    response["Cache-Control"] = "private, max-age=86400"
    return response


@functools.lru_cache(maxsize=1)
def _sample_digit_png() -> bytes:
    from models_registry.samples import sample_digit_png

    return sample_digit_png()


# --- Pipelines from the upload page -------------------------------------------------------------------------


@require_POST
@team_required
def pipeline_new(request: HttpRequest, team: Team) -> HttpResponse:
    """The upload page's pipeline mode (static/js/upload.js): `definition` (JSON text) checked against the team's
    models and drawn; with `save`, created as the next version of `name`. Answers the preview fragment: 200 when
    the definition is valid, 400 with each problem beside its step and tensor, 201 once created."""
    max_batch_size = _int(request.POST.get("max_batch_size")) if request.POST.get("max_batch_size") else None
    checked = pipeline_form.check(team, request.POST.get("name", ""), request.POST.get("definition", ""),
                                  max_batch_size)
    created = None
    if checked.ok and request.POST.get("save"):
        try:
            created = pipeline_form.create(team, request.user, checked)
        except registry_actions.Conflict as exc:
            checked.problems.append(pipeline_form.Problem("The definition", [("", str(exc))]))
    status = 201 if created else (200 if checked.ok else 400)
    return render(request, "web/_pipeline_preview.html", {"checked": checked, "created": created}, status=status)
