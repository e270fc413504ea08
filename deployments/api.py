"""REST API for deployments: /api/v1/deployments/..."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Prefetch
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.context import current_team
from accounts.idempotency import idempotent
from accounts.models import Team
from deployments import actions, frameworks, python_requirements, quantity
from deployments.models import Deployment, Event, TritonServer
from deployments.runtimes.local import runtime as local_runtime
from deployments.runtimes.registry import runtime_for
from deployments.snapshot import served_model, served_model_json
from deployments.spec import MAX_INSTANCE_COUNT, MAX_QUEUE_DELAY_MICROSECONDS, RepositorySpec, validate_repository
from models_registry.api import validate_name_field
from models_registry.models import Format, ModelVersion
from models_registry.pipelines import step_references
from portal.api_errors import request_object

MAX_REPLICAS = 100


class DynamicBatchingSerializer(serializers.Serializer[Any]):
    max_queue_delay_microseconds = serializers.IntegerField(min_value=0, max_value=MAX_QUEUE_DELAY_MICROSECONDS, default=0)
    preferred_batch_size = serializers.ListField(child=serializers.IntegerField(min_value=1), default=list, max_length=32)
    preserve_ordering = serializers.BooleanField(default=False)


class InstanceGroupSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField(min_value=1, max_value=MAX_INSTANCE_COUNT, default=1)
    kind = serializers.ChoiceField(choices=["cpu", "gpu"], default="cpu")
    gpus = serializers.ListField(child=serializers.IntegerField(min_value=0), default=list, max_length=64)


class ServedModelSerializer(serializers.Serializer[Any]):
    model = serializers.CharField()
    version = serializers.IntegerField(min_value=1, required=False, help_text="Default: the latest ready version.")
    max_batch_size = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False)
    dynamic_batching = DynamicBatchingSerializer(required=False, allow_null=True)
    instance_group = InstanceGroupSerializer(required=False)
    response_cache = serializers.BooleanField(required=False, default=False)
    warmup = serializers.DictField(required=False, allow_null=True)


class ResourcesSerializer(serializers.Serializer[Any]):
    cpu = serializers.CharField(required=False, allow_blank=True, max_length=quantity.MAX_LENGTH, help_text=(
        'Cores per replica, a Kubernetes quantity from "1m" to "1024", e.g. "2" or "500m". Empty: the default.'))
    memory = serializers.CharField(required=False, allow_blank=True, max_length=quantity.MAX_LENGTH, help_text=(
        'Memory per replica, a Kubernetes quantity from "1Mi" to "16Ti", e.g. "4Gi". Empty: the default.'))
    gpu = serializers.IntegerField(min_value=0, max_value=16, required=False, default=0)
    gpu_type = serializers.CharField(required=False, allow_blank=True)
    mig_profile = serializers.RegexField(r"^\d+g\.\d+gb$", required=False, allow_blank=True,
                                         help_text='A MIG profile such as "1g.10gb".')

    def validate_cpu(self, value: str) -> str:
        return _quantity(value, quantity.CPU)

    def validate_memory(self, value: str) -> str:
        return _quantity(value, quantity.MEMORY)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        # An empty quantity means "the default": leave it out of the spec rather than storing "".
        attrs = dict(super().to_internal_value(data))
        return {key: value for key, value in attrs.items() if not (key in ("cpu", "memory") and value == "")}


def _quantity(value: str, bounds: quantity.Bounds) -> str:
    """A Kubernetes quantity within sane bounds; Kubernetes would accept 400 nines of cores, the cluster would not."""
    if value == "":
        return value
    try:
        quantity.check_quantity(value, bounds)
    except quantity.QuantityError as exc:
        raise serializers.ValidationError(str(exc)) from None
    return value


class AutoscalingSerializer(serializers.Serializer[Any]):
    min_replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS)
    max_replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS)
    metric = serializers.ChoiceField(choices=["cpu", "queue_time"], default="cpu")
    target = serializers.IntegerField(min_value=1, max_value=1_000_000_000, help_text=(
        "cpu: average CPU utilization in percent of the request; queue_time: Triton's average queue time per "
        "request in microseconds."))

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["max_replicas"] < attrs["min_replicas"]:
            raise serializers.ValidationError({"max_replicas": ["max_replicas must be at least min_replicas"]})
        return attrs


class DeploymentInputSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(allow_blank=True, trim_whitespace=False)
    runtime = serializers.ChoiceField(choices=Deployment.Runtime.choices, default=Deployment.Runtime.LOCAL)
    models = ServedModelSerializer(many=True, allow_empty=False)
    replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS, default=1)
    resources = ResourcesSerializer(required=False, default=dict)
    autoscaling = AutoscalingSerializer(required=False, allow_null=True, help_text="Kubernetes only: an HPA.")

    def validate_name(self, value: str) -> str:
        return validate_name_field(value)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        team: Team = self.context["team"]
        runtime = attrs.get("runtime", Deployment.Runtime.LOCAL)
        errors: dict[str, list[str]] = {}
        if isinstance(self.initial_data, dict) and "allow_egress" in self.initial_data:
            errors["allow_egress"] = [OPERATOR_ONLY_EGRESS]
        entries: list[dict[str, Any]] = []
        versions: list[ModelVersion] = []
        index_of: dict[str, int] = {}
        served = _models_to_serve(team, attrs["models"], errors)
        for index, options, version in served:
            versions.append(version)
            entries.append(served_model_json(version, options))
            index_of.setdefault(version.model.name, index)
        _fit_pipeline_batches(entries, [options for _, options, _ in served])
        if runtime == Deployment.Runtime.LOCAL:
            _check_requirements(served, errors)
            if attrs.get("replicas", 1) != 1:
                errors.setdefault("replicas", []).append(
                    "the local runtime runs one Triton server per deployment: use replicas 1, or runtime 'kubernetes'")
            if (attrs.get("resources") or {}).get("gpu"):
                errors.setdefault("resources.gpu", []).append("the local runtime has no GPU: use gpu 0, or runtime 'kubernetes'")
            if attrs.get("autoscaling"):
                errors.setdefault("autoscaling", []).append(
                    "the local runtime runs one Triton server per deployment: autoscaling needs runtime 'kubernetes'")
            for key, messages in local_runtime.resource_errors(dict(attrs.get("resources") or {})).items():
                errors.setdefault(key, []).extend(messages)
            refusal = local_runtime.sandbox_refusal({"models": entries})
            if refusal:
                errors.setdefault("runtime", []).append(refusal)
        if entries:
            repository = RepositorySpec(models=tuple(served_model(e, Path("artifact")) for e in entries))
            found = validate_repository(repository, runtime, local_frameworks=frameworks.local_frameworks())
            for key, messages in found.items():
                model_name, _, field = key.partition(".")
                prefix = f"models[{index_of[model_name]}]" if model_name in index_of else "models"
                errors.setdefault(f"{prefix}.{field}" if field else prefix, []).extend(messages)
        if errors:
            raise serializers.ValidationError(errors)
        attrs["spec"] = {"runtime": runtime, "replicas": attrs.get("replicas", 1),
                         "resources": dict(attrs.get("resources") or {}), "models": entries}
        if attrs.get("autoscaling"):
            attrs["spec"]["autoscaling"] = dict(attrs["autoscaling"])
        attrs["versions"] = versions
        return attrs


def _resolve_version(team: Team, item: dict[str, Any], errors: dict[str, list[str]], where: str) -> ModelVersion | None:
    versions = ModelVersion.objects.select_related("model").filter(model__team=team, model__name=item["model"])
    if "version" in item:
        version = versions.filter(number=item["version"]).first()
        if version is None:
            errors.setdefault(f"{where}.version", []).append(f"model {item['model']!r} has no version {item['version']}")
            return None
        if version.status != ModelVersion.Status.READY:
            detail = f": {version.error}" if version.error else ""
            errors.setdefault(f"{where}.version", []).append(
                f"version {version.number} of {item['model']!r} is {version.status}, not ready{detail}")
            return None
        return version
    version = versions.filter(status=ModelVersion.Status.READY).order_by("-number").first()
    if version is None:
        message = (f"model {item['model']!r} has no ready version yet" if versions.exists()
                   else f"no model named {item['model']!r} in your team")
        errors.setdefault(f"{where}.model", []).append(message)
    return version


def _models_to_serve(team: Team, items: list[dict[str, Any]],
                     errors: dict[str, list[str]]) -> list[tuple[int, dict[str, Any], ModelVersion]]:
    """(index of the listed item, serving options, version) of each model to serve: the listed ones, and the step
    models of listed pipelines. A step model not listed is added with its defaults; a listed one keeps its own
    options and serves the version the pipeline names. Python steps get no dynamic batching unless asked for."""
    listed = []
    for index, item in enumerate(items):
        version = _resolve_version(team, item, errors, f"models[{index}]")
        if version is not None:
            listed.append((index, item, version))
    needed: dict[str, tuple[int, str, int]] = {}  # step model -> (version, pipeline, the pipeline's index)
    for index, _, version in listed:
        if version.format != Format.ENSEMBLE:
            continue
        for model, number in step_references(version.definition):
            first = needed.setdefault(model, (number, version.model.name, index))
            if first[0] != number:
                errors.setdefault(f"models[{index}]", []).append(
                    f"pipeline {version.model.name!r} uses version {number} of {model!r} but pipeline {first[1]!r} "
                    f"uses version {first[0]}: a deployment serves one version of each model")
    served = []
    for index, item, version in listed:
        options = dict(item)
        need = needed.get(version.model.name)
        if need is not None:
            number, pipeline, _ = need
            if version.number != number:
                if "version" in item:
                    errors.setdefault(f"models[{index}].version", []).append(
                        f"pipeline {pipeline!r} uses version {number} of {version.model.name!r}, not "
                        f"{version.number}: list it without a version, or with version {number}")
                    continue
                version = _resolve_version(team, {"model": version.model.name, "version": number}, errors,
                                           f"models[{index}]")
                if version is None:
                    continue
            if version.format == Format.PYTHON and "dynamic_batching" not in item:
                options["dynamic_batching"] = None
        served.append((index, options, version))
    listed_names = {version.model.name for _, _, version in listed}
    for model, (number, _, index) in needed.items():
        if model in listed_names:
            continue
        version = _resolve_version(team, {"model": model, "version": number}, errors, f"models[{index}]")
        if version is not None:
            options = {"model": model, "version": number}
            if version.format == Format.PYTHON:
                options["dynamic_batching"] = None
            served.append((index, options, version))
    return served


def _fit_pipeline_batches(entries: list[dict[str, Any]], options: list[dict[str, Any]]) -> None:
    """A pipeline not given a max_batch_size of its own batches no more than its steps are served with."""
    by_name = {entry["name"]: entry for entry in entries}
    for entry, given in zip(entries, options, strict=True):
        if entry["format"] != Format.ENSEMBLE or "max_batch_size" in given:
            continue
        steps = [by_name[m]["max_batch_size"] for m, _ in step_references(entry["definition"]) if m in by_name]
        if steps and all(size > 0 for size in steps):
            entry["max_batch_size"] = min([entry["max_batch_size"], *steps])


def _check_requirements(served: list[tuple[int, dict[str, Any], ModelVersion]], errors: dict[str, list[str]]) -> None:
    """The local runtime installs nothing: a python model's requirements must be importable in its runtime env."""
    for index, _, version in served:
        try:
            missing = local_runtime.missing_requirements(version.requirements)
        except python_requirements.CheckFailed as exc:
            errors.setdefault(f"models[{index}].requirements", []).append(
                f"could not check the requirements of model {version.model.name!r}: {exc}")
            continue
        if missing:
            modules = ", ".join(f"{r.module} (requirement {r.line!r})" for r in missing)
            errors.setdefault(f"models[{index}].requirements", []).append(
                f"model {version.model.name!r} version {version.number} needs Python module(s) that the local "
                f"runtime env cannot import: {modules}. Install them into the runtime env "
                f"({settings.MODELPORT_RUNTIME_ENV}), or deploy to Kubernetes with a Triton image that has them.")


