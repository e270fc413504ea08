"""platform/observability against a real Prometheus (Debian's `prometheus`, `make observability-deps`): it scrapes a
running portal's /metrics (pytest-django's live server, with METRICS_TOKEN as its bearer token) and a real Triton
that has answered requests, evaluates the rules, and answers every dashboard query without an error, the main ones
with series.

Triton's series reach Prometheus through the portal, as the local runtime's do, labelled team, deployment and
revision by it (and relayed as a pool's server too, whose series of no known revision are dropped and whose own
are labelled pool); on a cluster the scrape config's relabelling gives the same labels from the pod's
(prometheus/prometheus-scrape.yml), and Debian's Prometheus is built without Kubernetes discovery, so that part is
not run here."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from deployments.models import Deployment, PoolServer, TritonServer
from deployments.pool_models import Pool
from deployments.runtimes.local import readiness
from deployments.runtimes.local import triton as lt
from deployments.spec import RepositorySpec
from deployments.tests.local_triton import infer, matmul_onnx, onnx_model, runtime_env, start
from gateway.stats import StatsCollector
from gateway.stream_figures import COMPLETE
from tests.support.observability import RULES, dashboard_queries, require_binary, triton_metric_names

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]

TOKEN = "observability-" + "k" * 24
SCRAPE_SECONDS = 1
# A rate needs two samples in its range: Grafana's $__rate_interval is at least four scrape intervals.
RATE_INTERVAL = "15s"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def answered_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lt.ServerProcess]:
    """A real Triton serving "matmul", which has answered a few requests (so its counters have series)."""
    env = runtime_env()
    work = tmp_path_factory.mktemp("observed-triton")
    (work / "artifacts").mkdir()
    spec = RepositorySpec(models=(onnx_model("matmul", matmul_onnx(work / "artifacts" / "matmul.onnx")),))
    process = start(env, spec, work / "triton")
    try:
        assert readiness.wait_ready(process, ["matmul"], timeout=120).ready
        for _ in range(5):
            infer(process, "matmul", {"x": np.ones((2, 4), np.float32)}, "y")
        yield process
    finally:
        lt.stop_server(process.pid, grace_seconds=10)


def test_triton_serves_every_metric_of_the_inventory(answered_triton: lt.ServerProcess) -> None:
    """platform/observability/triton-metrics.txt, which the metric-name test trusts, is what this Triton serves."""
    url = f"http://127.0.0.1:{answered_triton.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        served = {family.name for family in text_string_to_metric_families(response.read().decode())}
    # The parser names a counter's family without its _total; Triton's counters have none.
    assert triton_metric_names() <= served, sorted(triton_metric_names() - served)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


@pytest.fixture
def scraping_prometheus(tmp_path: Path, live_server: Any, settings: Any, deployment: Deployment,
                        answered_triton: lt.ServerProcess) -> Iterator[str]:
    """A real Prometheus scraping the live portal (with its token), which relays the Triton as the local runtime's
    server of alice's digits-prod (deployments/triton_metrics.py), with the rules loaded: its URL."""
    binary = require_binary("prometheus")
    settings.METRICS_TOKEN, settings.METRICS_OPEN = TOKEN, False
    assert deployment.revision is not None
    TritonServer.objects.create(deployment=deployment, revision=deployment.revision, pid=answered_triton.pid,
                                http_port=answered_triton.http_port, grpc_port=answered_triton.grpc_port,
                                metrics_port=answered_triton.metrics_port, log_path=str(answered_triton.log_path),
                                state=TritonServer.State.READY)
    (tmp_path / "token").write_text(TOKEN)
    portal = urllib.parse.urlsplit(live_server.url).netloc
    config = {
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "modelport-portal", "authorization": {"credentials_file": str(tmp_path / "token")},
             "static_configs": [{"targets": [portal]}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    process = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2):
                    break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def query(prometheus: str, expr: str) -> list[Any]:
    answer = get_json(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert answer["status"] == "success", (expr, answer)
    result: list[Any] = answer["data"]["result"]
    return result


def test_the_dashboards_queries_run_against_prometheus_scraping_the_portal_and_triton(
    scraping_prometheus: str, answered_triton: lt.ServerProcess
) -> None:
    pool = Pool.objects.create(name="acme-own", memory_budget_bytes=2**30)
    # The same Triton relayed as the pool's server too (deployments/triton_metrics.py): its "matmul" is no pool name
    # of a revision loaded there, so only the server's own series come, labelled with the pool.
    PoolServer.objects.create(pool=pool, pid=answered_triton.pid, http_port=answered_triton.http_port,
                              grpc_port=answered_triton.grpc_port, metrics_port=answered_triton.metrics_port,
                              log_path=str(answered_triton.log_path), admin_key="unused")
    collector = StatsCollector()
    stream = collector.stream(1, "acme", "digits-prod", 1, time.perf_counter())
    for second in range(8):
        # Traffic through the gateway while Prometheus scrapes, one request in four failing.
        for code in (200, 200, 200, 503):
            collector.observe(1, "acme", "digits-prod", "matmul", code, 0.004, 1)
        stream.piece(10)
        infer(answered_triton, "matmul", {"x": np.ones((1, 4), np.float32)}, "y")
        if second == 4:
            stream.ended(COMPLETE)
            collector.take()
        time.sleep(SCRAPE_SECONDS)

    targets = get_json(f"{scraping_prometheus}/api/v1/targets")["data"]["activeTargets"]
    assert {(t["labels"]["job"], t["health"]) for t in targets} == {("modelport-portal", "up")}, targets

    values = {"$__rate_interval": RATE_INTERVAL, "$team": "acme", "$deployment": "digits-prod", "$revision": "1"}
    expected = {
        "modelport-overview.json: Requests per second, by deployment",
        "modelport-overview.json: Pools: memory reserved of the budget",
        "modelport-overview.json: Tritons: CPU memory used",
        "modelport-overview.json: Celery queues: messages waiting",
        "modelport-deployment.json: Requests per second, by revision and status code",
        "modelport-deployment.json: Gateway latency p50 / p95 / p99",
        "modelport-deployment.json: Where the time goes in Triton, per request (revision, model)",
        "modelport-deployment.json: Batch size Triton formed (inferences per execution)",
        "modelport-deployment.json: Streams: pieces per second, and how they ended",
    }
    # The panels on Triton read recorded 1-minute rates, which exist once the rules have been evaluated over two
    # scrapes of the portal: on a loaded machine that can come after the traffic above, so poll for them.
    deadline = time.monotonic() + 60
    while True:
        answered = {}
        for where, expr in dashboard_queries():
            for variable, value in values.items():
                expr = expr.replace(variable, value)
            answered[where] = query(scraping_prometheus, expr)  # every query runs without an error, every time
        with_series = {where for where, result in answered.items() if result}
        if expected <= with_series or time.monotonic() > deadline:
            break
        time.sleep(SCRAPE_SECONDS)
    assert expected <= with_series, sorted(set(answered) - with_series)

    # The rules evaluate without an error, and the recorded error ratio is the one the gateway counted.
    groups = get_json(f"{scraping_prometheus}/api/v1/rules")["data"]["groups"]
    assert {(rule["name"], rule["health"], rule.get("lastError", "")) for group in groups
            for rule in group["rules"] if rule["health"] != "ok"} == set()
    ratio = query(scraping_prometheus, 'modelport:gateway_error_ratio:rate5m{team="acme",deployment="digits-prod"}')
    assert len(ratio) == 1 and float(ratio[0]["value"][1]) == pytest.approx(0.25, abs=0.02)
    assert query(scraping_prometheus, 'modelport:triton_queue_compute:ratio1m{deployment="digits-prod"}')
    # The portal's state (deployments/portal_metrics.py), read from its database and broker at each scrape.
    pool = query(scraping_prometheus, 'modelport:pool_memory_reserved:ratio{pool="acme-own"}')
    assert [float(sample["value"][1]) for sample in pool] == [0.0]
    rollbacks = query(scraping_prometheus, 'modelport:canary_rollbacks:increase10m{deployment="digits-prod"}')
    assert [(r["metric"]["team"], float(r["value"][1])) for r in rollbacks] == [("acme", 0.0)]
    memory = query(scraping_prometheus, 'nv_cpu_memory_used_bytes{pool="acme-own"}')
    assert [sorted(set(sample["metric"]) - {"instance", "job"}) for sample in memory] == [["__name__", "pool"]]
    assert query(scraping_prometheus, 'nv_inference_request_success{pool="acme-own"}') == []
    queues = query(scraping_prometheus, "modelport:worker_queue_messages:max")
    assert {sample["metric"]["queue"] for sample in queues} == {"reconcile", "inspection", "build", "import", "tune"}

