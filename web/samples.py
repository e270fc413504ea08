"""The dashboard's "Deploy the sample ..." buttons: the sample models of models_registry.samples (the ones
`make_sample_models` writes) are created in the user's team through the paths an upload takes, and deployed through
the path the deploy form takes. Clicking twice changes nothing: a sample version whose bytes (or, for the pipeline,
whose definition) the team has already is reused, and an existing deployment of the sample's name is kept.

Making them takes a while (the classifier is trained, each model inspected, the pipeline checked): the click queues
web.tasks.deploy_sample and lands at once on a page that shows each step as the worker takes it (`progress`), then
opens the deployment. Each step commits on its own so that the page can show it; a step that fails leaves what was
made before it, which the next click reuses.

This module joins the registry and the deployments, which is why it lives with the pages rather than in either app.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from accounts.models import Team
from deployments import actions as deployment_actions
from deployments import planning
from deployments.model_entry import ModelEntry
from deployments.models import Deployment
from infra.api_errors import Conflict
from modelport.core.example_request import example_to_store
from models_registry import actions as registry_actions
from models_registry import inspection, pipelines
from models_registry.models import Format, Model, ModelVersion
from models_registry.samples import SampleArtifact, digits_pipeline_definition, sample_artifacts

SAMPLES = ("digits", "pipeline", "textgen")
# The deployment each button makes, and the model it serves.
DEPLOYMENT_NAMES = {"digits": "digits", "pipeline": "digits-pipeline", "textgen": "textgen"}
PIPELINE_MODEL = "digits-pipeline"
# The models each sample makes, in the order the worker makes them (sample_artifacts' order, then the pipeline): the
# progress page lists them without building the artifacts (which trains the classifier).
MODELS = {"digits": ("digits",), "pipeline": ("preprocess", "digits", "postprocess", PIPELINE_MODEL),
          "textgen": ("textgen",)}
# The audit actions of a click (written by the view) and of a run's end (by the task): the progress page shows a
# failure newer than the latest click, and a click while a run has not ended joins it.
STARTED = "sample.deploy"
FAILED = "sample.fail"
DONE = "sample.done"


class SampleError(Exception):
    """The sample cannot be deployed here; the message says why (e.g. what the local runtime lacks)."""


@dataclass(frozen=True)
class SampleDeployment:
    deployment: Deployment
    created: bool  # False: the deployment existed already (a second click)


def deploy_sample(team: Team, user: Any, which: str) -> SampleDeployment:
    """Create the sample's models (or reuse identical ones) and deploy them; idempotent."""
    if which not in SAMPLES:
        raise SampleError(f"Unknown sample {which!r}: choose one of {', '.join(SAMPLES)}.")
    name = DEPLOYMENT_NAMES[which]
    existing = _deployment(team, name)
    if existing is not None:
        return SampleDeployment(existing, created=False)
    try:
        return _deploy(team, user, which, name)
    except Conflict:
        # Another click of the same button won the race for a model or the deployment name: what it made is the
        # sample, so this click ends where that one did.
        existing = _deployment(team, name)
        if existing is None:
            raise
        return SampleDeployment(existing, created=False)


def deployed(team: Team, deployments: list[Deployment]) -> set[str]:
    """The samples (of SAMPLES) that have a live deployment of their name among `deployments` (the team's)."""
    names = {d.name for d in deployments if d.team_id == team.pk and d.desired_state != Deployment.Desired.DELETED}
    return {which for which in SAMPLES if DEPLOYMENT_NAMES[which] in names}


def _deployment(team: Team, name: str) -> Deployment | None:
    return (Deployment.objects.filter(team=team, name=name).exclude(desired_state=Deployment.Desired.DELETED)
            .first())


def _deploy(team: Team, user: Any, which: str, name: str) -> SampleDeployment:
    versions = {artifact.name: _sample_version(team, user, artifact) for artifact in sample_artifacts(which)}
    served = MODELS[which][-1]
    if which == "pipeline":
        _pipeline_version(team, user, versions)
    # The text generator streams, which a shared pool never serves (it takes ONNX models only: pools.sharing_refusal):
    # it asks for a server of its own whatever the operator's default placement is.
    placement = planning.PlacementRequest(mode="dedicated") if which == "textgen" else None
    request = planning.DeployRequest(runtime=Deployment.Runtime.LOCAL, models=(ModelEntry.asked(served),),
                                     placement=placement)
    try:
        plan = planning.plan(team, request)
    except planning.PlanError as exc:
        raise SampleError("The sample cannot be deployed here: " + _messages(exc.errors)) from None
    deployment = deployment_actions.create_deployment(team, user, name, plan)
    return SampleDeployment(deployment, created=True)


# A step's state (the status badge's class, as a version's) and the word the page shows for it.
STATE_WORDS = {"pending": "waiting", "validating": "inspecting", "ready": "done", "failed": "failed"}


@dataclass(frozen=True)
class Step:
    label: str
    state: str  # a key of STATE_WORDS
    detail: str = ""

    @property
    def word(self) -> str:
        return STATE_WORDS[self.state]


@dataclass(frozen=True)
class Progress:
    steps: list[Step]
    deployment: Deployment | None  # made: the page opens it
    error: str  # the run failed: why (the page stops polling and says it)
    running: bool = False  # a click's run is under way (not failed, not past its time limit): a new click waits



