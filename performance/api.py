"""GET /api/v1/deployments/<name>/performance/: where a deployment's time goes over a window, per revision and model
(performance/report.py)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from deployments.queries import get_deployment_for_user
from performance.report import GATEWAY_STATISTICS, MODEL_STATISTICS, ROLES, performance
from performance.windows import DEFAULT_WINDOW, WINDOWS, allowed, parse_window

_NULL = "Null without requests in the window (or fewer than two snapshots)."
_MEAN = "Mean per successful request, in milliseconds, from Triton's statistics (sums: no percentiles). " + _NULL
BATCH = inline_serializer("PerformanceBatchSize", {
    "batch_size": serializers.IntegerField(),
    "executions": serializers.IntegerField(help_text="Model executions Triton ran at that batch size."),
})


def _gateway(name: str, requests_help: str) -> serializers.Serializer:
    """The gateway's figures, of a revision or of one model of it (fresh fields each: a field has one parent)."""
    return inline_serializer(name, {
        "statistic": serializers.ChoiceField(choices=list(GATEWAY_STATISTICS), help_text=(
            "The gateway's figures are percentiles of whole requests (Triton's time included) from its histograms.")),
        "requests": serializers.IntegerField(help_text=requests_help),
        "errors": serializers.IntegerField(help_text="Answers with a status of 500 or more, or 429."),
        "error_rate": serializers.FloatField(allow_null=True, help_text="Null without requests."),
        "p50_ms": serializers.FloatField(allow_null=True, help_text="Null without requests."),
        "p95_ms": serializers.FloatField(allow_null=True, help_text="Null without requests."),
        "p99_ms": serializers.FloatField(allow_null=True, help_text="Null without requests."),
        "mean_ms": serializers.FloatField(allow_null=True, help_text="Null without requests."),
        "own_mean_ms": serializers.FloatField(allow_null=True, help_text=(
            "The gateway's own mean time per request: its mean less Triton's (a revision's: Triton's mean time for "
            "the models called, pipeline steps excluded; a model's: its own mean time in Triton). " + _NULL)),
    })


GATEWAY = _gateway("PerformanceGateway", "Requests the gateway answered for the revision (every model's, and those "
                                         "that named no model of the deployment).")
MODEL = inline_serializer("PerformanceModel", {
    "model": serializers.CharField(),
    "pipeline": serializers.BooleanField(help_text="A pipeline (Triton ensemble): its times include its steps'."),
    "step_of": serializers.ListField(child=serializers.CharField(), help_text=(
        "The revision's pipelines this model is a step of (its counts include the pipelines' calls).")),
    "statistic": serializers.ChoiceField(choices=list(MODEL_STATISTICS), help_text="What the times are: means."),
    "requests": serializers.IntegerField(help_text="Requests that succeeded in Triton."),
    "errors": serializers.IntegerField(help_text="Requests that failed in Triton."),
    "executions": serializers.IntegerField(help_text="Model executions (a batch is one)."),
    "inferences": serializers.IntegerField(help_text="Inferences (a batch of 8 is 8)."),
    "request_ms": serializers.FloatField(allow_null=True, help_text="The whole time in Triton. " + _MEAN),
    "queue_ms": serializers.FloatField(allow_null=True, help_text="Waiting for an instance. " + _MEAN),
    "compute_input_ms": serializers.FloatField(allow_null=True, help_text=_MEAN),
    "compute_infer_ms": serializers.FloatField(allow_null=True, help_text=_MEAN),
    "compute_output_ms": serializers.FloatField(allow_null=True, help_text=_MEAN),
    "queue_share": serializers.FloatField(allow_null=True, help_text=(
        "queue / (queue + compute input, infer and output), 0..1. " + _NULL)),
    "mean_batch_size": serializers.FloatField(allow_null=True, help_text="Null without executions."),
    "batch_sizes": serializers.ListField(child=BATCH, help_text="The batch sizes Triton formed, smallest first."),
    "restarted": serializers.BooleanField(help_text=(
        "Its Triton restarted in the window: what it counted before the restart is not in the figures.")),
    "gateway": _gateway("PerformanceModelGateway", (
        "Requests the gateway answered for this model, by its name in the deployment (a pipeline's steps count only "
        "the calls made to them directly): the revision's gateway figures are these summed over its models, with "
        "the requests that named none of them.")),
    "advice": serializers.ListField(child=serializers.CharField(), help_text=(
        "What to change, in words, when the queue dominates (empty otherwise, or with too few requests).")),
})
REVISION = inline_serializer("PerformanceRevision", {
    "revision": serializers.IntegerField(),
    "role": serializers.ChoiceField(choices=list(ROLES)),
    "from": serializers.DateTimeField(allow_null=True, help_text=(
        "The first snapshot of Triton's statistics the figures start from. Null with fewer than two.")),
    "to": serializers.DateTimeField(allow_null=True, help_text="The last snapshot. Null with fewer than two."),
    "snapshots": serializers.IntegerField(help_text="Snapshots of Triton's statistics in the window."),
    "gateway": GATEWAY,
    "models": serializers.ListField(child=MODEL, help_text="The revision's models, pipeline steps included."),
})
PERFORMANCE = inline_serializer("Performance", {
    "deployment": serializers.CharField(),
    "window": serializers.ChoiceField(choices=list(WINDOWS)),
    "window_seconds": serializers.IntegerField(),
    "snapshot_seconds": serializers.FloatField(help_text="How often Triton's statistics are read."),
    "revisions": serializers.ListField(child=REVISION, help_text="Newest first: the serving one, a canary, and "
                                                                 "earlier ones that served in the window."),
})


@extend_schema(summary="Where a deployment's time goes: gateway, queue, compute, batch sizes, per revision and model",
               parameters=[OpenApiParameter("window", {"type": "string", "enum": list(WINDOWS)},
                                            description=f"The window (default {DEFAULT_WINDOW}).")],
               responses={200: PERFORMANCE})
@api_view(["GET"])
def deployment_performance(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    text = request.query_params.get("window")
    window = parse_window(text)
    if window is None:
        raise ValidationError({"window": [f"must be one of {allowed()}"]})
    return Response({**performance(deployment, window), "window": text or DEFAULT_WINDOW})
