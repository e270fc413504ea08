"""The gateway's span of a request (docs/observability.md), only while tracing is on (infra/tracing.py): the gateway
calls serve() here instead of its own when `tracing.tracer` is set, and nothing of this runs otherwise.

One SERVER span per /serve/ request, continuing the caller's W3C `traceparent` or starting a trace; its context is
the current one while the request runs, so the upstream client (gateway/upstream.py) sends it to Triton as the
parent of Triton's spans. What it records: the team's id, the deployment, the revision that answered, the model (the
deployment's own models by name, anything else as "(other)", as the metrics do), the status and the bytes each way.
Never a body, a header's value or a token; the caller's context decides nothing but its own request's sampling, and
nothing of the trace is sent back to the caller.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from infra import tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from gateway.access import Caller, Choice, Route
    from gateway.protocol import Endpoint

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Serve = Callable[[Scope, Receive, Send, "Span"], Awaitable[None]]
Unary = Callable[[str, bytes, Any, "Span"], Awaitable[bytes]]
Stream = Callable[[Any, "Span"], Awaitable[None]]


async def serve(tracer: Tracer, handler: Serve, scope: Scope, receive: Receive, send: Send) -> None:
    from opentelemetry.trace import SpanKind

    parent = tracing.continued({k.lower(): v for k, v in scope["headers"] if k.lower() in _TRACE_HEADERS})
    received = sent = 0

    async def counting_receive() -> MutableMapping[str, Any]:
        nonlocal received
        message = await receive()
        received += len(message.get("body", b""))
        return message

    async def counting_send(message: MutableMapping[str, Any]) -> None:
        nonlocal sent
        if message["type"] == "http.response.body":
            sent += len(message.get("body", b""))
        await send(message)

    with tracer.start_as_current_span(f"{scope['method']} /serve/", context=parent, kind=SpanKind.SERVER,
                                      record_exception=False, set_status_on_exception=False) as span:
        span.set_attribute("http.request.method", scope["method"])
        try:
            await handler(scope, counting_receive, counting_send, span)
        finally:
            span.set_attribute("http.request.body.size", received)
            span.set_attribute("http.response.body.size", sent)


_TRACE_HEADERS = (tracing.TRACEPARENT, tracing.TRACESTATE)


def describe(span: Span, method: str, caller: Caller | None, route: Route | None, endpoint: Endpoint | None,
             choice: Choice | None, model: str, code: int) -> None:
    """The request's attributes, once it is answered: the deployment's only when the caller may see it (`route`)."""
    from opentelemetry.trace import StatusCode

    if not span.is_recording():  # not sampled
        return
    if endpoint is not None:
        span.update_name(f"{method} {endpoint.kind}")
    _deployment(span, caller, route, choice, model)
    span.set_attribute("http.response.status_code", code)
    if code >= 500:
        span.set_status(StatusCode.ERROR)


def _deployment(span: Span, caller: Caller | None, route: Route | None, choice: Choice | None, model: str) -> None:
    """Who and what the request was for, HTTP's and gRPC's alike: set only when the caller may see the deployment
    (`route` is the caller's team's), so another team's name never reaches a span."""
    if caller is None or route is None:
        return
    span.set_attribute("modelport.team.id", caller.team_id)
    span.set_attribute("modelport.deployment", route.name)
    if choice is not None:
        span.set_attribute("modelport.revision", choice.revision)
    if model:
        span.set_attribute("modelport.model", model)


async def unary(tracer: Tracer, handler: Unary, path: str, request: bytes, metadata: Mapping[str, str],
                context: Any) -> bytes:
    """A unary call of the gRPC gateway (gateway/grpc_app.py) in a span of its own, continuing the caller's
    `traceparent` metadata as the HTTP gateway continues the header."""
    from opentelemetry.trace import SpanKind

    parent = tracing.continued({k.encode(): metadata[k].encode("latin-1") for k in ("traceparent", "tracestate")
                                if k in metadata})
    with tracer.start_as_current_span("grpc", context=parent, kind=SpanKind.SERVER,
                                      record_exception=False, set_status_on_exception=False) as span:
        return await handler(path, request, context, span)


def describe_grpc(span: Span, method: str, caller: Caller | None, route: Route | None, choice: Choice | None,
                  model: str, status: int, received: int, sent: int) -> None:
    """A gRPC call's attributes, the HTTP request's in gRPC's words: `method` is Triton's method's name once the
    gateway knows it for one (never a name the caller made up), `modelport.status` the HTTP status the gateway counts
    the call as (its metrics' `code`)."""
    from opentelemetry.trace import StatusCode

    if not span.is_recording():
        return
    span.set_attribute("rpc.system", "grpc")
    if method:
        span.update_name(method)
        span.set_attribute("rpc.method", method)
    _deployment(span, caller, route, choice, model)
    span.set_attribute("modelport.status", status)
    span.set_attribute("rpc.request.body.size", received)
    span.set_attribute("rpc.response.body.size", sent)
    if status >= 500:
        span.set_status(StatusCode.ERROR)


async def stream(tracer: Tracer, handler: Stream, metadata: Mapping[str, str], context: Any) -> None:
    """A ModelStreamInfer call of the gRPC gateway in one span, for the whole stream (not one per request): Triton
    reads the trace context from a call's metadata, once per call, and the gateway sends a stream's one-answer
    requests to Triton on one upstream call per server, so a span per request could not be the parent of Triton's
    spans of them; the caller too sends its `traceparent` once, for the stream. Triton's spans of each request
    (every upstream call, a decoupled request's own included, carries this span's `traceparent`) are its
    children."""
    from opentelemetry.trace import SpanKind

    parent = tracing.continued({k.encode(): metadata[k].encode("latin-1") for k in ("traceparent", "tracestate")
                                if k in metadata})
    with tracer.start_as_current_span("ModelStreamInfer", context=parent, kind=SpanKind.SERVER,
                                      record_exception=False, set_status_on_exception=False) as span:
        await handler(context, span)


def describe_stream(span: Span, caller: Caller | None, route: Route | None, status: int, requests: int) -> None:
    """A stream's attributes, once it ends: the deployment's only when the caller may see it; `modelport.status` the
    stream's own outcome (200, or the refusal that ended it up front, 408 a slow reader, 499 the caller gone; each
    request's own answer is in the metrics, not here), `modelport.stream.requests` the requests it carried."""
    from opentelemetry.trace import StatusCode

    if not span.is_recording():
        return
    span.set_attribute("rpc.system", "grpc")
    span.set_attribute("rpc.method", "ModelStreamInfer")
    if caller is not None and route is not None:
        span.set_attribute("modelport.team.id", caller.team_id)
        span.set_attribute("modelport.deployment", route.name)
    span.set_attribute("modelport.status", status)
    span.set_attribute("modelport.stream.requests", requests)
    if status >= 500:
        span.set_status(StatusCode.ERROR)