OPERATOR_ONLY_EGRESS = ("only an operator can let a deployment open outgoing connections, in the admin console "
                        "(Deployments > allow egress)")


class DeploymentSerializer(serializers.ModelSerializer[Deployment]):
    revision = serializers.IntegerField(source="revision.number", default=None)
    serving_revision = serializers.IntegerField(source="serving_revision.number", default=None)
    models = serializers.SerializerMethodField()
    replicas = serializers.SerializerMethodField()
    resources = serializers.SerializerMethodField()
    autoscaling = serializers.SerializerMethodField()
    sandboxed = serializers.SerializerMethodField(help_text=(
        "Local runtime: whether its running Triton is sandboxed (null when none runs, or on Kubernetes)."))
    created_by = serializers.CharField(source="created_by.username", default=None)

    class Meta:
        model = Deployment
        fields = ["name", "runtime", "desired_state", "status", "status_message", "revision", "serving_revision",
                  "endpoint", "models", "replicas", "resources", "autoscaling", "allow_egress", "sandboxed",
                  "created_by", "created_at", "updated_at"]
        read_only_fields = fields

    def _spec(self, obj: Deployment) -> dict[str, Any]:
        return obj.revision.spec if obj.revision else {}

    def get_models(self, obj: Deployment) -> list[dict[str, Any]]:
        keys = ["model", "version", "format", "max_batch_size", "dynamic_batching", "instance_group", "response_cache", "warmup"]
        return [{k: m.get(k) for k in keys} for m in self._spec(obj).get("models", [])]

    def get_replicas(self, obj: Deployment) -> int:
        return int(self._spec(obj).get("replicas", 1))

    def get_resources(self, obj: Deployment) -> dict[str, Any]:
        return dict(self._spec(obj).get("resources", {}))

    def get_autoscaling(self, obj: Deployment) -> dict[str, Any] | None:
        return self._spec(obj).get("autoscaling")

    def get_sandboxed(self, obj: Deployment) -> bool | None:
        if obj.runtime != Deployment.Runtime.LOCAL:
            return None
        live = getattr(obj, "live_servers", None)  # prefetched by the views (LIVE_SERVERS)
        if live is None:
            sandboxed: bool | None = local_runtime.isolation(obj)["sandboxed"]
            return sandboxed
        return live[0].sandboxed if live else None


