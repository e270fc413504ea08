"""The local Tritons' metrics relayed by the portal's /metrics (deployments/triton_metrics.py): each sample labelled
with its server's team, deployment and revision, one family per name whichever servers hold it, and a server that
does not answer left out of the scrape instead of failing it."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from deployments import triton_metrics
from deployments.models import Deployment, TritonServer
from deployments.triton_metrics import Target

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
