"""Statistics: Prometheus label values come only from the deployment's own models (random names in URLs must not
create time series without bound), and the per-deployment buckets count every answer, errors included."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from gateway import stats
from gateway.tests.fake_upstream import FakeUpstream
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person


def model_labels(deployment: str) -> set[str]:
    return {sample.labels["model"] for metric in stats.REQUESTS.collect() for sample in metric.samples
            if sample.labels.get("deployment") == deployment}


def test_random_model_names_share_one_label_and_the_deployments_models_have_their_own(
    people: dict[str, Person], gateway_app: Any
) -> None:
    alice = people["alice"]

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, alice, "labels-test", upstream.url, ("digits", "resnet"))
            app = gateway_app()
            for name in ["digits", "resnet"] + [secrets.token_hex(8) for _ in range(200)]:
                await call(app, "GET", f"/serve/labels-test/v2/models/{name}/ready", token=alice.token)
            await call(app, "GET", "/serve/labels-test/v2/health/ready", token=alice.token)
            await call(app, "GET", "/serve/labels-test/v2/logging", token=alice.token)  # a 403, counted too
            assert model_labels("labels-test") == {"digits", "resnet", "(other)", ""}
            buckets = app.collector.take()
            assert sum(b.requests for b in buckets.values()) == 204
            # Requests for deployments that do not exist (or not for this caller) are not labelled at all.
            await call(app, "GET", f"/serve/{secrets.token_hex(8)}/v2", token=alice.token)
            assert app.collector.take() == {}

    run(scenario)


def test_the_statistics_buckets_count_errors_and_latency() -> None:
    collector = stats.StatsCollector()
    collector.observe(1, "t", "d", "m", 200, 0.004)
    collector.observe(1, "t", "d", "m", 502, 0.2)
    collector.observe(1, "t", "d", "m", 429, 0.0001)
    collector.observe(1, "t", "d", "m", 404, 0.001)
    (bucket,) = collector.take().values()
    assert (bucket.requests, bucket.errors) == (4, 2)  # 5xx and 429 are errors; a client's 404 is not
    assert sum(bucket.histogram) == 4 and round(bucket.latency_sum_ms, 1) == 205.1
    assert stats.percentile_ms(bucket.histogram, 0.5) is not None
    assert collector.take() == {}
