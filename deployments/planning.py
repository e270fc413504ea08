"""Deploy planning: from what a user asks for (models by name, serving settings, a runtime) to the RevisionSpec a new
revision stores, or the errors that say what to change.

One plain function, `plan()`, that the API and the web pages both call: it resolves model versions (the latest ready
one unless a version is given), brings in the step models of pipelines, fills in every default, fits a pipeline's
batches to its steps, and asks the runtime whether it can serve the result (its policy: the local runtime's single
server, sandbox and runtime env; every runtime's Triton rules through deployments.spec). The callers only translate
HTTP or form input into a `DeployRequest` and the `PlanError`'s field-keyed errors back into their own shape.

Errors are keyed as the API names its input: "models[0].version", "models[1].requirements", "replicas",
"resources.cpu", "runtime", ... The messages are the ones users have seen since the first version; tests pin them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from django.conf import settings

from accounts.models import Team
from deployments import ceilings, pools, server_memory
from deployments.ceilings import MAX_GPUS, MAX_REPLICAS
from deployments.models import Deployment
from deployments.pool_models import SHARED_POOL
from deployments.revision_spec import DEDICATED, Autoscaling, ModelEntry, Placement, Resources, RevisionSpec
from deployments.runtimes.registry import runtime_named
from deployments.spec import DynamicBatching, defaults_for
from modelport.core import quantity
from models_registry.models import Format, ModelVersion

# The longest idle time before a shared deployment's models are unloaded that a user may ask for (the API and the
# deploy form bound it as this): past a month, 0 ("never") says it plainly.
MAX_IDLE_UNLOAD_SECONDS = 30 * 86400


@dataclass(frozen=True)
class PlacementRequest:
    """Where to run, as asked: what is not given is the operator's default mode, the pool `shared`, the pool's
    idle_unload_seconds."""

    mode: str | None = None
    pool: str | None = None
    idle_unload_seconds: int | None = None


@dataclass(frozen=True)
class DeployRequest:
    runtime: str
    # Asked entries (ModelEntry.asked): planning reads their name, version and settings; what a version fixes (its
    # format, signature, artifact, definition) comes from the registry, never from the request.
    models: tuple[ModelEntry, ...]
    replicas: int = 1
    resources: Resources = field(default_factory=Resources)
    autoscaling: Autoscaling | None = None
    placement: PlacementRequest | None = None


@dataclass(frozen=True)
class Plan:
    spec: RevisionSpec
    versions: tuple[ModelVersion, ...]  # the model versions it serves (Revision.versions)


class PlanError(Exception):
    """The request cannot be served as asked; `errors` maps input fields to messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{key}: {' '.join(messages)}" for key, messages in sorted(errors.items())))


class _Errors(dict[str, list[str]]):
    def add(self, key: str, message: str) -> None:
        self.setdefault(key, []).append(message)


