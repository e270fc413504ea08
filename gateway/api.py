"""Gateway statistics: per-deployment request counts and latency percentiles for the UI, and /metrics for
Prometheus."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from deployments import portal_metrics, triton_metrics
from deployments.queries import get_deployment_for_user
from gateway.models import RequestStats
from gateway.stats import by_revision, scrape_refusal, stream_summary, summarize
from gateway.stream_figures import BOUNDS

# The portal's own state (pools, rollbacks, queues), read at each scrape of this endpoint only: not in the global
# registry, which the gRPC gateway's /metrics serves too (deployments/portal_metrics.py).
PORTAL_STATE = CollectorRegistry(auto_describe=False)
PORTAL_STATE.register(portal_metrics.PortalState())

# The answer's schema. Inline: a Serializer class cannot declare a field named "errors".
_NULL_WITHOUT_REQUESTS = "Null without requests."
BUCKET = inline_serializer("Bucket", {
    "time": serializers.DateTimeField(help_text="The bucket's start."),
    "requests": serializers.IntegerField(),
    "errors": serializers.IntegerField(help_text="Answers with a status of 500 or more, or 429."),
    "error_rate": serializers.FloatField(allow_null=True, help_text="errors / requests. " + _NULL_WITHOUT_REQUESTS),
    "codes": serializers.DictField(child=serializers.IntegerField(), help_text="Requests per HTTP status code."),
    "requests_per_second": serializers.FloatField(),
    "p50_ms": serializers.FloatField(allow_null=True, help_text=_NULL_WITHOUT_REQUESTS),
    "p99_ms": serializers.FloatField(allow_null=True, help_text=_NULL_WITHOUT_REQUESTS),
})
_NULL_WITHOUT_PIECES = "Null without pieces in the window."
_NULL_WITHOUT_GAPS = "Null without two pieces of one stream in the window."
STREAM_METRICS = inline_serializer("StreamMetrics", {
    "streams": serializers.IntegerField(help_text="Streams (generate_stream) that ended in the window."),
    "pieces": serializers.IntegerField(help_text="Pieces (events) sent to callers in the window."),
    "pieces_per_second": serializers.FloatField(),
    "in_flight": serializers.FloatField(help_text="The mean number of streams open over the window."),
    "ttft_p50_ms": serializers.FloatField(allow_null=True, help_text=(
        "Time to first piece: from the request's arrival at the gateway to its first piece sent. "
        + _NULL_WITHOUT_PIECES)),
    "ttft_p95_ms": serializers.FloatField(allow_null=True, help_text=_NULL_WITHOUT_PIECES),
    "ttft_p99_ms": serializers.FloatField(allow_null=True, help_text=_NULL_WITHOUT_PIECES),
    "itl_p50_ms": serializers.FloatField(allow_null=True, help_text="Time between two pieces of a stream sent. "
                                                                     + _NULL_WITHOUT_GAPS),
    "itl_p95_ms": serializers.FloatField(allow_null=True, help_text=_NULL_WITHOUT_GAPS),
    "itl_p99_ms": serializers.FloatField(allow_null=True, help_text=_NULL_WITHOUT_GAPS),
    "cancelled": serializers.IntegerField(help_text="Streams whose caller went away before their end (499)."),
    "ended_by": inline_serializer("StreamEndings", {
        reason: serializers.IntegerField() for reason in BOUNDS
    }, help_text=("Streams the gateway ended by a bound, by reason: idle (GATEWAY_STREAM_IDLE_SECONDS), "
                  "length_seconds (GATEWAY_MAX_STREAM_SECONDS), length_bytes (GATEWAY_MAX_STREAM_BYTES), "
                  "slow_reader (GATEWAY_STREAM_SEND_SECONDS), too_large (a piece over GATEWAY_MAX_RESPONSE_BYTES).")),
})
REVISION_METRICS = inline_serializer("RevisionMetrics", {
    "requests": serializers.IntegerField(),
    "errors": serializers.IntegerField(help_text="Answers with a status of 500 or more, or 429."),
    "error_rate": serializers.FloatField(allow_null=True, help_text="errors / requests. " + _NULL_WITHOUT_REQUESTS),
    "requests_per_second": serializers.FloatField(),
    "p50_ms": serializers.FloatField(allow_null=True, help_text=_NULL_WITHOUT_REQUESTS),
    "p99_ms": serializers.FloatField(allow_null=True, help_text=_NULL_WITHOUT_REQUESTS),
    "streams": STREAM_METRICS,
})
METRICS = inline_serializer("Metrics", {
    "window_seconds": serializers.IntegerField(),
    "requests": serializers.IntegerField(),
    "errors": serializers.IntegerField(help_text="Answers with a status of 500 or more, or 429."),
    "error_rate": serializers.FloatField(allow_null=True, help_text="errors / requests. " + _NULL_WITHOUT_REQUESTS),
    "codes": serializers.DictField(child=serializers.IntegerField(), help_text="Requests per HTTP status code."),
    "requests_per_second": serializers.FloatField(),
    "p50_ms": serializers.FloatField(allow_null=True, help_text=_NULL_WITHOUT_REQUESTS),
    "p95_ms": serializers.FloatField(allow_null=True, help_text=_NULL_WITHOUT_REQUESTS),
    "p99_ms": serializers.FloatField(allow_null=True, help_text=_NULL_WITHOUT_REQUESTS),
    "bucket_seconds": serializers.IntegerField(),
    "series": serializers.ListField(child=BUCKET, help_text="The buckets with requests, oldest first."),
    "streams": STREAM_METRICS,
    "revisions": serializers.DictField(child=REVISION_METRICS, help_text=(
        "Per revision number that answered (the stable one and a canary apart)."
    )),
})


@extend_schema(summary="A deployment's gateway traffic: request counts, rate and latency",
               parameters=[OpenApiParameter("minutes", {"type": "integer", "minimum": 1, "maximum": 1440},
                                            description="The window in minutes (default 15).")],
               responses={200: METRICS})
@api_view(["GET"])
def deployment_metrics(request: Request, name: str) -> Response:
    deployment = get_deployment_for_user(request, name)
    try:
        minutes = int(request.query_params.get("minutes", 15))
    except ValueError:
        raise ValidationError({"minutes": ["must be an integer"]}) from None
    if not 1 <= minutes <= 1440:
        raise ValidationError({"minutes": ["must be between 1 and 1440"]})
    window = timedelta(minutes=minutes)
    rows = list(RequestStats.objects.filter(deployment=deployment, bucket_start__gte=timezone.now() - window))
    return Response({**summarize(rows, window), "streams": stream_summary(rows, window),
                     "revisions": by_revision(rows, window)})


def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint: with METRICS_TOKEN set, scrapers send it as a bearer token; without one it is
    closed (403) unless the operator set METRICS_OPEN."""
    refusal = scrape_refusal(request.headers.get("Authorization"), settings.METRICS_TOKEN, settings.METRICS_OPEN)
    if refusal is not None:
        return HttpResponse(refusal[1], status=refusal[0], content_type="text/plain")
    # And the local runtime's Tritons' own, which no Prometheus reaches on 127.0.0.1 (deployments/triton_metrics.py).
    body = generate_latest() + generate_latest(PORTAL_STATE) + triton_metrics.exposition(triton_metrics.targets())
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
