"""One trace from the caller through the gateway into Triton (issue 34), on the real thing: uvicorn serving
portal.asgi with tracing on, a real Celery worker starting the deployment's Triton (sandboxed where this kernel can)
with OpenTelemetry tracing to the same collector, and a test collector (tests/support/otlp_collector.py, OTLP/HTTP)
receiving the gateway's spans (protobuf, from the Python SDK) and Triton's (JSON, from Triton's own exporter).
Another team's caller naming that trace learns nothing of it."""

from __future__ import annotations

import queue
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.deploying import deploy, push, wait_status
from tests.processes import GrpcGatewayProcess, wait_for
from tests.support import otlp_collector
from tests.support.people import Person
from tests.support.story import STORY, upload_story_models

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def trace_collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[otlp_collector.Collector]:
    """A collector, and the portal's processes (started after this fixture) pointed at it."""
    collector = otlp_collector.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # the gateway's spans exported within 0.2 s
    monkeypatch.setenv("OTEL_SERVICE_NAME", "modelport-test")
    try:
        yield collector
    finally:
        otlp_collector.stop(collector)


@pytest.fixture
def this_process_traced(trace_collector: otlp_collector.Collector) -> Iterator[None]:
    """The test's own process traced as the web server is (its Django test client is the portal's API here): the
    requests it makes queue the worker's tasks with their trace context."""
    from infra import tracing

    tracing.configure()
    tracing.instrument_portal()
    try:
        yield
    finally:
        tracing.shutdown()


def _infer_body() -> bytes:
    from models_registry.samples import digits_holdout

    X, _ = digits_holdout()
    import json

    return json.dumps({"inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32",
                                   "data": X[:2].astype(np.float32).ravel().tolist()}]}).encode()


