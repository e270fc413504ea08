"""The local Tritons' metrics relayed by the portal's /metrics (deployments/triton_metrics.py): each sample labelled
with its server's team, deployment and revision, one family per name whichever servers hold it, and a server that
does not answer left out of the scrape instead of failing it."""

from __future__ import annotations

import dataclasses
import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from deployments import triton_metrics
from deployments.models import Deployment, PoolServer, TritonServer
from deployments.pools import shared_pool
from deployments.triton_metrics import Target
from gateway.tests.pool_support import shared_deployment

TRITON = """# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="digits",version="1"} %d
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="digits",version="1"} 1200
"""


def test_each_sample_gets_its_servers_labels_and_each_name_one_family() -> None:
    answers = {"http://a/metrics": TRITON % 3, "http://b/metrics": TRITON % 5}
    found = [Target("acme", "digits-prod", 2, "http://a/metrics"), Target("acme", "digits-prod", 3, "http://b/metrics")]
    text = triton_metrics.exposition(found, lambda url, timeout: answers[url]).decode()
    assert text.count("# TYPE nv_inference_request_success counter") == 1
    samples = {(s.labels["revision"], s.value) for f in text_string_to_metric_families(text) for s in f.samples
               if f.name == "nv_inference_request_success"}
    assert samples == {("2", 3.0), ("3", 5.0)}
    # Triton's names as Triton gives them (prometheus_client's writer would add _total to a counter's).
    assert ('\nnv_inference_queue_duration_us{team="acme",deployment="digits-prod",revision="2",model="digits",'
            'version="1"} 1200\n') in text


def test_a_server_that_does_not_answer_is_left_out() -> None:
    def read(url: str, timeout: float) -> str:
        if "gone" in url:
            raise ConnectionRefusedError(url)
        return TRITON % 1

    found = [Target("acme", "a", 1, "http://gone/metrics"), Target("acme", "b", 1, "http://up/metrics")]
    text = triton_metrics.exposition(found, read).decode()
    assert 'deployment="b"' in text and 'deployment="a"' not in text
    assert triton_metrics.exposition([], read) == b""


