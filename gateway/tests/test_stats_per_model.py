"""The gateway's stored buckets are kept per model called (its name in the deployment), for the performance panel's
gateway share per model: a name the deployment lacks adds no key of its own (hostile callers cannot grow the rows),
the stats API's answers stay the totals over the models, and a flush takes the same queries for one key as for many."""

from __future__ import annotations

import asyncio
import secrets
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext

from gateway import stats
from gateway.models import RequestStats
from gateway.tests.fake_upstream import FakeUpstream
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person


def test_requests_for_models_the_deployment_lacks_add_no_key(people: dict[str, Person], gateway_app: Any) -> None:
    alice = people["alice"]

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            deployment = await asyncio.to_thread(make_deployment, alice, "keys-test", upstream.url,
                                                 ("digits", "resnet"))
            app = gateway_app()
            for name in ["digits", "digits", "resnet"]:
                await call(app, "POST", f"/serve/keys-test/v2/models/{name}/infer", token=alice.token,
                           body=b'{"inputs": []}')
            hostile = [secrets.token_hex(8) for _ in range(50)] + ["x" * 300, "(other)", "digits/../resnet"]
            for name in hostile:
                await call(app, "POST", f"/serve/keys-test/v2/models/{name}/infer", token=alice.token,
                           body=b'{"inputs": []}')
            await call(app, "GET", "/serve/keys-test/v2/health/ready", token=alice.token)
            buckets = app.collector.take()
            assert {key[2] for key in buckets} <= {"digits", "resnet", ""}
            await asyncio.to_thread(stats.flush, buckets)
            rows = await asyncio.to_thread(lambda: list(RequestStats.objects.filter(deployment=deployment)))
            per_model: dict[str, int] = {}
            for row in rows:
                per_model[row.model] = per_model.get(row.model, 0) + row.requests
            assert per_model["digits"] == 2 and per_model["resnet"] == 1
            assert set(per_model) == {"digits", "resnet", ""}  # the hostile names and /health all under ""
            assert per_model[""] == len(hostile) + 1

    run(scenario)


@pytest.mark.django_db
def test_the_stats_api_answers_the_totals_over_the_models(alice: Person) -> None:
    deployment = make_deployment(alice, "totals", "http://127.0.0.1:9", ("digits", "resnet"))
    collector = stats.StatsCollector()
    for model, code in (("digits", 200), ("digits", 502), ("resnet", 200), ("", 404)):
        collector.observe(deployment.pk, alice.team.name, "totals", model, code, 0.004, 1)
    stats.flush(collector.take())

    body = alice.client().get("/api/v1/deployments/totals/metrics/?minutes=5").json()

    assert RequestStats.objects.filter(deployment=deployment).count() == 3  # digits, resnet, none: one bucket each
    assert body["requests"] == 4 and body["errors"] == 1
    assert body["codes"] == {"200": 2, "404": 1, "502": 1}
    [point] = body["series"]  # the models' rows of one bucket are one point
    assert point["requests"] == 4
    assert body["revisions"]["1"]["requests"] == 4


def _observe_many(collector: stats.StatsCollector, deployment: Any, models: tuple[str, ...]) -> None:
    for revision in (1, 2):
        for model in models:
            collector.observe(deployment.pk, "t", deployment.name, model, 200, 0.004, revision)


@pytest.mark.django_db
def test_a_flush_takes_the_same_queries_for_one_key_as_for_many(alice: Person) -> None:
    models = ("a", "b", "c", "d", "e", "f")
    deployment = make_deployment(alice, "cheap", "http://127.0.0.1:9", models)
    counts: list[int] = []
    for chosen in (models[:1], models, models):  # new rows, new rows, then merged into the rows there
        other = make_deployment(alice, f"cheap-{len(counts)}", "http://127.0.0.1:9", models)
        target = deployment if len(counts) == 2 else other
        collector = stats.StatsCollector()
        _observe_many(collector, target, chosen)
        buckets = collector.take()
        with CaptureQueriesContext(connection) as captured:
            stats.flush(buckets)
        counts.append(len(captured))
    assert counts[0] == counts[1], counts  # 2 keys or 12: the same queries
    assert counts[2] <= counts[1], counts
    rows = RequestStats.objects.filter(deployment=deployment)
    assert rows.count() == 12 and {r.requests for r in rows} == {1}


@pytest.mark.django_db
def test_a_flush_merges_into_the_rows_there_and_a_retried_insert_counts_once(
        alice: Person, monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = make_deployment(alice, "merge", "http://127.0.0.1:9", ("digits",))
    collector = stats.StatsCollector()
    collector.observe(deployment.pk, "t", "merge", "digits", 200, 0.004, 1)
    stats.flush(collector.take())
    collector.observe(deployment.pk, "t", "merge", "digits", 502, 0.2, 1)
    collector.observe(deployment.pk, "t", "merge", "", 404, 0.001, 1)
    buckets = collector.take()
    # Another gateway process inserted a key first: the insert fails, the whole flush is tried again.
    real = RequestStats.objects.bulk_create
    failures = [IntegrityError("another process inserted it")]

    def bulk_create(objs: Any, *args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(objs, *args, **kwargs)

    monkeypatch.setattr(RequestStats.objects, "bulk_create", bulk_create)
    stats.flush(buckets)

    digits = RequestStats.objects.get(deployment=deployment, model="digits")
    assert (digits.requests, digits.errors) == (2, 1) and digits.codes == {"200": 1, "502": 1}
    assert sum(digits.latency_histogram) == 2 and round(digits.latency_sum_ms, 1) == 204.0
    assert RequestStats.objects.get(deployment=deployment, model="").requests == 1
    summary = stats.summarize(list(RequestStats.objects.filter(deployment=deployment)), timedelta(minutes=5))
    assert summary["requests"] == 3


def test_the_stored_key_is_the_label_never_an_unknown_name() -> None:
    assert stats.model_key("digits") == "digits"
    assert stats.model_key(stats.OTHER_MODEL) == ""
    assert stats.model_key("") == ""
    assert stats.model_key("m" * 64) == ""


def test_gateway_processes_flushing_the_same_keys_at_once_count_every_request_once(
        people: dict[str, Person]) -> None:
    # Each thread is a gateway process of its own (its own connection): they insert the same new keys, in either
    # order, and merge into each other's rows.
    deployment = make_deployment(people["alice"], "at-once", "http://127.0.0.1:9", ("a", "b", "c"))
    start = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    failures: list[str] = []
    threads_n, flushes = 6, 10

    def gateway_process(index: int) -> None:
        try:
            for n in range(flushes):
                models = ["a", "b", "c", ""] if (index + n) % 2 else ["", "c", "b", "a"]
                buckets: dict[stats.Key, stats._Bucket] = {}
                for model in models:
                    for revision in (1, 2):
                        bucket = buckets[(deployment.pk, revision, model, start)] = stats._Bucket(requests=1)
                        bucket.codes["200"] = 1
                        bucket.histogram[3] += 1
                stats.flush(buckets)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=gateway_process, args=(index,)) for index in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    rows = list(RequestStats.objects.filter(deployment=deployment))
    assert len(rows) == 8  # 4 model keys x 2 revisions, one bucket
    expected = threads_n * flushes
    assert {r.requests for r in rows} == {expected} and {r.codes["200"] for r in rows} == {expected}
    assert {sum(r.latency_histogram) for r in rows} == {expected}
