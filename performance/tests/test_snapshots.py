"""A snapshot pass against a stand-in for Triton's statistics endpoint (an HTTP server on a real socket answering
what Triton 2.51 answers; the real Triton's is tests/test_performance_e2e.py): one row per serving revision, a
pool's answer split by prefix, a server that does not answer skipped, and rows past the longest window removed."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.utils import timezone

from deployments.models import Deployment
from deployments.pool_names import name_prefix
from performance import snapshots
from performance.models import TritonSnapshot
from performance.tests.statistics import triton_row
from performance.windows import LONGEST

ANSWER: dict[str, Any] = {"model_stats": []}


class _Stats(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        body = json.dumps(ANSWER).encode() if self.path == "/v2/models/stats" else b"{}"
        self.send_response(200 if self.path == "/v2/models/stats" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stats_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stats)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def serve(deployment: Deployment, url: str) -> Deployment:
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=deployment.revision, upstream_url=url)
    deployment.refresh_from_db()
    return deployment


def test_a_pass_stores_one_row_per_serving_revision_with_its_models(deployment: Deployment,
                                                                     stats_server: str) -> None:
    deployment = serve(deployment, stats_server)
    ANSWER["model_stats"] = [triton_row("digits", 12, queue_ns=12_000), triton_row("someone-else", 99)]

    assert snapshots.take_snapshots() == 1

    row = TritonSnapshot.objects.get()
    assert row.deployment == deployment and row.revision == deployment.revision.number
    assert list(row.counters) == ["digits"]
    assert row.counters["digits"]["d"]["queue"] == [12, 12_000]


def test_a_pools_answer_is_split_by_the_revisions_prefix(deployment: Deployment, stats_server: str) -> None:
    deployment = serve(deployment, stats_server)
    spec = deployment.revision.spec.to_json()
    spec["placement"] = {"mode": "shared", "pool": "shared"}
    spec["spec_version"] = 3
    from deployments.revision_spec import RevisionSpec

    type(deployment.revision).objects.filter(pk=deployment.revision.pk).update(spec=RevisionSpec.from_json(spec))
    prefix = name_prefix(deployment.pk, deployment.revision.number)
    ANSWER["model_stats"] = [triton_row(prefix + "digits", 5), triton_row("digits", 50),
                             triton_row(name_prefix(deployment.pk + 1, 1) + "digits", 7)]

    snapshots.take_snapshots()

    assert TritonSnapshot.objects.get().counters["digits"]["d"]["success"][0] == 5


def test_a_triton_that_does_not_answer_is_skipped(deployment: Deployment) -> None:
    serve(deployment, "http://127.0.0.1:9")  # the discard port: nothing listens

    assert snapshots.take_snapshots() == 0
    assert not TritonSnapshot.objects.exists()


def test_a_stopped_deployment_is_not_read(deployment: Deployment, stats_server: str) -> None:
    deployment = serve(deployment, stats_server)
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=Deployment.Desired.STOPPED)

    assert snapshots.take_snapshots() == 0


def test_rows_past_the_longest_window_are_removed(deployment: Deployment, settings: Any) -> None:
    now = timezone.now()
    for age in (LONGEST + timedelta(hours=1), LONGEST - timedelta(minutes=5)):
        TritonSnapshot.objects.create(deployment=deployment, revision=1, taken_at=now - age, counters={})

    assert snapshots.prune(now) == 1
    assert TritonSnapshot.objects.count() == 1


def test_an_answer_past_the_size_bound_is_not_read(stats_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ANSWER["model_stats"] = [triton_row(f"m{i}", 1) for i in range(50)]
    monkeypatch.setattr(snapshots, "MAX_ANSWER_BYTES", 1000)

    assert snapshots.fetch(stats_server) is None


def test_a_pass_reads_for_a_bounded_time_and_leaves_the_rest_for_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    def slow(url: str, timeout: float = 0.0) -> Any:
        time.sleep(0.3)
        return {"model_stats": []}

    monkeypatch.setattr(snapshots, "fetch", slow)
    monkeypatch.setattr(snapshots, "MAX_PARALLEL", 2)
    started = time.monotonic()

    answers = snapshots.fetch_all([f"http://t{i}" for i in range(10)], pass_seconds=0.1)

    assert time.monotonic() - started < 0.5 and len(answers) < 10


def test_beat_takes_snapshots_on_the_reconcile_lane(settings: Any) -> None:
    from infra.queues import ROUTES, Queue

    [entry] = [e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "performance.tasks.take_snapshots"]
    assert entry["schedule"] == settings.PERFORMANCE_SNAPSHOT_SECONDS and entry["options"]["expires"]
    assert ROUTES["performance.tasks.take_snapshots"]["queue"] == Queue.RECONCILE
