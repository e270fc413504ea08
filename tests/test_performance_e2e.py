"""The performance panel against a real Triton: inferences through the real gateway (uvicorn serving portal.asgi)
show up in GET /api/v1/deployments/<name>/performance/ with Triton's queue and compute times, the batch sizes it
formed, and the gateway's percentiles. The snapshots are beat's (every PERFORMANCE_SNAPSHOT_SECONDS, 5 s here),
taken by the worker's reconcile lane from the deployment's Triton, as in production."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from django.utils import timezone

from gateway.models import RequestStats
from performance.models import TritonSnapshot
from tests.deploying import deploy, push, wait_status
from tests.processes import wait_for
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

REQUESTS = 320


@pytest.fixture
def snapshots_every_5s(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the worker and beat start (they copy the environment): beat's snapshot pass every 5 s, not 60."""
    monkeypatch.setenv("PERFORMANCE_SNAPSHOT_SECONDS", "5")


def test_inferences_through_the_gateway_show_where_their_time_went(
    snapshots_every_5s: None, people: dict[str, Person], portal_url: str, digits_onnx: Path
) -> None:
    from models_registry.samples import digits_holdout

    alice = people["alice"]
    push(alice, digits_onnx)
    deploy(alice, "digits-prod", [{"model": "digits", "max_batch_size": 32,
                                   "dynamic_batching": {"max_queue_delay_microseconds": 2000}}])
    wait_status(alice, "digits-prod", "ready")
    wait_for(lambda: TritonSnapshot.objects.exists(), 20, what="beat's first snapshot, before the requests")
    X, _ = digits_holdout()
    auth = {"Authorization": f"Bearer {alice.token}"}
    url = f"{portal_url}/serve/digits-prod/v2/models/digits/infer"

    def one(row: int) -> int:
        body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                            "data": X[row % len(X)].astype(float).tolist()}]}
        return requests.post(url, json=body, headers=auth, timeout=30).status_code

    with ThreadPoolExecutor(max_workers=16) as pool:  # concurrent callers: Triton forms batches
        codes = list(pool.map(one, range(REQUESTS)))
    assert codes == [200] * REQUESTS
    # The gateway writes its figures every few seconds (gateway/app.py, FLUSH_SECONDS).
    wait_for(lambda: sum(RequestStats.objects.values_list("requests", flat=True)) >= REQUESTS, 20,
             what="the gateway's figures")
    done = timezone.now()
    wait_for(lambda: TritonSnapshot.objects.filter(taken_at__gt=done).exists(), 20,
             what="beat's snapshot after the requests")

    response = requests.get(f"{portal_url}/api/v1/deployments/digits-prod/performance/?window=5m", headers=auth,
                            timeout=10)

    assert response.status_code == 200, response.text
    [revision] = response.json()["revisions"]
    assert revision["role"] == "serving" and revision["snapshots"] >= 2
    gateway: dict[str, Any] = revision["gateway"]
    assert gateway["requests"] >= REQUESTS and gateway["errors"] == 0
    assert 0 < gateway["p50_ms"] <= gateway["p95_ms"] <= gateway["p99_ms"]
    assert gateway["own_mean_ms"] is not None and gateway["own_mean_ms"] >= 0
    [model] = revision["models"]
    assert model["requests"] == REQUESTS and model["errors"] == 0
    assert model["queue_ms"] > 0 and model["compute_infer_ms"] > 0
    assert model["compute_input_ms"] > 0 and model["compute_output_ms"] > 0
    sizes = {b["batch_size"]: b["executions"] for b in model["batch_sizes"]}
    assert sum(size * count for size, count in sizes.items()) == REQUESTS
    assert max(sizes) > 1, sizes  # Triton batched concurrent requests
    assert model["executions"] == sum(sizes.values()) < REQUESTS
    # The gateway's share of the model, as the gateway recorded it under the model's name: every request was its.
    own: dict[str, Any] = model["gateway"]
    assert own["requests"] == gateway["requests"] and own["errors"] == 0
    assert own["own_mean_ms"] is not None and own["own_mean_ms"] >= 0 and own["p99_ms"] == gateway["p99_ms"]
    print("figures:", {k: model[k] for k in ("queue_ms", "compute_input_ms", "compute_infer_ms", "compute_output_ms",
                                              "queue_share", "mean_batch_size")}, "gateway:", gateway)
