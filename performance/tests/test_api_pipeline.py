"""A pipeline's performance: the pipeline and each of its steps apart (their own queue, compute and batches), the
steps marked as such, and the gateway's own time reckoned against the pipeline's time alone (its steps' time is
inside it: counted twice, the gateway's own time would come out as zero)."""

from __future__ import annotations

import pytest

from deployments.models import Deployment
from models_registry.samples import digits_pipeline_definition
from models_registry.tests.pipeline_versions import create_pipeline, digits_steps
from performance.tests.statistics import gateway_rows, serve, snapshot, triton_row
from tests.support.people import Person

STEPS = ("preprocess", "digits", "postprocess")


@pytest.fixture
def pipeline_deployment(alice: Person) -> Deployment:
    digits_steps(alice)
    assert create_pipeline(alice, digits_pipeline_definition()).status_code == 201
    response = alice.client().post("/api/v1/deployments/", {"name": "digits-pipeline",
                                                            "models": [{"model": "digits-pipeline"}]}, format="json")
    assert response.status_code == 201, response.json()
    return serve(Deployment.objects.get(name="digits-pipeline"))


def test_a_pipeline_and_its_steps_each_show_their_figures(alice: Person, pipeline_deployment: Deployment) -> None:
    # 100 requests: the pipeline takes 5 ms each, each step 1 ms of it.
    before = [triton_row("digits-pipeline", 0, batches={})] + [triton_row(step, 0, batches={}) for step in STEPS]
    after = [triton_row("digits-pipeline", 100, queue_ns=100 * 4_000_000, infer_ns=100 * 1_000_000 - 300_000,
                        batches={})]
    after += [triton_row(step, 100, queue_ns=100 * 500_000, infer_ns=100 * 500_000 - 3_000 * 100,
                         batches={4: 25}) for step in STEPS]
    snapshot(pipeline_deployment, 5, *before)
    gateway_rows(pipeline_deployment, 3, requests=100, latency_ms=6.0)
    snapshot(pipeline_deployment, 1, *after)

    body = alice.client().get("/api/v1/deployments/digits-pipeline/performance/").json()

    [revision] = body["revisions"]
    models = {m["model"]: m for m in revision["models"]}
    assert list(models) == ["digits-pipeline", *STEPS]
    assert models["digits-pipeline"]["pipeline"] and models["digits-pipeline"]["step_of"] == []
    for step in STEPS:
        assert models[step]["step_of"] == ["digits-pipeline"] and not models[step]["pipeline"]
        assert models[step]["requests"] == 100 and models[step]["batch_sizes"] == [{"batch_size": 4,
                                                                                    "executions": 25}]
        assert models[step]["queue_ms"] == pytest.approx(0.5)
    assert models["digits-pipeline"]["request_ms"] == pytest.approx(5.0)
    assert models["digits-pipeline"]["advice"] == []  # no instances of its own: its steps are what to change
    # 6 ms a request at the gateway, of which 5 in the pipeline: 1 ms of its own (the steps are not counted again).
    assert revision["gateway"]["own_mean_ms"] == pytest.approx(1.0, abs=0.01)


def test_the_gateways_share_is_the_pipelines_and_a_step_shows_only_the_calls_made_to_it(
        alice: Person, pipeline_deployment: Deployment) -> None:
    before = [triton_row("digits-pipeline", 0, batches={})] + [triton_row(step, 0, batches={}) for step in STEPS]
    after = [triton_row("digits-pipeline", 100, queue_ns=100 * 4_000_000, infer_ns=100 * 1_000_000 - 300_000,
                        batches={})]
    # digits: the pipeline's 100 calls and 20 made to it directly, 1 ms each.
    after += [triton_row(step, 120 if step == "digits" else 100, queue_ns=0,
                         infer_ns=(120 if step == "digits" else 100) * (1_000_000 - 3_000), batches={4: 25})
              for step in STEPS]
    snapshot(pipeline_deployment, 5, *before)
    gateway_rows(pipeline_deployment, 3, requests=100, latency_ms=6.0, model="digits-pipeline")
    gateway_rows(pipeline_deployment, 3, requests=20, latency_ms=1.5, model="digits", errors=0)
    snapshot(pipeline_deployment, 1, *after)

    [revision] = alice.client().get("/api/v1/deployments/digits-pipeline/performance/").json()["revisions"]

    models = {m["model"]: m for m in revision["models"]}
    pipeline = models["digits-pipeline"]["gateway"]
    assert pipeline["requests"] == 100 and pipeline["own_mean_ms"] == pytest.approx(1.0, abs=0.01)
    step = models["digits"]["gateway"]
    assert step["requests"] == 20 and step["own_mean_ms"] == pytest.approx(0.5, abs=0.01)  # 1.5 less its 1 ms
    for other in ("preprocess", "postprocess"):  # only ever called by the pipeline
        assert models[other]["gateway"]["requests"] == 0 and models[other]["gateway"]["own_mean_ms"] is None
    assert revision["gateway"]["requests"] == 120
