"""Triton's /v2/models/stats rows as Triton 2.51 writes them, and a deployment's stored snapshots and gateway rows,
for the performance tests (the API's and the page's)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from deployments.models import Deployment
from gateway.models import LATENCY_BUCKETS_MS, RequestStats
from performance.figures import parse_statistics
from performance.models import TritonSnapshot


def triton_row(name: str, n: int, *, queue_ns: int = 0, infer_ns: int = 0, fail: int = 0,
               batches: dict[int, int] | None = None) -> dict[str, Any]:
    """A /v2/models/stats row of `name` after `n` successful requests, as Triton 2.51 writes it."""
    batches = batches if batches is not None else {1: n}
    per = {"count": n, "ns": 0}
    return {
        "name": name, "version": "1", "last_inference": 0, "inference_count": n,
        "execution_count": sum(batches.values()),
        "inference_stats": {"success": {"count": n, "ns": queue_ns + infer_ns + 3_000 * n},
                            "fail": {"count": fail, "ns": 0}, "queue": {"count": n, "ns": queue_ns},
                            "compute_input": {**per, "ns": 1_000 * n},
                            "compute_infer": {"count": n, "ns": infer_ns},
                            "compute_output": {**per, "ns": 2_000 * n},
                            "cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0}},
        "batch_stats": [{"batch_size": size, "compute_input": {"count": c, "ns": 0},
                         "compute_infer": {"count": c, "ns": 0}, "compute_output": {"count": c, "ns": 0}}
                        for size, c in batches.items()],
    }


def serve(deployment: Deployment) -> Deployment:
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=deployment.revision,
                                                        upstream_url="http://127.0.0.1:9")
    deployment.refresh_from_db()
    return deployment


def snapshot(deployment: Deployment, minutes_ago: float, *rows: dict[str, Any]) -> None:
    counters = parse_statistics({"model_stats": list(rows)})
    assert deployment.serving_revision is not None
    TritonSnapshot.objects.create(deployment=deployment, revision=deployment.serving_revision.number,
                                  taken_at=timezone.now() - timedelta(minutes=minutes_ago),
                                  counters={name: c.to_json() for name, c in counters.items()})


def gateway_rows(deployment: Deployment, minutes_ago: float, requests: int, latency_ms: float, model: str = "",
                 errors: int = 1) -> None:
    """A gateway bucket of `requests` of `latency_ms` each, `errors` of them failed, for `model` ("": none named)."""
    histogram = [0] * len(LATENCY_BUCKETS_MS)
    histogram[LATENCY_BUCKETS_MS.index(10)] = requests
    assert deployment.serving_revision is not None
    RequestStats.objects.create(deployment=deployment, revision=deployment.serving_revision.number, model=model,
                                bucket_start=timezone.now() - timedelta(minutes=minutes_ago), requests=requests,
                                errors=errors, latency_sum_ms=requests * latency_ms, latency_histogram=histogram)
