"""REST API for tunes: /api/v1/deployments/{name}/tune and /tunes/..."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.http import Http404
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import api_view, parser_classes
from rest_framework.request import Request
from rest_framework.response import Response

from deployments import planning
from deployments.api import RolloutSerializer
from deployments.examples import example_request, served_signature, with_data
from deployments.models import Deployment
from deployments.queries import get_deployment_for_user
from deployments.revision_spec import ModelEntry
from deployments.runtimes import registry
from gateway.protocol import Refusal, check_infer_request
from infra.api_schema import JSON_PARSERS, ExactJSONTypes, error, takes_no_body
from models_registry.models import ModelVersion
from tuning import actions
from tuning.models import TuneRun

MIN_BUDGET_SECONDS = 30
MAX_BUDGET_SECONDS = 3600
MAX_CONCURRENCY = 256
MIN_P99_MS = 0.001  # above 0: a target of 0 ms cannot be met
MAX_P99_MS = 60_000
MAX_REQUEST_BYTES = 1024 * 1024
RECORDED_NOT_SUPPORTED = ("recorded traffic is not supported yet (Modelport records no request bodies): use "
                          "'generated' (the Try-it example request) or 'request' (your own, in 'request')")


class TuneInputSerializer(ExactJSONTypes, serializers.Serializer[Any]):
    p99_ms = serializers.FloatField(min_value=MIN_P99_MS, max_value=MAX_P99_MS,
                                    help_text=f"The latency target: p99 in milliseconds, at least {MIN_P99_MS}.")
    budget_seconds = serializers.IntegerField(min_value=MIN_BUDGET_SECONDS, max_value=MAX_BUDGET_SECONDS, help_text=(
        f"How long the tune may measure, {MIN_BUDGET_SECONDS} s to {MAX_BUDGET_SECONDS} s; settings that would "
        "overrun are skipped and the result is marked partial."))
    concurrency_min = serializers.IntegerField(min_value=1, max_value=MAX_CONCURRENCY, default=1)
    concurrency_max = serializers.IntegerField(min_value=1, max_value=MAX_CONCURRENCY, default=16, help_text=(
        "Each setting is measured with closed-loop clients from concurrency_min up, doubling, to at most this."))
    model = serializers.CharField(required=False, max_length=128,
                                  help_text="Which served model to tune. Default: the deployment's first model.")
    sample = serializers.ChoiceField(choices=["generated", "request", "recorded"], default="generated", help_text=(
        "The request the load generator sends: 'generated' (the Try-it example from the signature), 'request' "
        "(yours, in 'request'); 'recorded' is not supported yet."))
    request = serializers.DictField(required=False, help_text=(
        "A KServe v2 inference request body ({\"inputs\": [...]}), with sample 'request'; at most 1 MiB."))

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        errors: dict[str, list[str]] = {}
        if attrs["concurrency_min"] > attrs["concurrency_max"]:
            errors["concurrency_max"] = ["concurrency_max must be at least concurrency_min"]
        sample = attrs["sample"]
        if sample == "recorded":
            errors["sample"] = [RECORDED_NOT_SUPPORTED]
        elif sample == "request":
            body = attrs.get("request")
            if body is None:
                errors["request"] = ["give the request body to send with sample 'request'"]
            else:
                problem = _request_problem(body)
                if problem:
                    errors["request"] = [problem]
        elif "request" in attrs:
            errors["request"] = ["a request body is used only with sample 'request'"]
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


def _request_problem(body: dict[str, Any]) -> str | None:
    if len(json.dumps(body)) > MAX_REQUEST_BYTES:
        return "the request body is larger than 1 MiB"
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs or not all(isinstance(i, dict) and isinstance(i.get("name"), str)
                                                               for i in inputs):
        return 'a KServe v2 request has "inputs": a non-empty list of objects, each with a "name"'
    # The load generator sends it straight to the tune's Triton, past the gateway: it must pass the gateway's own
    # checks (GATEWAY_MAX_TENSOR_BYTES, shapes whose size overflows, shared-memory parameters), or a tune would
    # reach Triton with what the gateway refuses (a [2**62] shape kills the model's stub, a huge shape with no data
    # makes Triton's JSON path allocate it).
    try:
        check_infer_request(body, None, settings.GATEWAY_MAX_TENSOR_BYTES)
    except Refusal as exc:
        return exc.message
    return None


def generated_problem(body: dict[str, Any]) -> str | None:
    """Why the Try-it example of the model cannot be the tune's request (an input too large to fill in goes with
    empty data, which the gateway would refuse and the load generator must not send either), or None."""
    problem = _request_problem(body)
    if problem is None:
        return None
    return (f"the generated request cannot be sent ({problem}): give your own with sample 'request' and the "
            "request in 'request'")


class TuneRunSerializer(serializers.ModelSerializer[TuneRun]):
    deployment = serializers.CharField(source="deployment.name", read_only=True)
    model = serializers.CharField(source="model_version.model.name", read_only=True)
    version = serializers.IntegerField(source="model_version.number", read_only=True)
    created_by = serializers.CharField(source="created_by.username", default=None, allow_null=True, read_only=True)
    machine = serializers.DictField(read_only=True, help_text="Where it was measured: hostname, cpu_model, cores, gpu.")
    results = serializers.ListField(child=serializers.DictField(), read_only=True, help_text=(
        "Per setting measured: settings, label, current (the setting that serves now), throughput (req/s: the "
        "median of its runs where it was re-measured as a close call), p50_ms, p99_ms and concurrency of its best "
        "point within the target, meets_target, missed (why it missed the target: p99 or errors at each "
        "concurrency measured, a server that did not start; '' when met), errors, samples (the throughput of each "
        "run at that concurrency), spread_pct (their (max - min) / median, %), every point measured and the "
        "repeats."))
    frontier = serializers.ListField(child=serializers.DictField(), read_only=True, help_text=(
        "The measured points no other beats on both throughput and p99: throughput, p99_ms, concurrency."))
    recommendation = serializers.DictField(read_only=True, allow_null=True, help_text=(
        "The setting to apply (settings, label, throughput, p50_ms, p99_ms, concurrency, current, runs), or null: "
        "the most throughput within the target, unless the current setting (or one closer to it) is within noise "
        "of it. note says why in a sentence (\"within noise (3.1% apart, spread 8.0%)\" or clearly better); "
        "within_noise, apart_pct, spread_pct and kept_current give the figures."))

    class Meta:
        model = TuneRun
        fields = ["id", "deployment", "model", "version", "status", "message", "p99_target_ms", "budget_seconds",
                  "concurrency_min", "concurrency_max", "sample", "host", "machine", "configs_done",
                  "configs_planned", "eta_seconds", "partial", "results", "frontier", "recommendation",
                  "applied_revision", "created_by", "created_at", "started_at", "finished_at"]
        read_only_fields = fields


def _tunes(deployment: Deployment) -> Any:
    return TuneRun.objects.filter(deployment=deployment).select_related("deployment", "model_version__model",
                                                                         "created_by")


def _tune_for_user(request: Request, name: str, tune_id: int) -> TuneRun:
    tune = _tunes(get_deployment_for_user(request, name)).filter(pk=tune_id).first()
    if tune is None:
        raise Http404(f"Deployment {name!r} has no tune {tune_id}: GET /api/v1/deployments/{name}/tunes/ lists "
                      "its tunes.")
    return tune


def _entry_to_tune(deployment: Deployment, model: str | None) -> ModelEntry:
    spec = deployment.revision.spec if deployment.revision else None
    if spec is None or not spec.models:
        raise serializers.ValidationError({"model": ["the deployment serves no model yet"]})
    entry = spec.models[0] if model is None else next((m for m in spec.models if m.name == model), None)
    if entry is None:
        raise serializers.ValidationError({"model": [f"the deployment serves no model named {model!r}"]})
    if entry.is_pipeline or entry.version_id is None:
        raise serializers.ValidationError({"model": [
            "a pipeline is not tuned as a whole: tune its step models (name one in 'model')"]})
    return entry


@extend_schema(summary="Tune a deployment: find the settings with the most throughput within a p99 target",
               request=TuneInputSerializer, examples=[OpenApiExample("A 20 ms target, 5 minutes", request_only=True,
                                                                     value={"p99_ms": 20, "budget_seconds": 300})],
               responses={
                   202: TuneRunSerializer,
                   400: error("Not a valid tune: 'fields' says which field and why (a target of 0, a budget out of "
                              "range, an unsupported sample, a deployment this machine cannot measure)."),
                   409: error("A tune of this deployment is queued or running already, or the team has "
                              "TUNE_MAX_ACTIVE_PER_TEAM tunes queued or running."),
               })
@api_view(["POST"])
@parser_classes(JSON_PARSERS)
def tune_create(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    serializer = TuneInputSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    data = serializer.validated_data
    if not registry.can_tune(deployment):
        raise serializers.ValidationError({"runtime": [registry.CANNOT_TUNE]})
    entry = _entry_to_tune(deployment, data.get("model"))
    assert entry.version_id is not None  # _entry_to_tune refused a model without one
    body = data["request"] if data["sample"] == "request" else example_request(served_signature(entry))
    if data["sample"] == "generated":
        # The example request the version was uploaded with, where it fits (as Try it sends it), else zeros.
        body = with_data(body, ModelVersion.objects.get(pk=entry.version_id).example_data())
        problem = generated_problem(body)
        if problem:
            raise serializers.ValidationError({"sample": [problem]})
    tune = actions.create_tune(deployment, request.user, actions.TuneRequest(
        model_version=ModelVersion.objects.get(pk=entry.version_id), p99_target_ms=data["p99_ms"],
        budget_seconds=data["budget_seconds"], concurrency_min=data["concurrency_min"],
        concurrency_max=data["concurrency_max"], sample=data["sample"], request_body=body))
    return Response(TuneRunSerializer(_tunes(deployment).get(pk=tune.pk)).data, status=status.HTTP_202_ACCEPTED)


@extend_schema(summary="A deployment's tunes, newest first", responses={200: TuneRunSerializer(many=True)})
@api_view(["GET"])
def tune_list(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    return Response(TuneRunSerializer(_tunes(deployment)[:50], many=True).data)


@extend_schema(summary="A tune: progress, results, the frontier and the recommendation",
               responses={200: TuneRunSerializer})
@api_view(["GET"])
def tune_detail(request: Request, name: str, tune_id: int) -> Response:
    return Response(TuneRunSerializer(_tune_for_user(request, name, tune_id)).data)


class TuneApplySerializer(ExactJSONTypes, serializers.Serializer[Any]):
    """How the tuned revision rolls out (an empty body: at once, as a PATCH does by default)."""

    rollout = RolloutSerializer(required=False, help_text=(
        "As on PATCH /api/v1/deployments/{name}/: {\"strategy\": \"canary\", \"percent\": 10} serves the tuned "
        "revision to that share of the requests beside the serving one, under the canary's guardrails, until it is "
        "promoted or rolled back."))
    narrow = serializers.BooleanField(default=False, help_text=(
        "Apply even where the tuned settings narrow what clients may send (a lower max_batch_size refuses the "
        "larger batches accepted today). Without it such an apply is refused with a 400 listing the changes."))


class TuneChangeSerializer(serializers.Serializer[Any]):
    model = serializers.CharField(help_text="The served model the setting belongs to.")
    setting = serializers.CharField(help_text=(
        "max_batch_size, dynamic_batching, max_queue_delay_microseconds, instances, or 'tensor <name>'."))
    before = serializers.JSONField(help_text="The value the serving revision has.")
    after = serializers.JSONField(help_text="The value the tuned revision has.")
    narrows = serializers.BooleanField(help_text="Whether a request clients may send today would be refused after.")
    why = serializers.CharField(help_text="For a narrowing change: what a client loses ('' otherwise).")


class TuneAppliedSerializer(TuneRunSerializer):
    changes = TuneChangeSerializer(many=True, read_only=True, help_text=(
        "Every setting the apply changed, before and after (the same list the page and the CLI show)."))

    class Meta(TuneRunSerializer.Meta):
        fields = [*TuneRunSerializer.Meta.fields, "changes"]
        read_only_fields = fields


@extend_schema(summary="Apply a tune's recommendation: a new revision, rolled out as a PATCH is (at once or as a "
                       "canary)", request=TuneApplySerializer,
               responses={
                   200: TuneAppliedSerializer,
                   400: error("The body or the recommended settings are not valid (the settings no longer fit the "
                              "deployment), or they narrow what clients may send and 'narrow' is not true: "
                              "'fields' says why, 'narrow' listing every change."),
                   409: error("The tune has no recommendation to apply, the deployment no longer serves the model "
                              "version tuned, or a canary is in progress."),
               })
@api_view(["POST"])
@parser_classes(JSON_PARSERS)
def tune_apply(request: Request, name: str, tune_id: int) -> Response:
    tune = _tune_for_user(request, name, tune_id)
    body = TuneApplySerializer(data=request.data)
    body.is_valid(raise_exception=True)
    rollout = None
    if "rollout" in body.validated_data:
        rollout = RolloutSerializer(data=body.initial_data["rollout"])
        rollout.is_valid(raise_exception=True)
    try:
        applied = actions.apply_tune(tune, request.user, rollout.rollout() if rollout is not None else None,
                                     narrow=body.validated_data["narrow"])
    except planning.PlanError as exc:
        raise serializers.ValidationError(exc.errors) from None
    except actions.NarrowingRefused as exc:
        raise serializers.ValidationError({"narrow": [str(exc)]}) from None
    answer = _tune_for_user(request, name, tune_id)
    answer.changes = [c.to_json() for c in applied.changes]  # type: ignore[attr-defined]
    return Response(TuneAppliedSerializer(answer).data)


@extend_schema(summary="Cancel a queued or running tune", request=None, responses={
    202: TuneRunSerializer, 409: error("The tune is over already.")})
@api_view(["POST"])
@takes_no_body
def tune_cancel(request: Request, name: str, tune_id: int) -> Response:
    tune = _tune_for_user(request, name, tune_id)
    actions.cancel_tune(tune, request.user)
    return Response(TuneRunSerializer(_tune_for_user(request, name, tune_id)).data, status=status.HTTP_202_ACCEPTED)
