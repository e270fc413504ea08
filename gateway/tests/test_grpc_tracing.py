"""The gRPC gateway's span of a unary call and of a ModelStreamInfer stream (gateway/traced.py), read from the SDK's
in-memory exporter: the caller's `traceparent` metadata continued, Triton sent the gateway's span in the same
metadata (every upstream call of a stream, a decoupled request's own included), the call's attributes; with tracing
off, no metadata. A real Triton's spans joining a unary call's: tests/test_tracing_e2e.py."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import pytest

from gateway.tests.grpc_fake_upstream import piece_reply
from gateway.tests.grpc_support import (
    PREFIX,
    chat_request,
    deploy_streaming,
    infer_request,
    is_chat,
    meta,
    next_answer,
    open_stream,
    settles,
    stack,
)
from tests.support.gateway_calls import make_deployment, run
from tests.support.people import Person
from tests.support.tracing_capture import traced

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture(autouse=True)
def _grpc_tracing_settings(settings: Any) -> None:
    settings.GATEWAY_CACHE_TTL_SECONDS = 0.5
    settings.GATEWAY_RATE_LIMIT_PER_SECOND = 1000
    settings.GATEWAY_RATE_LIMIT_BURST = 1000
    settings.GATEWAY_MAX_STREAMS_PER_TEAM = 4


def _deploy(person: Person, target: str) -> None:
    from deployments.models import Deployment

    deployment = make_deployment(person, "digits-prod", "http://127.0.0.1:9")
    Deployment.objects.filter(pk=deployment.pk).update(grpc_upstream=target)


def test_a_unary_call_gets_a_span_in_the_callers_trace_and_triton_gets_its_context(
    people: dict[str, Person],
) -> None:
    sent = infer_request([1, 4], b"\0" * 16)

    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(_deploy, people["alice"], fake.target)
            with traced() as exporter:
                await channel.unary_unary(PREFIX + "ModelInfer")(sent, timeout=10, metadata=meta(
                    people["alice"], traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
                [span] = exporter.get_finished_spans()
            context = span.get_span_context()
            assert context is not None and f"{context.trace_id:032x}" == CALLER_TRACE
            assert span.parent is not None and f"{span.parent.span_id:016x}" == CALLER_SPAN
            assert span.name == "ModelInfer"
            attributes = dict(span.attributes or {})
            assert attributes["modelport.team.id"] == people["alice"].team.id
            assert attributes["modelport.deployment"] == "digits-prod" and attributes["modelport.model"] == "digits"
            assert attributes["modelport.revision"] == 1 and attributes["modelport.status"] == 200
            size = attributes["rpc.response.body.size"]
            assert attributes["rpc.request.body.size"] == len(sent) and isinstance(size, int) and size > 0
            assert not any(people["alice"].token in str(v) for v in attributes.values())
            forwarded = fake.calls[0].metadata
            assert forwarded["traceparent"] == f"00-{CALLER_TRACE}-{context.span_id:016x}-01"
            assert "authorization" not in forwarded

    run(scenario)


def test_a_call_the_caller_did_not_sample_is_not_recorded_and_triton_gets_no_traceparent(
    people: dict[str, Person],
) -> None:
    """Triton traces any call with a valid traceparent whatever its sampled flag: it is sent none for an unsampled
    span (infra/tracing.traceparent()), so that it records what the gateway's sampler records and nothing more."""
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(_deploy, people["alice"], fake.target)
            with traced() as exporter:
                await channel.unary_unary(PREFIX + "ModelInfer")(infer_request([1, 4], b"\0" * 16), timeout=10,
                                                                 metadata=meta(people["alice"], traceparent=(
                                                                     f"00-{CALLER_TRACE}-{CALLER_SPAN}-00")))
                assert exporter.get_finished_spans() == ()
            assert "traceparent" not in fake.calls[0].metadata

    run(scenario)


