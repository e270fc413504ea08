"""REST API for deployments: /api/v1/deployments/..."""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
)
from rest_framework import serializers, status
from rest_framework.decorators import api_view, parser_classes
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.context import current_team
from accounts.idempotency import idempotent
from accounts.models import Team
from deployments import actions, canary, log_revision, planning
from deployments.ceilings import MAX_GPUS, MAX_REPLICAS
from deployments.model_entry import DEFAULT
from deployments.models import Deployment, Event, PoolLoad
from deployments.planning import MAX_IDLE_UNLOAD_SECONDS
from deployments.queries import LIVE_SERVERS, POOL_LOADS, get_deployment_for_user
from deployments.revision_spec import Autoscaling, ModelEntry, Resources, RevisionSpec
from deployments.runtimes.registry import runtime_for
from deployments.server_memory import in_effect as memory_in_effect
from deployments.spec import (
    MAX_INSTANCE_COUNT,
    MAX_QUEUE_DELAY_MICROSECONDS,
    MAX_WARMUP_COUNT,
    WARMUP_DATA,
    DynamicBatching,
    InstanceGroup,
    Warmup,
)
from infra.api_errors import request_object
from infra.api_schema import (
    IDEMPOTENCY_ERRORS,
    IDEMPOTENCY_KEY,
    JSON_PARSERS,
    ExactJSONTypes,
    NameField,
    error,
    takes_no_body,
)
from modelport.core import quantity
from models_registry.models import Format

OPERATOR_ONLY_EGRESS = ("only an operator can let a deployment open outgoing connections, in the admin console "
                        "(Deployments > allow egress)")


class DynamicBatchingSerializer(serializers.Serializer[Any]):
    max_queue_delay_microseconds = serializers.IntegerField(min_value=0, max_value=MAX_QUEUE_DELAY_MICROSECONDS,
                                                            default=0)
    preferred_batch_size = serializers.ListField(child=serializers.IntegerField(min_value=1), default=list,
                                                 max_length=32)
    preserve_ordering = serializers.BooleanField(default=False)


class InstanceGroupSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField(min_value=1, max_value=MAX_INSTANCE_COUNT, default=1)
    kind = serializers.ChoiceField(choices=["cpu", "gpu"], default="cpu")
    gpus = serializers.ListField(child=serializers.IntegerField(min_value=0), default=list, max_length=64)


class WarmupSerializer(serializers.Serializer[Any]):
    """Triton's warm-up of a model (deployments.spec.Warmup); a key it does not know is refused (ExactJSONTypes at
    the top of the body), not dropped."""

    batch_size = serializers.IntegerField(min_value=1, max_value=1_000_000, default=1, help_text=(
        "The batch size of each warm-up request, at most the model's max_batch_size (1 when it does not batch)."))
    count = serializers.IntegerField(min_value=1, max_value=MAX_WARMUP_COUNT, default=1,
                                     help_text="How many warm-up requests Triton sends before the model serves.")
    # DRF's metaclass takes declared fields off the class, so this does not hide Serializer.data; mypy cannot know.
    data = serializers.ChoiceField(choices=list(WARMUP_DATA), default="zero",  # type: ignore[assignment]
                                   help_text="Zeros or random values (text inputs always get zeros).")


class ServedModelSerializer(serializers.Serializer[Any]):
    model = serializers.CharField()
    version = serializers.IntegerField(min_value=1, required=False, help_text="Default: the latest ready version.")
    max_batch_size = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False)
    dynamic_batching = DynamicBatchingSerializer(required=False, allow_null=True)
    instance_group = InstanceGroupSerializer(required=False)
    response_cache = serializers.BooleanField(required=False, default=False)
    warmup = WarmupSerializer(required=False, allow_null=True, help_text="Warm-up before serving; null: none.")