def test_the_callers_trace_holds_the_gateways_span_and_tritons_and_another_team_learns_nothing(
    trace_collector: otlp_collector.Collector, people: dict[str, Person], portal_url: str,
    grpc_gateway: GrpcGatewayProcess, digits_onnx: Path, this_process_traced: None
) -> None:
    alice, charlie = people["alice"], people["charlie"]
    push(alice, digits_onnx)
    deploy(alice, "digits-prod", [{"model": "digits"}])
    wait_status(alice, "digits-prod", "ready")
    url = f"{portal_url}/serve/digits-prod/v2/models/digits/infer"
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    answer = requests.post(url, data=_infer_body(), timeout=30, headers={
        "Authorization": f"Bearer {alice.token}", "Content-Type": "application/json",
        "Accept-Encoding": "identity",  # the span counts the bytes sent, compressed or not: these, as read
        "traceparent": f"00-{trace_id}-{caller_span}-01"})
    assert answer.status_code == 200, answer.text
    assert not any(trace_id in f"{k}: {v}" for k, v in answer.headers.items())
    assert "traceparent" not in answer.headers and trace_id not in answer.text

    def joined() -> list[otlp_collector.Span] | None:
        spans = trace_collector.of_trace(trace_id)
        return spans if {"modelport-test", "triton-inference-server"} <= {s.service for s in spans} else None

    spans = wait_for(joined, 30, what="the gateway's and Triton's spans of the caller's trace")
    [gateway] = [s for s in spans if s.service == "modelport-test"]
    assert gateway.parent_span_id == caller_span and gateway.name == "POST infer"
    assert gateway.attributes["modelport.deployment"] == "digits-prod"
    assert gateway.attributes["modelport.team.id"] == alice.team.id
    assert gateway.attributes["modelport.model"] == "digits" and gateway.attributes["modelport.revision"] == 1
    assert gateway.attributes["http.response.status_code"] == 200
    assert gateway.attributes["http.response.body.size"] == len(answer.content)
    assert not any(alice.token in str(v) for v in gateway.attributes.values())
    triton = [s for s in spans if s.service == "triton-inference-server"]
    names = {s.name for s in triton}
    assert "InferRequest" in names and "compute" in names, names
    [request] = [s for s in triton if s.name == "InferRequest"]
    assert request.parent_span_id == gateway.span_id  # Triton's request span hangs under the gateway's

    # The same over gRPC: the caller's traceparent metadata, the gRPC gateway's span, Triton's under it.
    from models_registry.samples import digits_holdout

    grpc_trace = secrets.token_hex(16)
    tensor = grpcclient.InferInput("input", [2, 64], "FP32")
    tensor.set_data_from_numpy(digits_holdout()[0][:2].astype(np.float32))
    grpcclient.InferenceServerClient(grpc_gateway.address).infer("digits", [tensor], headers={
        "authorization": f"Bearer {alice.token}", "modelport-deployment": "digits-prod",
        "traceparent": f"00-{grpc_trace}-{caller_span}-01"})

    def joined_over_grpc() -> list[otlp_collector.Span] | None:
        spans = trace_collector.of_trace(grpc_trace)
        return spans if {"ModelInfer", "InferRequest"} <= {s.name for s in spans} else None

    over_grpc = wait_for(joined_over_grpc, 30, what="the gRPC gateway's and Triton's spans of the caller's trace")
    [grpc_span] = [s for s in over_grpc if s.name == "ModelInfer"]
    assert grpc_span.parent_span_id == caller_span and grpc_span.attributes["modelport.deployment"] == "digits-prod"
    assert grpc_span.attributes["modelport.status"] == 200
    [grpc_request] = [s for s in over_grpc if s.name == "InferRequest"]
    assert grpc_request.parent_span_id == grpc_span.span_id and grpc_request.service == "triton-inference-server"

    # A stream (ModelStreamInfer): the gRPC gateway's one span of the whole stream, in the caller's trace, and
    # Triton's span of each request sent on it under that one (the upstream stream call carries its traceparent).
    stream_trace = secrets.token_hex(16)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_gateway.address)
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers={
        "authorization": f"Bearer {alice.token}", "modelport-deployment": "digits-prod",
        "traceparent": f"00-{stream_trace}-{caller_span}-01"})
    for index in range(2):
        client.async_stream_infer("digits", [tensor], request_id=f"s{index}")
    for _ in range(2):
        assert answers.get(timeout=30)[1] is None
    client.stop_stream()

    def joined_stream() -> list[otlp_collector.Span] | None:
        spans = trace_collector.of_trace(stream_trace)
        names = [s.name for s in spans]
        return spans if "ModelStreamInfer" in names and names.count("InferRequest") >= 2 else None

    streamed = wait_for(joined_stream, 30, what="the gRPC stream's span and Triton's spans of its requests")
    [stream_span] = [s for s in streamed if s.name == "ModelStreamInfer"]
    assert stream_span.parent_span_id == caller_span and stream_span.attributes["modelport.stream.requests"] == 2
    assert {s.parent_span_id for s in streamed if s.name == "InferRequest"} == {stream_span.span_id}

    # The portal's own work: the upload's request (the Django instrumentation) and the inspection the worker ran for
    # it (the Celery instrumentation, the context carried in the task's headers) are one trace; so are the deploy's
    # request and the worker's reconcile passes.
    def task_of(request_name: str, task_name: str) -> tuple[otlp_collector.Span, otlp_collector.Span] | None:
        with trace_collector.lock:
            spans = list(trace_collector.spans)
        for request in [s for s in spans if s.name == request_name and s.service == "modelport-test"]:
            ids = {s.span_id for s in spans if s.trace_id == request.trace_id}
            for task in spans:
                if task.name == task_name and task.trace_id == request.trace_id and task.parent_span_id in ids:
                    return request, task
        return None

    upload, inspection = wait_for(lambda: task_of("POST api/v1/models/<str:name>/versions/",
                                                  "run/models_registry.tasks.inspect_version"),
                                  30, what="the upload's request and its inspection in one trace")
    assert upload.attributes["http.target"] == "/api/v1/models/<str:name>/versions/"
    assert not any(alice.token in str(v) for v in {**upload.attributes, **inspection.attributes}.values())
    wait_for(lambda: task_of("POST api/v1/deployments/", "run/deployments.tasks.reconcile_deployment"), 30,
             what="the deploy's request and a reconcile pass in one trace")

    # A caller that did not sample its trace: the gateway records nothing of it and sends Triton no traceparent, so
    # Triton (rate 0: it traces what comes with one, whatever its sampled flag) records nothing of it either
    # (docs/observability.md, "Sampling"). The sampled request after it shows Triton's exports got this far.
    unsampled, after = secrets.token_hex(16), secrets.token_hex(16)
    for trace, flag in ((unsampled, "00"), (after, "01")):
        assert requests.post(url, data=_infer_body(), timeout=30, headers={
            "Authorization": f"Bearer {alice.token}", "Content-Type": "application/json",
            "traceparent": f"00-{trace}-{caller_span}-{flag}"}).status_code == 200
    wait_for(lambda: [s for s in trace_collector.of_trace(after) if s.name == "InferRequest"], 30,
             what="Triton's spans of the sampled request after the unsampled one")
    assert trace_collector.of_trace(unsampled) == []

    # charlie (another team) sends alice's trace id: a 404 that names none of it, and a span of his own request
    # only, with no deployment on it; nothing of her trace reaches him.
    seen = len(trace_collector.of_trace(trace_id))
    refused = requests.post(url, data=_infer_body(), timeout=30, headers={
        "Authorization": f"Bearer {charlie.token}", "Content-Type": "application/json",
        "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
    assert refused.status_code == 404
    assert trace_id not in refused.text and not any(trace_id in f"{k}: {v}" for k, v in refused.headers.items())
    his = wait_for(lambda: (s := trace_collector.of_trace(trace_id))[seen:] and s[seen:], 10, what="charlie's span")
    assert [s.service for s in his] == ["modelport-test"]
    assert "modelport.deployment" not in his[0].attributes and his[0].attributes["http.response.status_code"] == 404
    # Triton's trace API is an admin API: the gateway does not pass it on, to the deployment's own team either.
    setting = requests.get(f"{portal_url}/serve/digits-prod/v2/trace/setting", timeout=10,
                           headers={"Authorization": f"Bearer {alice.token}"})
    assert setting.status_code in (403, 404) and trace_collector.url not in setting.text


def _events(url: str, headers: dict[str, str], body: dict[str, Any]) -> list[dict[str, Any]]:
    """A /generate_stream answer read to its end: each event's data."""
    import json

    answer = requests.post(url, json=body, headers=headers, stream=True, timeout=60)
    assert answer.status_code == 200, answer.text
    assert "traceparent" not in answer.headers
    events = [json.loads(line.removeprefix("data: ")) for line in answer.text.split("\n") if line.startswith("data: ")]
    assert events and not any("error" in e for e in events), events
    return events


def test_a_pipelines_steps_and_a_streamed_answer_join_the_callers_trace(
    trace_collector: otlp_collector.Collector, people: dict[str, Person], portal_url: str
) -> None:
    """The Proof's other two cases, on one Triton: a pipeline (an ensemble: Triton's spans of it and of each step in
    the caller's trace) and an HTTP streamed answer (/generate_stream of the sample text generator: the gateway's
    span and Triton's of the decoupled request in the caller's trace). The pipeline is the streaming one
    (tests/support/story.py), so its call is both."""
    alice = people["alice"]
    upload_story_models(alice)
    created = alice.client().post("/api/v1/models/story/versions/", {
        "format": "ensemble", "definition": STORY, "create_model": True}, format="json")
    assert created.status_code == 201, created.json()
    deploy(alice, "story", [{"model": "story"}])
    wait_status(alice, "story", "ready", timeout=180)
    base = f"{portal_url}/serve/story/v2/models"
    caller_span = secrets.token_hex(8)

    def traced(trace_id: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {alice.token}", "traceparent": f"00-{trace_id}-{caller_span}-01"}

    pipeline_trace = secrets.token_hex(16)
    events = _events(f"{base}/story/generate_stream", traced(pipeline_trace),
                     {"text_input": "menenius", "max_tokens": 3, "seed": 3})
    alone_trace = secrets.token_hex(16)
    alone = _events(f"{base}/textgen/generate_stream", traced(alone_trace),
                    {"text_input": "MENENIUS:\n", "max_tokens": 3, "seed": 3})

    def pieces(found: list[dict[str, Any]]) -> list[str]:  # text_output a list: several pieces in one event
        outputs = [e["text_output"] for e in found]
        return [p for output in outputs for p in (output if isinstance(output, list) else [output])]

    assert pieces(events) == pieces(alone)

    def joined(trace_id: str, models: set[str]) -> Any:
        def all_there() -> dict[str, otlp_collector.Span] | None:
            spans = trace_collector.of_trace(trace_id)
            named = {s.name: s for s in spans if s.name != "compute"}
            computes = [s for s in spans if s.name == "compute"]
            wanted = {"InferRequest", *models}
            if not (wanted <= set(named) and len(computes) >= len(models - {"story"})
                    and any(s.service == "modelport-test" for s in spans)):
                return None
            return {**named, "gateway": next(s for s in spans if s.service == "modelport-test")}
        return all_there

    # The pipeline: the gateway's span under the caller's, Triton's request span under it, the ensemble's span
    # under that, and each step's span (with its compute span) under the ensemble's.
    spans = wait_for(joined(pipeline_trace, {"story", "speaker", "textgen"}), 30,
                     what="the gateway's, the ensemble's and its steps' spans of the caller's trace")
    gateway = spans["gateway"]
    assert gateway.parent_span_id == caller_span and gateway.name == "POST generate_stream"
    assert gateway.attributes["modelport.model"] == "story" and gateway.attributes["http.response.status_code"] == 200
    assert spans["InferRequest"].parent_span_id == gateway.span_id
    assert spans["story"].parent_span_id == spans["InferRequest"].span_id
    assert spans["speaker"].parent_span_id == spans["textgen"].parent_span_id == spans["story"].span_id
    services = {s.service for s in trace_collector.of_trace(pipeline_trace)}
    assert services == {"modelport-test", "triton-inference-server"}

    # The generator alone, streamed: the gateway's span of the whole stream, Triton's of its decoupled request.
    spans = wait_for(joined(alone_trace, {"textgen"}), 30, what="the streamed answer's spans of the caller's trace")
    gateway = spans["gateway"]
    assert gateway.parent_span_id == caller_span and gateway.attributes["modelport.model"] == "textgen"
    assert gateway.attributes["http.response.body.size"] > 0
    assert spans["InferRequest"].parent_span_id == gateway.span_id
    assert spans["textgen"].parent_span_id == spans["InferRequest"].span_id
    [compute] = [s for s in trace_collector.of_trace(alone_trace) if s.name == "compute"]
    assert compute.parent_span_id == spans["textgen"].span_id
