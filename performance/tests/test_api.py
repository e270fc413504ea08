"""GET /api/v1/deployments/<name>/performance/: the figures from stored snapshots and gateway rows, the window's
bounds (a 400 naming the windows), and access (no credentials: refused; charlie: the 404 of a deployment that is not
there)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from deployments.models import Deployment
from performance.tests.statistics import gateway_rows, serve, snapshot, triton_row
from tests.support.people import Person


def test_alice_reads_where_the_time_went_in_the_window(alice: Person, deployment: Deployment) -> None:
    deployment = serve(deployment)
    snapshot(deployment, 10, triton_row("digits", 100, queue_ns=100 * 6_000_000, infer_ns=100 * 1_000_000))
    gateway_rows(deployment, 5, requests=200, latency_ms=9.0)
    snapshot(deployment, 1, triton_row("digits", 300, queue_ns=300 * 6_000_000, infer_ns=300 * 1_000_000,
                                       batches={1: 100, 8: 25}))
    gateway_rows(deployment, 20, requests=999, latency_ms=1.0)  # before the window

    response = alice.client().get(f"/api/v1/deployments/{deployment.name}/performance/?window=15m")

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["window"] == "15m" and body["window_seconds"] == 900
    [revision] = body["revisions"]
    assert revision["revision"] == deployment.revision.number and revision["role"] == "serving"
    assert revision["snapshots"] == 2 and revision["from"] and revision["to"]
    gateway = revision["gateway"]
    assert gateway["statistic"] == "percentiles" and gateway["requests"] == 200 and gateway["errors"] == 1
    assert gateway["p50_ms"] is not None and gateway["p99_ms"] <= 10
    # 200 requests of 9 ms, of which Triton's 200 took 7.003 ms each: about 2 ms in the gateway.
    assert gateway["own_mean_ms"] == pytest.approx(2.0, abs=0.01)
    [model] = revision["models"]
    assert model["model"] == "digits" and model["statistic"] == "mean"
    assert model["requests"] == 200 and model["queue_ms"] == pytest.approx(6.0)
    assert model["compute_infer_ms"] == pytest.approx(1.0)
    assert model["batch_sizes"] == [{"batch_size": 8, "executions": 25}]
    assert model["queue_share"] > 0.8
    assert model["advice"] and "queue" in model["advice"][0]


def test_without_snapshots_yet_the_triton_figures_are_null_and_the_gateways_are_there(
        alice: Person, deployment: Deployment) -> None:
    deployment = serve(deployment)
    gateway_rows(deployment, 2, requests=10, latency_ms=3.0)

    body = alice.client().get(f"/api/v1/deployments/{deployment.name}/performance/").json()

    [revision] = body["revisions"]
    assert body["window"] == "15m" and revision["snapshots"] == 0 and revision["from"] is None
    assert revision["gateway"]["requests"] == 10 and revision["gateway"]["own_mean_ms"] is None
    assert revision["models"][0]["queue_ms"] is None and revision["models"][0]["advice"] == []


def test_a_deployment_that_never_served_has_no_revisions(alice: Person, deployment: Deployment) -> None:
    body = alice.client().get(f"/api/v1/deployments/{deployment.name}/performance/?window=5m").json()

    assert body["revisions"] == [] and body["window_seconds"] == 300


@pytest.mark.parametrize("window", ["10m", "15", "", "1d", "15m ", "15M", "24h0"])
def test_a_window_not_offered_is_a_400_naming_the_ones_that_are(alice: Person, deployment: Deployment,
                                                               window: str) -> None:
    response = alice.client().get(f"/api/v1/deployments/{deployment.name}/performance/?window={window}")

    assert response.status_code == 400
    assert "5m, 15m, 1h, 6h, 24h" in str(response.json())


def test_bob_of_the_same_team_reads_it(bob: Person, deployment: Deployment) -> None:
    assert bob.client().get(f"/api/v1/deployments/{deployment.name}/performance/").status_code == 200


def test_charlie_gets_the_404_of_a_deployment_that_is_not_there(charlie: Person, deployment: Deployment) -> None:
    theirs = charlie.client().get(f"/api/v1/deployments/{deployment.name}/performance/")
    missing = charlie.client().get("/api/v1/deployments/nothing-here/performance/")

    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["error"]["message"].replace(deployment.name, "X") == missing.json()["error"][
        "message"].replace("nothing-here", "X")


def test_without_credentials_it_is_refused(deployment: Deployment) -> None:
    response = APIClient().get(f"/api/v1/deployments/{deployment.name}/performance/")

    assert response.status_code in (401, 403)
