"""The load generator wrapper: a real tuning/loadgen.py subprocess against a tiny HTTP server in this process, its
figures and its own CPU time; a load generator that fails is a MeasureFailed with its reason."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tuning import measure
from tuning.measure import run_loadgen
from tuning.search import MeasureFailed


class Answer(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers["Content-Length"]))
        status = 500 if self.path.endswith("/broken") else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answering_server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_it_measures_throughput_latency_and_its_own_cpu(answering_server: str) -> None:
    point = run_loadgen(f"{answering_server}/v2/models/m/infer", b'{"inputs": []}', 2, 1.0, 0.2)
    assert point.concurrency == 2
    assert point.requests > 0 and point.throughput > 0 and point.errors == 0
    assert point.p50_ms is not None and point.p99_ms is not None and point.p99_ms >= point.p50_ms
    assert point.loadgen_cpu_s > 0
    assert point.seconds >= 1.2


def test_error_answers_are_counted_not_measured(answering_server: str) -> None:
    point = run_loadgen(f"{answering_server}/broken", b"{}", 1, 0.5, 0.1)
    assert point.errors > 0 and point.requests == 0 and not point.meets(1000.0)


def test_a_load_generator_that_cannot_run_is_a_measure_failure(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    monkeypatch.setattr(measure, "LOADGEN", tmp_path / "missing.py")
    with pytest.raises(MeasureFailed, match=r"the load generator failed \(exit 2\).*missing.py"):
        run_loadgen("http://127.0.0.1:9/", b"{}", 1, 0.5, 0.1)