# The running servers of each deployment, newest first, in one query for a whole list.
LIVE_SERVERS = Prefetch("servers", to_attr="live_servers", queryset=TritonServer.objects.filter(
    state__in=[TritonServer.State.STARTING, TritonServer.State.READY]).order_by("-started_at"))


class EventSerializer(serializers.ModelSerializer[Event]):
    class Meta:
        model = Event
        fields = ["time", "kind", "message"]


def get_deployment_for_user(request: Request, name: str) -> Deployment:
    deployment = (Deployment.objects.select_related("revision", "serving_revision", "created_by")
                  .prefetch_related(LIVE_SERVERS)
                  .filter(team=current_team(request), name=name)
                  .exclude(desired_state=Deployment.Desired.DELETED).first())
    if deployment is None:
        raise Http404
    return deployment


@extend_schema(request=DeploymentInputSerializer, responses=DeploymentSerializer(many=True))
@api_view(["GET", "POST"])
@idempotent
def deployments_list(request: Request) -> Response:
    team = current_team(request)
    if request.method == "POST":
        serializer = DeploymentInputSerializer(data=request.data, context={"team": team})
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        deployment = actions.create_deployment(team, request.user, data["name"], data["runtime"], data["spec"],  # type: ignore[arg-type]
                                               data["versions"])
        return Response(DeploymentSerializer(get_deployment_for_user(request, deployment.name)).data, status=status.HTTP_201_CREATED)
    deployments = (Deployment.objects.filter(team=team).exclude(desired_state=Deployment.Desired.DELETED)
                   .select_related("revision", "serving_revision", "created_by").prefetch_related(LIVE_SERVERS))
    return Response(DeploymentSerializer(deployments, many=True).data)