@pytest.mark.django_db
def test_the_portals_metrics_relay_the_ready_servers_of_every_team(deployment: Deployment, settings: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    settings.METRICS_TOKEN, settings.METRICS_OPEN = "", True
    for state, port in ((TritonServer.State.READY, 9101), (TritonServer.State.STOPPED, 9102)):
        TritonServer.objects.create(deployment=deployment, revision=deployment.revision, pid=2**22 + port,
                                    http_port=1, grpc_port=2, metrics_port=port, log_path="/dev/null", state=state)
    asked: list[str] = []
    monkeypatch.setattr(triton_metrics, "fetch", lambda url, timeout: asked.append(url) or TRITON % 7)
    body = Client().get("/metrics").content.decode()
    assert asked == ["http://127.0.0.1:9101/metrics"]  # the stopped one is not asked
    assert ('\nnv_inference_request_success{team="acme",deployment="digits-prod",revision="1",model="digits",'
            'version="1"} 7\n') in body
    assert "modelport_gateway_requests_total" in body


# A pool's Triton holding alice's (acme) digits-a r1 as d1-r1-digits and charlie's (globex) digits-c r2 as
# d2-r2-digits, and names no revision of the pool has: a model beside alice's prefix that her revision lacks, and a
# prefix of a revision that is not in the pool.
POOL = """# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="d1-r1-digits",version="1"} 3
nv_inference_request_success{model="d2-r2-digits",version="1"} 5
nv_inference_request_success{model="d1-r1-other",version="1"} 11
nv_inference_request_success{model="d9-r1-digits",version="1"} 13
nv_inference_request_success{model="digits",version="1"} 17
nv_inference_request_success{version="1",model="d2-r2-digits",team="acme"} 19
nv_inference_request_success{model="d2-r2-digits",version="1"
nv_inference_request_success{model="d2-r2-digits",version="1"} 1 2 3
# HELP nv_pinned_memory_pool_total_bytes Pinned memory pool total memory size, in bytes
# TYPE nv_pinned_memory_pool_total_bytes gauge
nv_pinned_memory_pool_total_bytes 268435456
# TYPE nv_cpu_memory_used_bytes gauge
nv_cpu_memory_used_bytes{} 1e+09
"""


def pool_target() -> triton_metrics.PoolTarget:
    return triton_metrics.PoolTarget("shared", "http://pool/metrics", {
        "d1-r1-": triton_metrics.PooledRevision("acme", "digits-a", 1, frozenset({"digits"})),
        "d2-r2-": triton_metrics.PooledRevision("globex", "digits-c", 2, frozenset({"digits"}))})


def relayed_samples(text: str) -> dict[float, dict[str, str]]:
    return {s.value: s.labels for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_pools_samples_go_each_to_its_revisions_team_and_the_servers_to_the_pool() -> None:
    text = triton_metrics.exposition([pool_target()], lambda url, timeout: POOL).decode()
    assert relayed_samples(text) == {
        3.0: {"team": "acme", "deployment": "digits-a", "revision": "1", "pool": "shared", "model": "digits",
              "version": "1"},
        5.0: {"team": "globex", "deployment": "digits-c", "revision": "2", "pool": "shared", "model": "digits",
              "version": "1"},
        268435456.0: {"pool": "shared"},
        1e9: {"pool": "shared"},
    }
    # Never a guess: names of no revision the pool knows, a label the relay sets, broken lines are all left out.
    for value in (" 11", " 13", " 17", " 19", "2 3"):
        assert value + "\n" not in text
    assert text.count("# TYPE nv_inference_request_success counter") == 1


def test_a_dedicated_servers_samples_that_would_break_the_scrape_are_dropped() -> None:
    hostile = (TRITON % 3) + ('nv_custom{team="globex"} 1\nnv_custom{a="b",a="c"} 2\nnv_custom{a="b" 3\n'
                              'nv_custom{a="' + "x" * 300 + '"} 4\nnv_custom 1_0\n# TYPE nv_custom nonsense\n')
    text = triton_metrics.exposition([Target("acme", "a", 1, "http://a/metrics")],
                                     lambda url, timeout: hostile).decode()
    assert "nv_custom" not in text
    assert set(relayed_samples(text)) == {3.0, 1200.0}


def test_a_servers_sample_under_the_portals_own_names_is_dropped() -> None:
    # A python model's custom metric claiming that another team's revision is loaded in its pool (the series the rules
    # join a cluster pool's series on) or passing for the gateway's figures.
    spoof = (TRITON % 3) + (
        "# HELP modelport_pool_model_info spoofed\n# TYPE modelport_pool_model_info gauge\n"
        'modelport_pool_model_info{pool_model="d1-r1-digits",model="digits"} 1\n'
        'modelport_gateway_requests_total{code="200"} 7\n'
        "nv_custom_after 5\n")
    text = triton_metrics.exposition([Target("acme", "a", 1, "http://a/metrics")],
                                     lambda url, timeout: spoof).decode()
    assert "modelport_" not in text
    assert set(relayed_samples(text)) == {3.0, 1200.0, 5.0}
    # What follows a dropped family is passed on as its own, not under the family before it.
    assert "# TYPE nv_inference_queue_duration_us counter\nnv_inference_queue_duration_us" in text


HUGE_LINE = b'nv_inference_request_success{model="d1-r1-digits",version="1"} 1\n'


class _Hostile(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        if self.path == "/slow-head/metrics":
            self.trickle(b"X")
            return
        self.end_headers()
        if self.path == "/huge/metrics":
            self.wfile.write(HUGE_LINE * (triton_metrics.MAX_BYTES // len(HUGE_LINE) + 100))
            return
        self.wfile.write(b"nv_cpu_memory_used_bytes 1\n")
        self.trickle(b"#")

    def trickle(self, byte: bytes) -> None:
        """A byte at a time, each in time for a read's timeout, all together slower than any bound."""
        try:
            for _ in range(100):
                self.wfile.write(byte)
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass  # the relay hung up, as it should

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        pass


@pytest.fixture
def hostile_triton() -> Iterator[str]:
    """A metrics server that answers too much or too slowly, in a thread: its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_huge_or_slow_answer_is_cut_at_its_bounds(hostile_triton: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_metrics, "MAX_BYTES", 100_000)
    target = dataclasses.replace(pool_target(), url=f"{hostile_triton}/huge/metrics")
    text = triton_metrics.exposition([target]).decode()
    # The lines whole within the bound, relabelled; the one cut there left out.
    assert text.count("\n") == 100_000 // len(HUGE_LINE)
    assert text.endswith('model="digits",version="1"} 1\n')

    started = time.monotonic()
    text = triton_metrics.fetch(f"{hostile_triton}/slow/metrics", 0.5)
    assert time.monotonic() - started < 0.8  # the 5 s trickle cut at the timeout, not at each read's
    assert text == "nv_cpu_memory_used_bytes 1\n"
    started = time.monotonic()
    with pytest.raises(ValueError, match="no whole answer"):
        triton_metrics.fetch(f"{hostile_triton}/slow-head/metrics", 0.5)  # its headers never end
    assert time.monotonic() - started < 0.8


@pytest.mark.django_db
def test_the_portals_metrics_relay_each_pool_server_split_among_its_loads(alice: Any, charlie: Any, settings: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    settings.METRICS_TOKEN, settings.METRICS_OPEN = "", True
    mine = shared_deployment(alice, "digits-a", "")
    theirs = shared_deployment(charlie, "digits-c", "")
    pool = shared_pool()
    PoolServer.objects.create(pool=pool, pid=2**22, http_port=1, grpc_port=2, metrics_port=9103, log_path="/dev/null",
                              admin_key="k")
    PoolServer.objects.create(pool=pool, pid=2**22 + 1, http_port=1, grpc_port=2, metrics_port=9104,
                              log_path="/dev/null", admin_key="k", state=PoolServer.State.STOPPED)
    text = (f'nv_inference_request_success{{model="d{mine.pk}-r1-digits",version="1"}} 3\n'
            f'nv_inference_request_success{{model="d{theirs.pk}-r1-digits",version="1"}} 5\n'
            f'nv_inference_request_success{{model="d{theirs.pk + 1}-r1-digits",version="1"}} 7\n')
    asked: list[str] = []

    def fetch(url: str, timeout: float) -> str:
        asked.append(url)
        return text

    monkeypatch.setattr(triton_metrics, "fetch", fetch)
    body = Client().get("/metrics").content.decode()
    assert asked == ["http://127.0.0.1:9103/metrics"]
    assert sorted((s.labels["team"], s.labels["pool"], s.value) for f in text_string_to_metric_families(body)
                  for s in f.samples if f.name == "nv_inference_request_success") == [
        (alice.team.name, "shared", 3.0), (charlie.team.name, "shared", 5.0)]  # the 7 is of no revision there
    assert (f'\nnv_inference_request_success{{team="{alice.team.name}",deployment="digits-a",revision="1",'
            'pool="shared",model="digits",version="1"} 3\n') in body