class ResourcesSerializer(serializers.Serializer[Any]):
    cpu = serializers.CharField(required=False, allow_blank=True, max_length=quantity.MAX_LENGTH, help_text=(
        'Cores per replica, a Kubernetes quantity from "1m" to "1024", e.g. "2" or "500m". Empty: the default.'))
    memory = serializers.CharField(required=False, allow_blank=True, max_length=quantity.MAX_LENGTH, help_text=(
        'Memory per replica, a Kubernetes quantity from "1Mi" to "16Ti", e.g. "4Gi". Empty: the default.'))
    gpu = serializers.IntegerField(min_value=0, max_value=MAX_GPUS, required=False, default=0)
    gpu_type = serializers.CharField(required=False, allow_blank=True)
    mig_profile = serializers.RegexField(r"^\d+g\.\d+gb$", required=False, allow_blank=True,
                                         help_text='A MIG profile such as "1g.10gb".')


class AutoscalingSerializer(serializers.Serializer[Any]):
    min_replicas = serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS, help_text=(
        "0: scaled to zero while unused, the first request held while a pod starts (a dedicated cluster "
        "deployment where the operator autoscales with KEDA, KUBERNETES_AUTOSCALING=keda)."))
    max_replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS)
    metric = serializers.ChoiceField(choices=["cpu", "queue_time"], default="cpu")
    target = serializers.IntegerField(min_value=1, max_value=1_000_000_000, help_text=(
        "cpu: average CPU utilization in percent of the request; queue_time: Triton's average queue time per "
        "request in microseconds."))


class PlacementSerializer(ExactJSONTypes, serializers.Serializer[Any]):
    mode = serializers.ChoiceField(choices=["dedicated", "shared"], required=False, help_text=(
        "dedicated: a Triton of its own (the default unless the operator changed it). shared: loaded on demand "
        "into a pool's Triton beside other deployments' models (ONNX only in a pool open to every team)."))
    pool = serializers.CharField(required=False, max_length=63, help_text=(
        "shared: the pool (GET /api/v1/pools/); default: the pool named 'shared'."))
    idle_unload_seconds = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_IDLE_UNLOAD_SECONDS, help_text=(
            "shared: unloaded after this long unused, loaded again by the next request; default: the pool's; 0: "
            "never."))


class DeploymentInputSerializer(ExactJSONTypes, serializers.Serializer[Any]):
    """The API's input, parsed and bounded; what it asks for is checked by deployments.planning."""

    refused_fields: ClassVar[dict[str, str]] = {"allow_egress": OPERATOR_ONLY_EGRESS}
    name = NameField(help_text="Becomes the endpoint /serve/{name} and Kubernetes object names.")
    runtime = serializers.ChoiceField(choices=Deployment.Runtime.choices, default=Deployment.Runtime.LOCAL)
    models = ServedModelSerializer(many=True, allow_empty=False)
    replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS, default=1)
    resources = ResourcesSerializer(required=False, default=dict)
    autoscaling = AutoscalingSerializer(required=False, allow_null=True, help_text="Kubernetes only: an HPA.")
    placement = PlacementSerializer(required=False, help_text="Where its models run: dedicated, or shared in a pool.")

    def deploy_request(self) -> planning.DeployRequest:
        data = self.validated_data
        autoscaling = data.get("autoscaling")
        placement = data.get("placement") or {}
        return planning.DeployRequest(
            placement=planning.PlacementRequest(mode=placement.get("mode"), pool=placement.get("pool"),
                                                idle_unload_seconds=placement.get("idle_unload_seconds")),
            runtime=data["runtime"], replicas=data["replicas"],
            resources=Resources.from_json(data.get("resources") or {}),
            autoscaling=Autoscaling.from_json(autoscaling) if autoscaling else None,
            models=tuple(_asked_entry(item) for item in data["models"]),
        )


