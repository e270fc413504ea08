"""GET /api/v1/deployments/<name>/performance/: the figures from stored snapshots and gateway rows, the window's
bounds (a 400 naming the windows), and access (no credentials: refused; charlie: the 404 of a deployment that is not
there)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from deployments.models import Deployment
from performance.report import performance
from performance.tests.statistics import gateway_rows, serve, snapshot, triton_row
from tests.support.gateway_calls import make_deployment
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


def _deployed(alice: Person, name: str, models: tuple[str, ...]) -> Deployment:
    """A deployment of `models`, its revision serving."""
    return serve(Deployment.objects.get(pk=make_deployment(alice, name, "http://127.0.0.1:9", models).pk))


def test_each_model_has_the_gateways_share_of_its_own_and_the_revision_the_sum(alice: Person) -> None:
    deployment = _deployed(alice, "two-models", ("digits", "resnet"))
    snapshot(deployment, 10, triton_row("digits", 0, batches={}), triton_row("resnet", 0, batches={}))
    # digits: 200 requests of 9 ms at the gateway, 7.003 ms in Triton; resnet: 50 of 4 ms, 1.003 ms in Triton.
    gateway_rows(deployment, 5, requests=200, latency_ms=9.0, model="digits", errors=2)
    gateway_rows(deployment, 5, requests=50, latency_ms=4.0, model="resnet", errors=0)
    gateway_rows(deployment, 5, requests=10, latency_ms=1.0)  # named no model of the deployment (or none at all)
    snapshot(deployment, 1, triton_row("digits", 200, queue_ns=200 * 6_000_000, infer_ns=200 * 1_000_000),
             triton_row("resnet", 50, infer_ns=50 * 1_000_000))

    body = alice.client().get("/api/v1/deployments/two-models/performance/?window=15m").json()

    [revision] = body["revisions"]
    models = {m["model"]: m for m in revision["models"]}
    digits, resnet = models["digits"]["gateway"], models["resnet"]["gateway"]
    assert (digits["requests"], digits["errors"], digits["error_rate"]) == (200, 2, 0.01)
    assert (resnet["requests"], resnet["errors"], resnet["error_rate"]) == (50, 0, 0.0)
    assert digits["statistic"] == "percentiles" and digits["mean_ms"] == pytest.approx(9.0)
    assert digits["own_mean_ms"] == pytest.approx(2.0, abs=0.01)  # 9 ms less digits' 7.003 in Triton
    assert resnet["own_mean_ms"] == pytest.approx(3.0, abs=0.01)  # 4 ms less resnet's 1.003
    assert digits["p99_ms"] is not None and models["digits"]["queue_ms"] == pytest.approx(6.0)
    # The revision's figures: every model's and the requests that named none, as before.
    gateway = revision["gateway"]
    assert gateway["requests"] == 260 and gateway["errors"] == 3
    assert gateway["requests"] == digits["requests"] + resnet["requests"] + 10


def test_the_gateways_model_figures_without_snapshots_have_no_own_time(alice: Person) -> None:
    deployment = _deployed(alice, "no-snapshots", ("digits",))
    gateway_rows(deployment, 2, requests=10, latency_ms=3.0, model="digits")

    [revision] = alice.client().get("/api/v1/deployments/no-snapshots/performance/").json()["revisions"]

    [model] = revision["models"]
    assert model["gateway"]["requests"] == 10 and model["gateway"]["mean_ms"] == pytest.approx(3.0)
    assert model["gateway"]["own_mean_ms"] is None


def test_listing_a_revisions_models_takes_the_same_queries_however_many_it_has(
        alice: Person, django_assert_num_queries: Any) -> None:
    names = tuple(f"m{index}" for index in range(12))
    deployment = _deployed(alice, "many-models", names)
    for name in names:
        gateway_rows(deployment, 2, requests=10, latency_ms=3.0, model=name)
    snapshot(deployment, 5, *[triton_row(name, 0, batches={}) for name in names])
    snapshot(deployment, 1, *[triton_row(name, 10, infer_ns=10 * 1_000_000) for name in names])
    deployment = Deployment.objects.select_related("serving_revision", "canary_revision").get(pk=deployment.pk)

    # The snapshots, the gateway's rows, the revisions that served: none per model.
    with django_assert_num_queries(3):
        report = performance(deployment, timedelta(minutes=15))

    [revision] = report["revisions"]
    assert [m["model"] for m in revision["models"]] == list(names)
    assert {m["gateway"]["requests"] for m in revision["models"]} == {10}
