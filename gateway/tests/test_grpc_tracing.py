"""The gRPC gateway's span of a unary call (gateway/traced.py), read from the SDK's in-memory exporter: the
caller's `traceparent` metadata continued, Triton sent the gateway's span in the same metadata, the call's attributes;
with tracing off, no metadata. A real Triton's spans joining it: tests/test_tracing_e2e.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.tests.grpc_support import PREFIX, infer_request, meta, stack
from infra import tracing
from tests.support.gateway_calls import make_deployment, run
from tests.support.people import Person

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture(autouse=True)
def _grpc_tracing_settings(settings: Any) -> None:
    settings.GATEWAY_CACHE_TTL_SECONDS = 0.5
    settings.GATEWAY_RATE_LIMIT_PER_SECOND = 1000
    settings.GATEWAY_RATE_LIMIT_BURST = 1000


@contextlib.contextmanager
def _traced() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure(exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown()


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
            with _traced() as exporter:
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
            assert attributes["rpc.request.body.size"] == len(sent) and attributes["rpc.response.body.size"] > 0
            assert not any(people["alice"].token in str(v) for v in attributes.values())
            forwarded = fake.calls[0].metadata
            assert forwarded["traceparent"] == f"00-{CALLER_TRACE}-{context.span_id:016x}-01"
            assert "authorization" not in forwarded

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