def _asked_entry(item: dict[str, Any]) -> ModelEntry:
    """A parsed item of "models": what is absent is left to the model's default (None batching means off)."""
    batching = item.get("dynamic_batching", DEFAULT)
    group = item.get("instance_group")
    return ModelEntry.asked(
        item["model"], version=item.get("version"), max_batch_size=item.get("max_batch_size"),
        dynamic_batching=DynamicBatching(
            max_queue_delay_microseconds=batching["max_queue_delay_microseconds"],
            preferred_batch_size=tuple(batching["preferred_batch_size"]),
            preserve_ordering=batching["preserve_ordering"],
        ) if isinstance(batching, dict) else batching,
        instance_group=InstanceGroup(count=group["count"], kind=group["kind"], gpus=tuple(group["gpus"]))
        if group is not None else None,
        response_cache=item.get("response_cache", False),
        warmup=Warmup.from_json(item["warmup"]) if item.get("warmup") is not None else None,
    )


def plan_input(team: Team, serializer: DeploymentInputSerializer, deployment: Deployment | None = None,
               canary: bool = False) -> planning.Plan:
    """Plan a valid input (a change of `deployment`, a canary of it); the planner's errors become a 400 keyed by
    the input's fields."""
    try:
        return planning.plan(team, serializer.deploy_request(), deployment=deployment, canary=canary)
    except planning.PlanError as exc:
        raise serializers.ValidationError(exc.errors) from None



class RolloutSerializer(ExactJSONTypes, serializers.Serializer[Any]):
    """How a PATCH's new revision rolls out: at once (the default), or as a canary beside the serving revision."""

    strategy = serializers.ChoiceField(choices=["atomic", "canary"], help_text=(
        "atomic: the new revision takes every request once ready (the default). canary: it takes `percent` of "
        "them beside the serving revision until promoted or rolled back."))
    percent = serializers.IntegerField(min_value=1, max_value=99, required=False,
                                       help_text="canary: the share of requests it answers (required).")
    max_error_rate = serializers.FloatField(min_value=0.0, max_value=1.0, default=canary.DEFAULT_MAX_ERROR_RATE,
                                            help_text="canary: rolled back past this share of 5xx/429 answers "
                                                      "over the window (0.05 = 5%).")
    max_p99_ratio = serializers.FloatField(min_value=1.0, max_value=1000.0, default=canary.DEFAULT_MAX_P99_RATIO,
                                           help_text="canary: rolled back when its p99 latency is over this "
                                                     f"multiple of the stable revision's (and {canary.P99_SLACK_MS:g} "
                                                     "ms more).")
    window_seconds = serializers.IntegerField(min_value=canary.MIN_WINDOW_SECONDS, max_value=canary.MAX_WINDOW_SECONDS,
                                              default=canary.DEFAULT_WINDOW_SECONDS,
                                              help_text="canary: the window its guardrails look at.")
    min_requests = serializers.IntegerField(min_value=1, max_value=1_000_000, default=canary.DEFAULT_MIN_REQUESTS,
                                            help_text="canary: no verdict on fewer requests in the window.")
    auto_promote = serializers.BooleanField(default=False, help_text=(
        "canary: promote it after a clean window (enough requests, within its guardrails)."))

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["strategy"] == "canary" and "percent" not in attrs:
            raise serializers.ValidationError({"percent": ["a canary needs the share of requests it takes, "
                                                           "1 to 99"]})
        return attrs

    def rollout(self) -> canary.Rollout | None:
        data = self.validated_data
        if data["strategy"] != "canary":
            return None
        return canary.Rollout(percent=data["percent"], max_error_rate=data["max_error_rate"],
                              max_p99_ratio=data["max_p99_ratio"], window_seconds=data["window_seconds"],
                              min_requests=data["min_requests"], auto_promote=data["auto_promote"])


class DeploymentUpdateSerializer(ExactJSONTypes, serializers.Serializer[Any]):
    """A PATCH's body: the fields given replace the current revision's; the name and the runtime cannot change."""

    refused_fields: ClassVar[dict[str, str]] = {"allow_egress": OPERATOR_ONLY_EGRESS}
    # Allowed so that a client may send back what it read or created with (the CLI sends its --runtime, so that a
    # change is refused with the message below); a different value is refused.
    name = NameField(required=False, help_text="The deployment's name, if given: it cannot change.")
    runtime = serializers.ChoiceField(choices=Deployment.Runtime.choices, required=False,
                                      help_text="The deployment's runtime, if given: it cannot change.")
    models = ServedModelSerializer(many=True, allow_empty=False, required=False)
    replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS, required=False)
    resources = ResourcesSerializer(required=False)
    autoscaling = AutoscalingSerializer(required=False, allow_null=True, help_text="Kubernetes only: an HPA.")
    placement = PlacementSerializer(required=False, help_text="Where its models run: dedicated, or shared in a pool.")
    rollout = RolloutSerializer(required=False, help_text=(
        'How the change rolls out; default {"strategy": "atomic"}. A canary needs a running, ready deployment '
        "(local runtime) and no canary in progress."))