def plan(team: Team, request: DeployRequest, *, deployment: Deployment | None = None, canary: bool = False) -> Plan:
    """The revision spec serving `request` for `team`, or PlanError. `deployment`: the one it changes (a canary
    of it when `canary`), for the team's totals (deployments.ceilings)."""
    errors = _Errors()
    try:
        runtime = runtime_named(request.runtime)
    except ValueError as exc:
        raise PlanError({"runtime": [str(exc)]}) from None
    if not request.models:
        errors.add("models", "list at least one model to serve")
    _check_deployment_settings(request, errors)
    settings_errors = set(errors)
    served = _models_to_serve(team, request.models, errors)
    entries = [_entry(version, options) for _, options, version in served]
    entries = _fit_pipeline_batches(entries, [options for _, options, _ in served])
    index_of: dict[str, int] = {}
    for (index, _, version) in served:
        index_of.setdefault(version.model.name, index)
    placement = _placement(team, request, errors)
    spec = RevisionSpec(runtime=request.runtime, models=tuple(entries), replicas=request.replicas,
                        resources=request.resources, autoscaling=request.autoscaling, placement=placement)
    # A local dedicated server given no memory is limited from what its models were measured to take.
    spec = replace(spec, memory_basis=server_memory.basis_for(spec, [version for _, _, version in served]))
    if entries and placement.shared and "placement" not in errors:
        _check_sharing(team, spec, errors)
    if entries:
        # The runtime's policy, and Triton's own rules for its target: keyed "<model name>.<field>" per model.
        for key, messages in runtime.check_plan(spec).items():
            if key in settings_errors:
                continue  # one rule per field at a time: the general one (a Kubernetes quantity) first
            model_name, _, rest = key.partition(".")
            if model_name in index_of:
                key = f"models[{index_of[model_name]}]" + (f".{rest}" if rest else "")
            for message in messages:
                errors.add(key, message)
    if entries and not errors:
        # The operator's ceilings last: what they refuse is worth saying only of a request that could run.
        for key, messages in ceilings.check(team, spec, deployment=deployment, canary=canary).items():
            for message in messages:
                errors.add(key, message)
    if errors:
        raise PlanError(dict(errors))
    return Plan(spec=spec, versions=tuple(version for _, _, version in served))


def request_for(spec: RevisionSpec) -> DeployRequest:
    """A revision's settings as a request: planned again, they give the same spec (unless a newer version of a model
    that was not pinned became ready meanwhile: the versions are pinned here). A planned entry is an asked one with
    every setting given."""
    placement = spec.placement
    return DeployRequest(
        runtime=spec.runtime, replicas=spec.replicas, resources=spec.resources, autoscaling=spec.autoscaling,
        placement=PlacementRequest(mode=placement.mode, pool=placement.pool or None,
                                   idle_unload_seconds=placement.idle_unload_seconds if placement.shared else None),
        models=spec.models,
    )


def _placement(team: Team, request: DeployRequest, errors: _Errors) -> Placement:
    """The placement asked for, defaults filled in (the pool's idle_unload_seconds), or errors keyed
    "placement.<field>"."""
    asked = request.placement or PlacementRequest()
    mode = asked.mode or settings.DEPLOYMENT_DEFAULT_PLACEMENT
    if mode not in ("dedicated", "shared"):
        errors.add("placement.mode", f"use 'dedicated' or 'shared', not {mode!r}")
        return DEDICATED
    if mode == "dedicated":
        if asked.pool or asked.idle_unload_seconds is not None:
            errors.add("placement.mode", "a pool and idle_unload_seconds are for placement mode 'shared'; a "
                                         "dedicated deployment has a Triton of its own (to move it into a pool, "
                                         "set placement.mode 'shared': modelport deploy NAME --shared)")
        return DEDICATED
    name = asked.pool or SHARED_POOL
    pool = pools.pool_for(team, name)
    if pool is None:
        errors.add("placement.pool", f"no pool named {name!r} for your team: GET /api/v1/pools/ lists the pools "
                                     "you may use")
        return DEDICATED
    if pool.runtime != request.runtime:
        errors.add("placement.pool", f"pool {name!r} is on the {pool.runtime} runtime, this deployment on "
                                     f"{request.runtime}: choose a pool of its runtime, or placement 'dedicated'")
    idle = asked.idle_unload_seconds if asked.idle_unload_seconds is not None else pool.idle_unload_seconds
    return Placement(mode="shared", pool=pool.name, idle_unload_seconds=idle)