def test_with_tracing_off_triton_gets_no_traceparent(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(_deploy, people["alice"], fake.target)
            caller = meta(people["alice"], traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")
            await channel.unary_unary(PREFIX + "ModelInfer")(infer_request([1, 4], b"\0" * 16), timeout=10,
                                                             metadata=caller)
            assert "traceparent" not in fake.calls[0].metadata

    run(scenario)


async def _chat_pieces(request: bytes) -> Any:
    yield piece_reply(request, "a")
    yield piece_reply(request, "b", final=True)


async def _one_stream(channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...]) -> None:
    """Two one-answer requests and a decoupled one on one stream, every answer read, the stream closed."""
    stream = await open_stream(channel, metadata)
    await stream.write(infer_request([1], b"\0" * 4, request_id="d-1"))
    await stream.write(chat_request("chat-1"))
    await stream.write(infer_request([1], b"\0" * 4, request_id="d-2"))
    answers = [await next_answer(stream) for _ in range(4)]
    assert sorted(a.infer_response.id for a in answers) == ["chat-1", "chat-1", "d-1", "d-2"]
    await stream.done_writing()
    assert await stream.read() is grpc.aio.EOF


def test_a_stream_gets_one_span_in_the_callers_trace_and_each_upstream_call_its_context(
    people: dict[str, Person],
) -> None:
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy_streaming, people["alice"], "streams", fake.target)
            fake.pieces = lambda request: _chat_pieces(request) if is_chat(request) else None
            with traced() as exporter:
                await _one_stream(channel, meta(people["alice"], "streams",
                                                traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
                assert await settles(lambda: len(exporter.get_finished_spans()), 1) == 1
                [span] = exporter.get_finished_spans()
            context = span.get_span_context()
            assert context is not None and f"{context.trace_id:032x}" == CALLER_TRACE
            assert span.parent is not None and f"{span.parent.span_id:016x}" == CALLER_SPAN
            assert span.name == "ModelStreamInfer"
            attributes = dict(span.attributes or {})
            assert attributes["modelport.team.id"] == people["alice"].team.id
            assert attributes["modelport.deployment"] == "streams" and attributes["modelport.status"] == 200
            assert attributes["modelport.stream.requests"] == 3 and attributes["rpc.method"] == "ModelStreamInfer"
            assert not any(people["alice"].token in str(v) for v in attributes.values())
            # The one-answer requests share an upstream call, the decoupled one has its own: each names the span.
            upstream = {c.metadata["traceparent"] for c in fake.calls}
            assert upstream == {f"00-{CALLER_TRACE}-{context.span_id:016x}-01"}
            assert len(fake.calls) == 3

    run(scenario)


def test_a_stream_refused_up_front_has_a_span_with_its_status_and_nothing_of_the_deployment(
    people: dict[str, Person],
) -> None:
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy_streaming, people["alice"], "streams", fake.target)
            with traced() as exporter:
                stream = await open_stream(channel, meta(people["charlie"], "streams",
                                                         traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    await stream.write(infer_request([1], b"\0" * 4))
                assert await stream.code() == grpc.StatusCode.NOT_FOUND
                assert await settles(lambda: len(exporter.get_finished_spans()), 1) == 1
                [span] = exporter.get_finished_spans()
            attributes = dict(span.attributes or {})
            assert attributes["modelport.status"] == 404
            assert not {"modelport.team.id", "modelport.deployment"} & set(attributes)
            assert fake.calls == []

    run(scenario)


def test_with_tracing_off_a_streams_upstream_calls_get_no_traceparent(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy_streaming, people["alice"], "streams", fake.target)
            fake.pieces = lambda request: _chat_pieces(request) if is_chat(request) else None
            await _one_stream(channel, meta(people["alice"], "streams",
                                            traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
            assert len(fake.calls) == 3 and not [c for c in fake.calls if "traceparent" in c.metadata]

    run(scenario)