class CanarySerializer(serializers.Serializer[Any]):
    """A canary in progress (for the schema)."""

    revision = serializers.IntegerField()
    percent = serializers.IntegerField()
    state = serializers.ChoiceField(choices=["starting", "serving"])
    serving_since = serializers.DateTimeField(allow_null=True)
    max_error_rate = serializers.FloatField()
    max_p99_ratio = serializers.FloatField()
    window_seconds = serializers.IntegerField()
    min_requests = serializers.IntegerField()
    auto_promote = serializers.BooleanField()


def canary_of(deployment: Deployment) -> dict[str, Any] | None:
    revision = deployment.canary_revision
    if revision is None:
        return None
    return {"revision": revision.number, "percent": deployment.canary_percent,
            "state": "serving" if deployment.canary_upstream_url else "starting",
            "serving_since": deployment.canary_serving_since,
            "max_error_rate": deployment.canary_max_error_rate, "max_p99_ratio": deployment.canary_max_p99_ratio,
            "window_seconds": deployment.canary_window_seconds, "min_requests": deployment.canary_min_requests,
            "auto_promote": deployment.canary_auto_promote}


class ServedModelOutSerializer(serializers.Serializer[Any]):
    """A served model with every setting in effect, defaults filled in (for the schema)."""

    model = serializers.CharField()
    version = serializers.IntegerField()
    format = serializers.ChoiceField(choices=Format.choices)
    max_batch_size = serializers.IntegerField()
    dynamic_batching = DynamicBatchingSerializer(allow_null=True)
    instance_group = InstanceGroupSerializer()
    response_cache = serializers.BooleanField()
    warmup = WarmupSerializer(allow_null=True)
    loaded = serializers.BooleanField(help_text=(
        "Whether it is loaded now: a dedicated deployment's while its Triton serves; a shared one's while its pool "
        "holds it (false while idle-unloaded: its next request loads it)."))


class PlacementOutSerializer(serializers.Serializer[Any]):
    mode = serializers.ChoiceField(choices=["dedicated", "shared"])
    pool = serializers.CharField(required=False, help_text="shared only.")
    idle_unload_seconds = serializers.IntegerField(required=False, help_text="shared only; 0: never unloaded.")
    state = serializers.ChoiceField(choices=["loading", "loaded", "unloaded", "failed"], required=False,
                                    help_text="shared only: the serving revision's models in the pool.")
    cold_start_seconds = serializers.FloatField(required=False, allow_null=True, help_text=(
        "shared only: how long its last load took (measured)."))
    memory_bytes = serializers.IntegerField(required=False, help_text="shared only: what its last load took.")


class ResourcesOutSerializer(serializers.Serializer[Any]):
    cpu = serializers.CharField(required=False, help_text="Absent: the default.")
    memory = serializers.CharField(required=False, help_text="Absent: the default.")
    gpu = serializers.IntegerField(required=False)
    gpu_type = serializers.CharField(required=False)
    mig_profile = serializers.CharField(required=False)


class MemoryOutSerializer(serializers.Serializer[Any]):
    limit = serializers.CharField(allow_null=True, help_text=(
        'Each server\'s memory limit, a quantity ("384Mi"); null: none (Kubernetes: its default when absent).'))
    source = serializers.ChoiceField(choices=["given", "derived", "default"], help_text=(  # type: ignore[assignment]
        "given: resources.memory as asked. derived: a local dedicated deployment's, from what its models were "
        "measured to take (each version's measured_memory_bytes). default: the runtime's default."))
    basis = serializers.CharField(help_text=(
        "How the limit was reached when the revision was planned (\"\" when it was given), and, where its models were "
        "measured since, what a new revision would take and how to ask for it."))
    derived_now = serializers.CharField(allow_null=True, help_text=(
        "The limit a revision planned now would derive from what its models were measured to take since this one "
        "was planned, where that differs from `limit` (give it as resources.memory to take it); null otherwise."))