@extend_schema(request=DeploymentInputSerializer, responses=DeploymentSerializer)
@api_view(["GET", "PATCH", "DELETE"])
def deployment_detail(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    if request.method == "PATCH":
        body = request_object(request)
        current = deployment.revision.spec if deployment.revision else {}
        if "allow_egress" in body:
            raise serializers.ValidationError({"allow_egress": [OPERATOR_ONLY_EGRESS]})
        if "name" in body and body["name"] != deployment.name or (
                "runtime" in body and body["runtime"] != deployment.runtime):
            raise serializers.ValidationError("The name and runtime of a deployment cannot change: create a new deployment.")
        serializer = DeploymentInputSerializer(data=_patched(deployment, current, body), context={"team": deployment.team})
        serializer.is_valid(raise_exception=True)
        spec = serializer.validated_data["spec"]
        # A PATCH that changes nothing ({}, an empty body, the current values) makes no revision and rolls nothing.
        if not _changes_nothing(deployment, current, spec):
            actions.update_deployment(deployment, request.user, spec, serializer.validated_data["versions"])
        return Response(DeploymentSerializer(get_deployment_for_user(request, name)).data)
    if request.method == "DELETE":
        gone = actions.delete_deployment(deployment, request.user)
        return Response(status=status.HTTP_204_NO_CONTENT if gone else status.HTTP_202_ACCEPTED)
    return Response(DeploymentSerializer(deployment).data)


def _patched(deployment: Deployment, current: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The API input for the current revision's settings with what `body` changes."""
    return {
        "name": deployment.name,
        "runtime": deployment.runtime,
        "replicas": body.get("replicas", current.get("replicas", 1)),
        "resources": body.get("resources", current.get("resources", {})),
        "autoscaling": body.get("autoscaling", current.get("autoscaling")),
        "models": body.get("models", [_settings_of(m) for m in current.get("models", [])]),
    }


def _as_stored(spec: dict[str, Any]) -> Any:
    return json.loads(json.dumps(spec))  # as the JSONField gives it back (tuples are lists)


def _changes_nothing(deployment: Deployment, current: dict[str, Any], spec: dict[str, Any]) -> bool:
    """Is `spec` the current revision's? Compared with the stored spec, and with the current settings validated again
    (a spec written with defaults left out, e.g. resources {} for {"gpu": 0}, is the same spec)."""
    if deployment.revision is None:
        return False
    new = _as_stored(spec)
    if new == current:
        return True
    again = DeploymentInputSerializer(data=_patched(deployment, current, {}), context={"team": deployment.team})
    return again.is_valid() and _as_stored(again.validated_data["spec"]) == new


def _settings_of(entry: dict[str, Any]) -> dict[str, Any]:
    """A snapshot entry as API input (used when a PATCH leaves the models as they are)."""
    keys = ["model", "version", "max_batch_size", "dynamic_batching", "instance_group", "response_cache", "warmup"]
    return {k: entry[k] for k in keys if k in entry and entry[k] is not None or k == "dynamic_batching"}


@extend_schema(request=None, responses=DeploymentSerializer)
@api_view(["POST"])
def deployment_stop(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    actions.stop_deployment(deployment, request.user)
    return Response(DeploymentSerializer(get_deployment_for_user(request, name)).data, status=status.HTTP_202_ACCEPTED)


@extend_schema(request=None, responses=DeploymentSerializer)
@api_view(["POST"])
def deployment_start(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    actions.start_deployment(deployment, request.user)
    return Response(DeploymentSerializer(get_deployment_for_user(request, name)).data, status=status.HTTP_202_ACCEPTED)


@extend_schema(responses=EventSerializer(many=True))
@api_view(["GET"])
def deployment_events(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    return Response(EventSerializer(deployment.events.all()[:200], many=True).data)


@extend_schema(responses={200: {"type": "object", "properties": {"log": {"type": "string"}}}})
@api_view(["GET"])
def deployment_logs(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    try:
        lines = max(1, min(int(request.query_params.get("lines", 200)), 5000))
    except ValueError:
        raise serializers.ValidationError({"lines": ["must be an integer"]}) from None
    return Response({"log": runtime_for(deployment).logs(deployment, lines)})