def _check_sharing(team: Team, spec: RevisionSpec, errors: _Errors) -> None:
    """Who may share a process (deployments/pools.py), and settings a pool's Triton does not take per deployment."""
    pool = pools.pool_for(team, spec.placement.pool)
    if pool is None:
        return
    for _, why in pools.sharing_refusal(pool, spec):
        errors.add("placement", why)
    if spec.resources.cpu or spec.resources.memory:
        errors.add("resources", f"a shared deployment runs in pool {pool.name!r}'s Triton, whose memory is the "
                                "pool's budget: leave resources.cpu and resources.memory empty, or use placement "
                                "mode 'dedicated'")
    if spec.resources.gpu or spec.resources.mig_profile or spec.resources.gpu_type:
        errors.add("resources", f"a shared deployment uses the GPUs of pool {pool.name!r} (its share class: "
                                f"{pool.isolation}): leave resources.gpu, gpu_type and mig_profile empty, or use "
                                "placement mode 'dedicated'")
    if any(m.response_cache for m in spec.models):
        errors.add("placement", "a pool's Triton has no response cache: turn response_cache off, or use "
                                "placement mode 'dedicated'")
    if spec.autoscaling is not None and spec.autoscaling.scales_to_zero:
        # A pool's pods serve every team's models; what goes when idle is a revision's models, unloaded.
        errors.add("autoscaling.min_replicas", f"a shared deployment runs in pool {pool.name!r}, which stays up for "
                                               "every team: its models go when idle with "
                                               "placement.idle_unload_seconds, so use min_replicas 1 or more, or "
                                               "placement mode 'dedicated' to scale to zero")


def _check_deployment_settings(request: DeployRequest, errors: _Errors) -> None:
    """Rules of the deployment's own settings that hold on every runtime (the forms and serializers have parsed the
    values already; these bounds are what a caller that bypasses them would meet)."""
    if not 1 <= request.replicas <= MAX_REPLICAS:
        errors.add("replicas", f"use between 1 and {MAX_REPLICAS} replicas")
    resources = request.resources
    if not 0 <= resources.gpu <= MAX_GPUS:
        errors.add("resources.gpu", f"use between 0 and {MAX_GPUS} GPUs per replica")
    for key, bounds in (("cpu", quantity.CPU), ("memory", quantity.MEMORY)):
        value = getattr(resources, key)
        if value:
            try:
                # Kubernetes would accept 400 nines of cores; the cluster would not.
                quantity.check_quantity(value, bounds)
            except quantity.QuantityError as exc:
                errors.add(f"resources.{key}", str(exc))
    idle = request.placement.idle_unload_seconds if request.placement else None
    if idle is not None and not 0 <= idle <= MAX_IDLE_UNLOAD_SECONDS:
        errors.add("placement.idle_unload_seconds", f"use between 0 (never unload) and {MAX_IDLE_UNLOAD_SECONDS} "
                                                    "seconds")
    scaling = request.autoscaling
    if scaling is not None and scaling.min_replicas < 0:
        errors.add("autoscaling.min_replicas", "use 0 (scale to zero) or more")
    if scaling is not None and scaling.max_replicas < scaling.min_replicas:
        errors.add("autoscaling.max_replicas", "max_replicas must be at least min_replicas")


def _entry(version: ModelVersion, options: ModelEntry) -> ModelEntry:
    """The spec entry for `version` with the settings of the asked entry `options`; what it leaves to the defaults
    gets the model's."""
    defaults = defaults_for(version.parsed_signature, version.max_batch_size)
    max_batch_size = (defaults.max_batch_size if options.left_to_default("max_batch_size")
                      else options.max_batch_size)
    batching: DynamicBatching | None
    if not options.left_to_default("dynamic_batching"):
        batching = options.dynamic_batching
    elif version.format == Format.ENSEMBLE:
        batching = None  # Triton batches an ensemble's steps, each with its own settings, never the ensemble
    else:
        batching = defaults.dynamic_batching if max_batch_size > 0 else None
    return ModelEntry(
        name=version.model.name, version=version.number, version_id=version.id, format=version.format,
        sha256=version.sha256, signature=version.parsed_signature, max_batch_size=max_batch_size,
        dynamic_batching=batching, instance_group=options.instance_group,
        response_cache=options.response_cache, warmup=options.warmup,
        definition=version.parsed_definition, decoupled=version.decoupled,
        chat_template=version.chat_template,
    )