def progress(team: Team, which: str) -> Progress:
    """Where the latest click's run stands, from what it has committed: each model's newest version, the deployment,
    and a failure recorded after the click."""
    from audit.models import AuditEntry

    entries = AuditEntry.objects.filter(team=team, target=which)
    click = entries.filter(action=STARTED).order_by("-id").first()
    failure = entries.filter(action=FAILED, id__gt=click.pk if click else 0).order_by("-id").first()
    newest: dict[str, ModelVersion] = {}
    for version in (ModelVersion.objects.filter(model__team=team, model__name__in=MODELS[which])
                    .select_related("model").order_by("number")):
        # A version an earlier run left unfinished is not this run's: this run reuses only ready ones.
        if version.status == ModelVersion.Status.READY or click is None or version.created_at >= click.time:
            newest[version.model.name] = version
    steps = [_step(name, newest.get(name)) for name in MODELS[which]]
    deployment = _deployment(team, DEPLOYMENT_NAMES[which])
    steps.append(Step(f"Deployment {DEPLOYMENT_NAMES[which]}", "ready" if deployment else "pending",
                      "made: opening its page" if deployment else ""))
    error = str(failure.detail.get("error", "")) if failure else ""
    ended = failure is not None or entries.filter(action=DONE, id__gt=click.pk if click else 0).exists()
    running = (click is not None and not ended
               and click.time > timezone.now() - timedelta(seconds=run_limit_seconds()))
    return Progress(steps, deployment, error, running)


def run_limit_seconds() -> float:
    """A run's time limit (web.tasks): up to four inspections (the pipeline's three models and its definition)."""
    return 4 * settings.INSPECTION_TIME_LIMIT_SECONDS


def _step(name: str, version: ModelVersion | None) -> Step:
    kind = "Pipeline" if name == PIPELINE_MODEL else "Model"
    if version is None:
        return Step(f"{kind} {name}", "pending")
    label = f"{kind} {name}, version {version.number}"
    if version.status == ModelVersion.Status.READY:
        return Step(label, "ready", "inspected" if kind == "Model" else "its steps fit")
    if version.status == ModelVersion.Status.VALIDATING:
        return Step(label, "validating", "uploaded, being inspected")
    return Step(label, "failed", version.error)


def _sample_version(team: Team, user: Any, artifact: SampleArtifact) -> ModelVersion:
    """The team's ready version of the sample's bytes (and declared signature), or a new one made as an upload
    makes it."""
    sha256 = hashlib.sha256(artifact.data).hexdigest()
    model = Model.objects.filter(team=team, name=artifact.name).first()
    if model is not None:
        declared = artifact.signature.to_json() if artifact.signature else None
        same = next((v for v in model.versions.filter(sha256=sha256, status=ModelVersion.Status.READY,
                                                      decoupled=artifact.decoupled)
                     .order_by("-number") if declared is None or v.signature == declared), None)
        if same is not None:
            return same
    else:
        model = registry_actions.create_model(team, user, artifact.name, artifact.description)
    version = registry_actions.create_version_from_file(
        model, user, io.BytesIO(artifact.data), artifact.filename, declared_format=artifact.format,
        signature=artifact.signature, decoupled=artifact.decoupled,
        # As an upload's is stored: checked against the signature, BYTES elements as {"b64": ...}.
        example_request=example_to_store(artifact.example_request, artifact.signature,
                                         settings.EXAMPLE_REQUEST_MAX_BYTES))
    # Inspected here rather than by the worker, so that the deployment below can use it; the worker's task, queued
    # at the commit, finds it claimed (or, if the worker was first, this waits for it).
    version = inspection.inspect_here(version.pk)
    if version.status != ModelVersion.Status.READY:
        raise SampleError(f"The sample model {artifact.name} did not pass inspection: {version.error}")
    return version


def _pipeline_version(team: Team, user: Any, steps: dict[str, ModelVersion]) -> ModelVersion:
    definition = digits_pipeline_definition(digits=steps["digits"].number, preprocess=steps["preprocess"].number,
                                            postprocess=steps["postprocess"].number)
    model = Model.objects.filter(team=team, name=PIPELINE_MODEL).first()
    if model is not None:
        same = next((v for v in model.versions.filter(format=Format.ENSEMBLE, status=ModelVersion.Status.READY)
                     .order_by("-number") if v.definition == definition), None)
        if same is not None:
            return same
    else:
        model = registry_actions.create_model(team, user, PIPELINE_MODEL,
                                              "Digit images to the top-3 labels (pipeline), a Modelport sample")
    lookup = {name: version for name, version in steps.items()}

    def find(name: str, number: int | None) -> pipelines.StepVersion | str:
        version = lookup.get(name)
        if version is None or (number is not None and number != version.number):
            return f"no sample version {name}:{number}"
        return registry_actions.step_version(version)

    try:
        pipeline = pipelines.validate_pipeline(definition, find, pipeline_model=PIPELINE_MODEL)
    except pipelines.PipelineError as exc:
        raise SampleError(f"The sample pipeline does not fit its steps: {exc}") from None
    return registry_actions.create_pipeline_version(model, user, pipeline)


def _messages(errors: Any) -> str:
    from infra.api_errors import _flatten

    return "; ".join(f"{key}: {' '.join(messages)}" if key != "non_field_errors" else " ".join(messages)
                     for key, messages in _flatten(errors).items())