class DeploymentSerializer(serializers.ModelSerializer[Deployment]):
    revision = serializers.IntegerField(source="revision.number", default=None, allow_null=True, read_only=True,
                                        help_text="The revision asked for last.")
    serving_revision = serializers.IntegerField(source="serving_revision.number", default=None, allow_null=True,
                                                read_only=True,
                                                help_text="The revision the gateway routes to "
                                                          "(null until one is ready).")
    models = serializers.SerializerMethodField()
    replicas = serializers.SerializerMethodField()
    resources = serializers.SerializerMethodField()
    memory = serializers.SerializerMethodField(help_text=(
        "The memory limit its servers run under and how it was chosen (null for a shared deployment, whose "
        "models run within their pool's budget)."))
    autoscaling = serializers.SerializerMethodField()
    canary = serializers.SerializerMethodField(help_text="The canary in progress, if any (null: none).")
    placement = serializers.SerializerMethodField()
    sandboxed = serializers.SerializerMethodField(help_text=(
        "Local runtime: whether its running Triton is sandboxed (null when none runs, or on Kubernetes)."))
    created_by = serializers.CharField(source="created_by.username", default=None, allow_null=True, read_only=True)
    endpoint = serializers.CharField(read_only=True, help_text="Where the gateway serves it: /serve/{name}.")

    class Meta:
        model = Deployment
        fields = ["name", "runtime", "desired_state", "status", "status_message", "revision", "serving_revision",
                  "endpoint", "models", "replicas", "resources", "memory", "autoscaling", "canary", "placement",
                  "allow_egress",
                  "sandboxed",
                  "created_by", "created_at", "updated_at"]
        read_only_fields = fields

    def _spec(self, obj: Deployment) -> RevisionSpec | None:
        return obj.revision.spec if obj.revision else None

    @extend_schema_field(ServedModelOutSerializer(many=True))
    def get_models(self, obj: Deployment) -> list[dict[str, Any]]:
        keys = ["model", "version", "format", "max_batch_size", "dynamic_batching", "instance_group", "response_cache",
                "warmup"]
        spec = self._spec(obj)
        loaded = self._loaded(obj, spec)
        return [{**{k: entry[k] for k in keys}, "loaded": loaded}
                for entry in (m.to_json() for m in (spec.models if spec else ()))]

    def _load(self, obj: Deployment) -> PoolLoad | None:
        revision_id = obj.serving_revision_id or obj.revision_id
        loads = getattr(obj, "loads", None)  # prefetched by the views (POOL_LOADS)
        if loads is None:
            loads = list(PoolLoad.objects.filter(deployment=obj))
        return next((load for load in loads if load.revision_id == revision_id), None)

    def _loaded(self, obj: Deployment, spec: RevisionSpec | None) -> bool:
        running = obj.desired_state == Deployment.Desired.RUNNING
        if spec is None or not spec.placement.shared:
            return running and bool(obj.upstream_url)
        load = self._load(obj)
        return running and load is not None and load.state == PoolLoad.State.LOADED

    @extend_schema_field(PlacementOutSerializer)
    def get_placement(self, obj: Deployment) -> dict[str, Any]:
        spec = self._spec(obj)
        if spec is None or not spec.placement.shared:
            return {"mode": "dedicated"}
        data: dict[str, Any] = spec.placement.to_json()
        load = self._load(obj)
        if load is not None:
            data.update(state=load.state, cold_start_seconds=load.cold_start_seconds, memory_bytes=load.memory_bytes)
        return data

    def get_replicas(self, obj: Deployment) -> int:
        spec = self._spec(obj)
        return spec.replicas if spec else 1

    @extend_schema_field(ResourcesOutSerializer)
    def get_resources(self, obj: Deployment) -> dict[str, Any]:
        spec = self._spec(obj)
        return spec.resources.to_json() if spec else {}

    @extend_schema_field(MemoryOutSerializer(allow_null=True))
    def get_memory(self, obj: Deployment) -> dict[str, Any] | None:
        spec = self._spec(obj)
        if spec is None or spec.placement.shared:
            return None
        assert obj.revision is not None  # a spec comes from it
        return memory_in_effect(spec, obj.revision.versions.all(), obj.name)

    @extend_schema_field(AutoscalingSerializer(allow_null=True))
    def get_autoscaling(self, obj: Deployment) -> dict[str, Any] | None:
        spec = self._spec(obj)
        return spec.autoscaling.to_json() if spec and spec.autoscaling else None

    @extend_schema_field(CanarySerializer(allow_null=True))
    def get_canary(self, obj: Deployment) -> dict[str, Any] | None:
        data = canary_of(obj)
        if data is not None and data["serving_since"] is not None:
            data["serving_since"] = serializers.DateTimeField().to_representation(data["serving_since"])
        return data

    def get_sandboxed(self, obj: Deployment) -> bool | None:
        # None where its runtime sandboxes nothing of its own (a cluster's pods), or no server runs.
        live = getattr(obj, "live_servers", None)  # the local servers, prefetched by the views (LIVE_SERVERS)
        if live is None:
            isolation = runtime_for(obj).isolation(obj)
            sandboxed: bool | None = isolation["sandboxed"] if isolation is not None else None
            return sandboxed
        return live[0].sandboxed if live else None


