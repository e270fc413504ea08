"""Requests, errors and latency per deployment for the dashboard, from the gateway's per-bucket stats rows.

The dashboard and the deployment page's traffic panel look at the same window (WINDOW, "the last 5 minutes"), so
that the two pages agree on the numbers they show for one deployment.

The gateway app is optional here (it may be absent from INSTALLED_APPS, or its helpers may move): without it every
deployment simply shows "no traffic yet"."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.utils import timezone

WINDOW_MINUTES = 5
WINDOW = timedelta(minutes=WINDOW_MINUTES)


def traffic_by_deployment(deployment_ids: list[int], window: timedelta = WINDOW) -> dict[int, dict[str, Any]]:
    """{deployment id: {"requests", "requests_per_second", "errors", "error_rate", "codes", "p50_ms", "p99_ms",
    ...}} for deployments with requests in the window; one query for all of them."""
    if not deployment_ids or not apps.is_installed("gateway"):
        return {}
    try:
        from gateway.models import RequestStats
        from gateway.stats import summarize
    except ImportError:
        return {}
    rows = RequestStats.objects.filter(deployment_id__in=deployment_ids, bucket_start__gte=timezone.now() - window)
    grouped: dict[int, list[Any]] = defaultdict(list)
    for row in rows.order_by("bucket_start"):
        grouped[row.deployment_id].append(row)
    summaries = {pk: summarize(group, window) for pk, group in grouped.items()}
    return {pk: summary for pk, summary in summaries.items() if summary.get("requests")}