def _resolve_version(team: Team, model: str, number: int | None, errors: _Errors, where: str) -> ModelVersion | None:
    versions = ModelVersion.objects.select_related("model").filter(model__team=team, model__name=model)
    if number is not None:
        version = versions.filter(number=number).first()
        if version is None:
            errors.add(f"{where}.version", f"model {model!r} has no version {number}")
            return None
        if version.status != ModelVersion.Status.READY:
            detail = f": {version.error}" if version.error else ""
            errors.add(f"{where}.version",
                       f"version {version.number} of {model!r} is {version.status}, not ready{detail}")
            return None
        return version
    version = versions.filter(status=ModelVersion.Status.READY).order_by("-number").first()
    if version is None:
        errors.add(f"{where}.model", f"model {model!r} has no ready version yet" if versions.exists()
                   else f"no model named {model!r} in your team")
    return version


def _models_to_serve(team: Team, items: Sequence[ModelEntry],
                     errors: _Errors) -> list[tuple[int, ModelEntry, ModelVersion]]:
    """(index of the listed item, serving options, version) of each model to serve: the listed ones, and the step
    models of listed pipelines. A step model not listed is added with its defaults; a listed one keeps its own
    options and serves the version the pipeline names. Python steps get no dynamic batching unless asked for."""
    listed = []
    for index, item in enumerate(items):
        version = _resolve_version(team, item.name, item.asked_version, errors, f"models[{index}]")
        if version is not None:
            listed.append((index, item, version))
    needed: dict[str, tuple[int, str, int]] = {}  # step model -> (version, pipeline, the pipeline's index)
    for index, _, version in listed:
        if version.format != Format.ENSEMBLE:
            continue
        for model, number in version.step_references:
            first = needed.setdefault(model, (number, version.model.name, index))
            if first[0] != number:
                errors.add(f"models[{index}]",
                           f"pipeline {version.model.name!r} uses version {number} of {model!r} but pipeline "
                           f"{first[1]!r} uses version {first[0]}: a deployment serves one version of each model")
    served = []
    for index, item, version in listed:
        options = item
        need = needed.get(version.model.name)
        if need is not None:
            number, pipeline, _ = need
            if version.number != number:
                if item.asked_version is not None:
                    errors.add(f"models[{index}].version",
                               f"pipeline {pipeline!r} uses version {number} of {version.model.name!r}, not "
                               f"{version.number}: list it without a version, or with version {number}")
                    continue
                resolved = _resolve_version(team, version.model.name, number, errors, f"models[{index}]")
                if resolved is None:
                    continue
                version = resolved
            if version.format == Format.PYTHON and item.left_to_default("dynamic_batching"):
                options = _without_batching(item)
        served.append((index, options, version))
    listed_names = {version.model.name for _, _, version in listed}
    for model, (number, _, index) in needed.items():
        if model in listed_names:
            continue
        step = _resolve_version(team, model, number, errors, f"models[{index}]")
        if step is not None:
            options = ModelEntry.asked(model, version=number)
            if step.format == Format.PYTHON:
                options = _without_batching(options)
            served.append((index, options, step))
    return served


def _without_batching(asked: ModelEntry) -> ModelEntry:
    return replace(asked, dynamic_batching=None, defaults=asked.defaults - {"dynamic_batching"})


def _fit_pipeline_batches(entries: list[ModelEntry], options: list[ModelEntry]) -> list[ModelEntry]:
    """A pipeline not given a max_batch_size of its own batches no more than its steps are served with."""
    by_name = {entry.name: entry for entry in entries}
    fitted = []
    for entry, given in zip(entries, options, strict=True):
        if entry.is_pipeline and given.left_to_default("max_batch_size"):
            steps = [by_name[m].max_batch_size for m, _ in entry.step_references if m in by_name]
            if steps and all(size > 0 for size in steps):
                entry = replace(entry, max_batch_size=min([entry.max_batch_size, *steps]))
        fitted.append(entry)
    return fitted