class EventSerializer(serializers.ModelSerializer[Event]):
    class Meta:
        model = Event
        fields = ["time", "kind", "message"]
        read_only_fields = fields


@extend_schema(methods=["GET"], summary="List your team's deployments",
               responses={200: DeploymentSerializer(many=True)})
@extend_schema(methods=["POST"], summary="Deploy models on Triton", request=DeploymentInputSerializer,
               parameters=[IDEMPOTENCY_KEY],
               examples=[OpenApiExample("A model with batching", request_only=True, value={
                   "name": "digits-prod", "models": [{"model": "digits",
                                                      "dynamic_batching": {"max_queue_delay_microseconds": 2000}}]})],
               responses={
                   201: DeploymentSerializer, **IDEMPOTENCY_ERRORS,
                   400: error("Not a valid deployment: 'fields' says which field and why (a model that does not "
                              "exist or is not ready, settings the model or the runtime cannot take)."),
                   409: error("A deployment of that name exists in your team, or a request with this "
                              "Idempotency-Key is still running."),
               })
@api_view(["GET", "POST"])
@parser_classes(JSON_PARSERS)
@idempotent
def deployments_list(request: Request) -> Response:
    team = current_team(request)
    if request.method == "POST":
        serializer = DeploymentInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        plan = plan_input(team, serializer)  # type: ignore[arg-type]
        deployment = actions.create_deployment(team, request.user, serializer.validated_data["name"], plan)  # type: ignore[arg-type]
        return Response(DeploymentSerializer(get_deployment_for_user(request, deployment.name)).data,
                        status=status.HTTP_201_CREATED)
    deployments = (Deployment.objects.filter(team=team).exclude(desired_state=Deployment.Desired.DELETED)
                   .select_related("revision", "serving_revision", "canary_revision", "created_by")
                   .prefetch_related(LIVE_SERVERS, POOL_LOADS, "revision__versions"))
    return Response(DeploymentSerializer(deployments, many=True).data)


@extend_schema(methods=["GET"], summary="A deployment", responses={200: DeploymentSerializer})
@extend_schema(methods=["PATCH"], summary="Change a deployment: a new revision, rolled out",
               request=DeploymentUpdateSerializer, examples=[OpenApiExample(
                   "Bigger batches", request_only=True, value={"models": [{"model": "digits", "max_batch_size": 32}]})],
               responses={
                   200: DeploymentSerializer,
                   400: error("Not a valid change: 'fields' says which field and why; the name and the runtime "
                              "cannot change; a canary needs a change."),
                   409: error("A canary is in progress (promote it or roll it back first), or a canary was asked "
                              "for a deployment that is not running and ready, or on Kubernetes."),
               })
