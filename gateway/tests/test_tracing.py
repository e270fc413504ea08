"""The gateway's span of a request (gateway/traced.py, infra/tracing.py), read from the SDK's in-memory exporter: its
attributes, the caller's traceparent continued and Triton sent the gateway's own; the caller's sampling decision
holds for its request only; nothing of the trace goes back to the caller; and with tracing off, no tracer, no
span, no header. The real collector, gateway and Triton in one trace: tests/test_tracing_e2e.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from gateway.tests.fake_upstream import FakeUpstream, Request, json_response
from gateway.tests.stream_support import SSE_HEAD, event, streaming_deployment
from infra import tracing
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person
from tests.support.tracing_capture import traced

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
INFER = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}).encode()


def _answer(request: Request) -> bytes:
    return json_response({"model_name": "digits", "outputs": []})


def test_a_request_gets_a_span_continuing_the_callers_trace_and_triton_gets_its_context(
    people: dict[str, Person], gateway_app: Any
) -> None:
    async def scenario() -> None:
        async with FakeUpstream(_answer) as upstream:
            deployment = await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            token = people["alice"].token
            with traced() as exporter:
                reply = await call(gateway_app(), "POST", "/serve/digits-prod/v2/models/digits/infer", token=token,
                                   body=INFER, headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
                                                        "tracestate": "vendor=1"})
                spans = exporter.get_finished_spans()
            assert reply.status == 200
            [span] = spans
            context = span.get_span_context()
            assert context is not None
            assert f"{context.trace_id:032x}" == CALLER_TRACE
            assert span.parent is not None and f"{span.parent.span_id:016x}" == CALLER_SPAN
            assert span.name == "POST infer"
            attributes = dict(span.attributes or {})
            assert attributes == {
                "http.request.method": "POST", "modelport.team.id": people["alice"].team.id,
                "modelport.deployment": "digits-prod", "modelport.revision": 1, "modelport.model": "digits",
                "http.response.status_code": 200, "http.request.body.size": len(INFER),
                "http.response.body.size": len(reply.body),
            }
            assert deployment.name == "digits-prod"
            # Triton is sent the gateway's span as the parent of its own, never the caller's header as it came.
            [forwarded] = upstream.requests
            assert forwarded.headers[b"traceparent"] == f"00-{CALLER_TRACE}-{context.span_id:016x}-01".encode()
            assert b"tracestate" not in forwarded.headers
            # Nothing of the trace comes back to the caller.
            assert CALLER_TRACE.encode() not in b"".join(k + v for k, v in reply.headers.items()) + reply.body
            assert b"traceparent" not in reply.headers and b"traceresponse" not in reply.headers

    run(scenario)


def test_a_streamed_answer_is_one_span_from_the_request_to_its_last_event(
    people: dict[str, Person], gateway_app: Any
) -> None:
    pieces = [event("a"), event("b"), event("c")]
    stream = SSE_HEAD + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"

    async def scenario() -> None:
        async with FakeUpstream(lambda r: stream) as upstream:
            await asyncio.to_thread(streaming_deployment, people["alice"], upstream.url)
            with traced() as exporter:
                reply = await call(gateway_app(), "POST", "/serve/chat/v2/models/chat/generate_stream",
                                   token=people["alice"].token, body=b'{"text_input": "a"}',
                                   headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
                [span] = exporter.get_finished_spans()
            assert reply.status == 200 and reply.body.count(b"data: ") == 3
            assert span.name == "POST generate_stream"
            attributes = dict(span.attributes or {})
            assert attributes["modelport.deployment"] == "chat" and attributes["modelport.model"] == "chat"
            assert attributes["http.response.body.size"] == len(reply.body)  # every event, counted as it went
            assert attributes["http.request.body.size"] == len(b'{"text_input": "a"}')
            context = span.get_span_context()
            assert context is not None
            forwarded = upstream.requests[0].headers[b"traceparent"]
            assert forwarded == f"00-{CALLER_TRACE}-{context.span_id:016x}-01".encode()

    run(scenario)


def test_a_request_without_a_traceparent_starts_a_trace(people: dict[str, Person], gateway_app: Any) -> None:
    async def scenario() -> None:
        async with FakeUpstream(_answer) as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            with traced() as exporter:
                await call(gateway_app(), "POST", "/serve/digits-prod/v2/models/digits/infer",
                           token=people["alice"].token, body=INFER)
                [span] = exporter.get_finished_spans()
            assert span.parent is None
            context = span.get_span_context()
            assert context is not None
            assert upstream.requests[0].headers[b"traceparent"] == \
                f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}".encode()

    run(scenario)


def test_a_caller_that_did_not_sample_its_trace_is_not_recorded(people: dict[str, Person], gateway_app: Any) -> None:
    """The caller's context decides its own request's sampling (the default sampler is parent-based), and only that:
    the next request, without one, is recorded. Triton is sent no traceparent for the unsampled one (it would trace
    it whatever the flag), the gateway's span for the other."""
    async def scenario() -> None:
        async with FakeUpstream(_answer) as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            with traced() as exporter:
                await call(app, "POST", "/serve/digits-prod/v2/models/digits/infer", token=people["alice"].token,
                           body=INFER, headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"})
                assert exporter.get_finished_spans() == ()
                await call(app, "POST", "/serve/digits-prod/v2/models/digits/infer", token=people["alice"].token,
                           body=INFER)
                assert len(exporter.get_finished_spans()) == 1
            assert b"traceparent" not in upstream.requests[0].headers
            assert int(upstream.requests[1].headers[b"traceparent"][-2:], 16) & 1  # sampled

    run(scenario)


def test_a_refused_request_names_no_deployment_and_a_malformed_traceparent_starts_a_trace(
    people: dict[str, Person], gateway_app: Any
) -> None:
    async def scenario() -> None:
        async with FakeUpstream(_answer) as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            with traced() as exporter:
                # charlie (another team) names alice's deployment and her trace: a 404, and his own span only.
                reply = await call(gateway_app(), "POST", "/serve/digits-prod/v2/models/digits/infer",
                                   token=people["charlie"].token, body=INFER,
                                   headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
                no_token = await call(gateway_app(), "GET", "/serve/digits-prod/v2/models/digits",
                                      headers={"traceparent": "00-not-a-trace-01"})
                refused, anonymous = exporter.get_finished_spans()
            assert reply.status == 404 and no_token.status == 401
            assert CALLER_TRACE.encode() not in b"".join(k + v for k, v in reply.headers.items()) + reply.body
            assert dict(refused.attributes or {}) == {
                "http.request.method": "POST", "http.response.status_code": 404, "http.request.body.size": 0,
                "http.response.body.size": len(reply.body)}
            assert anonymous.parent is None and dict(anonymous.attributes or {})["http.response.status_code"] == 401
            assert upstream.requests == []

    run(scenario)


def test_with_tracing_off_there_is_no_tracer_no_span_and_no_header(
    people: dict[str, Person], gateway_app: Any
) -> None:
    assert tracing.tracer is None

    async def scenario() -> None:
        async with FakeUpstream(_answer) as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            await call(gateway_app(), "POST", "/serve/digits-prod/v2/models/digits/infer",
                       token=people["alice"].token, body=INFER,
                       headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
            assert b"traceparent" not in upstream.requests[0].headers

    run(scenario)


def test_without_an_endpoint_nothing_of_the_sdk_is_even_imported() -> None:
    code = ("import sys; from infra import tracing; assert tracing.configure() is None; "
            "tracing.instrument_portal(); "  # the Django and Celery instrumentation: nothing either
            "assert tracing.tracer is None; print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    env = {"PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                            timeout=60)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(("environ", "url"), [
    ({}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, "http://collector:4318/v1/traces"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9/x"},
     "http://t:9/x"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, None),
])
def test_the_collector_url_follows_the_exporters_rule(environ: dict[str, str], url: str | None) -> None:
    assert tracing.traces_url(environ) == url


def test_the_service_name_and_sampler_come_from_the_standard_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging")
    with traced():
        assert tracing.provider is not None
        assert tracing.provider.resource.attributes["service.name"] == "modelport"
        assert tracing.provider.resource.attributes["deployment.environment"] == "staging"
        assert "0.25" in tracing.provider.sampler.get_description()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "portal-eu")
    with traced():
        assert tracing.provider is not None
        assert tracing.provider.resource.attributes["service.name"] == "portal-eu"
