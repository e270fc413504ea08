"""Gateway statistics: per-deployment request counts and latency percentiles for the UI, and /metrics for
Prometheus."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.crypto import constant_time_compare
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.tokens import parse_bearer
from deployments.api import get_deployment_for_user
from gateway.models import LATENCY_BUCKETS_MS, RequestStats
from gateway.stats import BUCKET_SECONDS, merge_codes, percentile_ms


def summarize(rows: list[RequestStats], window: timedelta) -> dict[str, Any]:
    """Totals and a series over the rows (of every revision: rows of one bucket are added up)."""
    total = [0] * len(LATENCY_BUCKETS_MS)
    requests = errors = 0
    codes: dict[str, int] = {}
    by_bucket: dict[Any, tuple[int, int, list[int]]] = {}
    for row in sorted(rows, key=lambda r: r.bucket_start):
        codes = merge_codes(codes, row.codes)
        histogram = row.latency_histogram or [0] * len(LATENCY_BUCKETS_MS)
        total = [a + b for a, b in zip(total, histogram, strict=False)]
        requests += row.requests
        errors += row.errors
        seen = by_bucket.get(row.bucket_start)
        if seen is not None:
            histogram = [a + b for a, b in zip(seen[2], histogram, strict=False)]
        by_bucket[row.bucket_start] = ((seen[0] if seen else 0) + row.requests, (seen[1] if seen else 0) + row.errors,
                                       histogram)
    series = [{
        "time": start.isoformat(),
        "requests": count,
        "errors": failed,
        "requests_per_second": round(count / BUCKET_SECONDS, 3),
        "p50_ms": _round(percentile_ms(histogram, 0.50)),
        "p99_ms": _round(percentile_ms(histogram, 0.99)),
    } for start, (count, failed, histogram) in by_bucket.items()]
    return {
        "window_seconds": int(window.total_seconds()),
        "requests": requests,
        "errors": errors,
        "error_rate": round(errors / requests, 4) if requests else None,
        "codes": dict(sorted(codes.items())),
        "requests_per_second": round(requests / window.total_seconds(), 3),
        "p50_ms": _round(percentile_ms(total, 0.50)),
        "p95_ms": _round(percentile_ms(total, 0.95)),
        "p99_ms": _round(percentile_ms(total, 0.99)),
        "bucket_seconds": BUCKET_SECONDS,
        "series": series,
    }


def by_revision(rows: list[RequestStats], window: timedelta) -> dict[str, dict[str, Any]]:
    """{revision number: its requests, errors, error rate, rate and p50/p99} for the revisions that answered."""
    grouped: dict[int, list[RequestStats]] = {}
    for row in rows:
        if row.revision:
            grouped.setdefault(row.revision, []).append(row)
    keys = ["requests", "errors", "error_rate", "requests_per_second", "p50_ms", "p99_ms"]
    out = {}
    for number, group in sorted(grouped.items()):
        summary = summarize(group, window)
        out[str(number)] = {key: summary[key] for key in keys}
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


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
REVISION_METRICS = inline_serializer("RevisionMetrics", {
    "requests": serializers.IntegerField(),
    "errors": serializers.IntegerField(help_text="Answers with a status of 500 or more, or 429."),
    "error_rate": serializers.FloatField(allow_null=True, help_text="errors / requests. " + _NULL_WITHOUT_REQUESTS),
    "requests_per_second": serializers.FloatField(),
    "p50_ms": serializers.FloatField(allow_null=True, help_text=_NULL_WITHOUT_REQUESTS),
    "p99_ms": serializers.FloatField(allow_null=True, help_text=_NULL_WITHOUT_REQUESTS),
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
    return Response({**summarize(rows, window), "revisions": by_revision(rows, window)})


def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint; when METRICS_TOKEN is set, scrapers must send it as a bearer token."""
    expected = settings.METRICS_TOKEN
    if expected:
        raw = parse_bearer(request.headers.get("Authorization"))
        if raw is None or not constant_time_compare(raw, expected):
            return HttpResponse("metrics need 'Authorization: Bearer <METRICS_TOKEN>'\n", status=401,
                                content_type="text/plain")
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)