@extend_schema(methods=["DELETE"], summary="Delete a deployment", responses={
    202: OpenApiResponse(description="It no longer serves and is gone from the API already; a worker stops its "
                                     "servers and removes what they left."),
})
@api_view(["GET", "PATCH", "DELETE"])
@parser_classes(JSON_PARSERS)
def deployment_detail(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    if request.method == "PATCH":
        body = request_object(request)
        current = deployment.revision.spec if deployment.revision else None
        # The body as given (its unknown fields, types, bounds and nested entries, named by their paths); the
        # revision it makes is checked below, as a creation's input.
        DeploymentUpdateSerializer(data=body).is_valid(raise_exception=True)
        if "name" in body and body["name"] != deployment.name or (
                "runtime" in body and body["runtime"] != deployment.runtime):
            raise serializers.ValidationError("The name and runtime of a deployment cannot change: "
                                              "create a new deployment.")
        rollout: canary.Rollout | None = None
        if "rollout" in body:
            rollout_input = RolloutSerializer(data=body["rollout"])
            if not rollout_input.is_valid():
                raise serializers.ValidationError({"rollout": rollout_input.errors})
            rollout = rollout_input.rollout()
        serializer = DeploymentInputSerializer(data=_patched(deployment, current, body))
        serializer.is_valid(raise_exception=True)
        plan = plan_input(deployment.team, serializer, deployment, canary=rollout is not None)
        # A PATCH that changes nothing ({}, an empty body, the current values) makes no revision: the action says.
        actions.update_deployment(deployment, request.user, plan, canary=rollout)
        return Response(DeploymentSerializer(get_deployment_for_user(request, name)).data)
    if request.method == "DELETE":
        actions.delete_deployment(deployment, request.user)
        return Response(status=status.HTTP_202_ACCEPTED)  # the reconciler finishes it in a worker
    return Response(DeploymentSerializer(deployment).data)


def _patched(deployment: Deployment, current: RevisionSpec | None, body: dict[str, Any]) -> dict[str, Any]:
    """The API input for the current revision's settings with what `body` changes."""
    return {
        "name": deployment.name,
        "runtime": deployment.runtime,
        "replicas": body.get("replicas", current.replicas if current else 1),
        "resources": body.get("resources", current.resources.to_json() if current else {}),
        "autoscaling": body.get("autoscaling", current.autoscaling.to_json() if current and current.autoscaling
                                else None),
        "models": body.get("models", [_settings_of(m) for m in (current.models if current else ())]),
        "placement": _patched_placement(current, body["placement"]) if "placement" in body else (
            current.placement.to_json() if current else {}),
    }


def _patched_placement(current: RevisionSpec | None, given: Any) -> Any:
    """A PATCH's placement over the current one: {"idle_unload_seconds": 60} keeps the mode and the pool; a change
    of mode starts from that mode's defaults."""
    now = current.placement.to_json() if current else {}
    if not isinstance(given, dict) or given.get("mode", now.get("mode")) != now.get("mode"):
        return given  # the serializer says what is wrong with it, or it starts afresh
    return {**now, **given}


def _settings_of(entry: ModelEntry) -> dict[str, Any]:
    """A spec entry as API input (used when a PATCH leaves the models as they are)."""
    data = entry.to_json()
    keys = ["model", "version", "max_batch_size", "dynamic_batching", "instance_group", "response_cache", "warmup"]
    return {k: data[k] for k in keys if data.get(k) is not None or k == "dynamic_batching"}


@extend_schema(summary="Stop a deployment", request=None, responses={
    202: DeploymentSerializer, 409: error("The deployment is stopped already.")})
@api_view(["POST"])
@takes_no_body
def deployment_stop(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    actions.stop_deployment(deployment, request.user)
    return Response(DeploymentSerializer(get_deployment_for_user(request, name)).data, status=status.HTTP_202_ACCEPTED)


@extend_schema(summary="Start a stopped deployment, or retry a failed one", request=None, responses={
    202: DeploymentSerializer, 409: error("The deployment is running already.")})
@api_view(["POST"])
@takes_no_body
def deployment_start(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    actions.start_deployment(deployment, request.user)
    return Response(DeploymentSerializer(get_deployment_for_user(request, name)).data, status=status.HTTP_202_ACCEPTED)


@extend_schema(summary="Promote the canary: it serves every request, the old revision drains and stops",
               request=None, responses={
                   200: DeploymentSerializer,
                   409: error("There is no canary, or it is still starting."),
               })
@api_view(["POST"])
@takes_no_body
def deployment_promote(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    actions.promote_canary(deployment, request.user)
    return Response(DeploymentSerializer(get_deployment_for_user(request, name)).data)


@extend_schema(summary="Roll the canary back: the serving revision takes every request, the canary stops",
               request=None, responses={
                   200: DeploymentSerializer,
                   409: error("There is no canary."),
               })
@api_view(["POST"])
@takes_no_body
def deployment_rollback(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    actions.rollback_canary(deployment, request.user)
    return Response(DeploymentSerializer(get_deployment_for_user(request, name)).data)


@extend_schema(summary="A deployment's events, newest first (the last 200)",
               responses={200: EventSerializer(many=True)})
@api_view(["GET"])
def deployment_events(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    return Response(EventSerializer(deployment.events.all()[:200], many=True).data)


class LogSerializer(serializers.Serializer[Any]):
    log = serializers.CharField(help_text="The last lines of Triton's log: at most LOG_TAIL_MAX_BYTES (1 MiB) of it "
                                          "read from its end, each line cut at LOG_LINE_MAX_BYTES with a marker "
                                          "'… (N bytes cut)'.")
    revision = serializers.IntegerField(allow_null=True, help_text=(
        "The revision whose log this is (null: the deployment has no revision yet)."))
    revision_role = serializers.ChoiceField(choices=["serving", "canary", "starting", "retired"], help_text=(
        "What that revision is: serving (the stable one, the default), canary, starting (not serving yet) or "
        "retired (no longer serving)."))
    canary_revision = serializers.IntegerField(allow_null=True, help_text=(
        "The canary's revision while there is one (its log: ?revision=<it>), else null."))


class LogQuerySerializer(serializers.Serializer[Any]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Built here rather than in the class body, so the bound follows the settings (tests override them).
        most = settings.LOG_MAX_LINES
        self.fields["lines"] = serializers.IntegerField(
            required=False, default=200, min_value=1, max_value=most,
            help_text=f"How many lines, 1 to {most} (LOG_MAX_LINES); 200 if not given.",
            error_messages={"invalid": "must be an integer", "max_value": f"at most {most} lines: ask for fewer",
                            "min_value": "at least 1 line"})
        self.fields["revision"] = serializers.IntegerField(
            required=False, min_value=1, max_value=2**31 - 1,
            help_text="Whose log: the number of a revision of the deployment (its canary's, say); the serving "
                      "revision's if not given.",
            error_messages={"invalid": "must be an integer", "min_value": "a revision number is at least 1",
                            "max_value": "no such revision"})


@extend_schema(summary="The tail of a deployment's Triton log", parameters=[LogQuerySerializer],
               responses={200: LogSerializer})
@api_view(["GET"])
def deployment_logs(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    query = LogQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    lines = int(query.validated_data["lines"])
    try:
        choice = log_revision.choose(deployment, query.validated_data.get("revision"))
    except log_revision.UnknownRevision as exc:
        raise serializers.ValidationError({"revision": [str(exc)]}) from None
    log = runtime_for(deployment).logs(deployment, lines, choice.revision) if choice.revision else ""
    canary = deployment.canary_revision
    return Response({"log": log, "revision": choice.revision.number if choice.revision else None,
                     "revision_role": choice.role, "canary_revision": canary.number if canary else None})

