"""Tracing (docs/observability.md): the OpenTelemetry SDK, configured by the standard OTEL_* variables, exporting
OTLP/HTTP. Off when no endpoint is set, and then free: `tracer` stays None, nothing of the SDK is imported, and the
gateway's one check of it is the whole cost.

The variables (the SDK reads them itself; this module only decides whether to start it):
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the full URL, `.../v1/traces`) or OTEL_EXPORTER_OTLP_ENDPOINT (its base, to which
`/v1/traces` is added), OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (default: parentbased_always_on),
OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (default service name: modelport).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

# The portal's tracer, or None when tracing is off. Read it as `tracing.tracer` (never `from ... import tracer`):
# configure() sets it once per process.
tracer: Tracer | None = None
provider: TracerProvider | None = None

DEFAULT_SERVICE_NAME = "modelport"
TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"


def traces_url(environ: Mapping[str, str] = os.environ) -> str | None:
    """Where spans go, by the OTLP exporter's own rule: the traces endpoint as given, or the base endpoint with
    `/v1/traces` added; None (tracing off) when neither is set."""
    url = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if url:
        return url
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        return base.rstrip("/") + "/v1/traces"
    return None


def configure(exporter: SpanExporter | None = None) -> Tracer | None:
    """Start tracing for this process when an endpoint is set (or an exporter is given: the tests' in-memory one,
    whose spans are handed over as they end); None, and nothing built, otherwise. Idempotent."""
    global tracer, provider
    if tracer is not None:
        return tracer
    if exporter is None and traces_url() is None:
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER(_ARG)
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # the endpoint from the environment
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("modelport")
    return tracer


def shutdown() -> None:
    """Export what is buffered and turn tracing off (tests; a process exits with the SDK's own atexit flush)."""
    global tracer, provider
    if _instrumented:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        DjangoInstrumentor().uninstrument()
        CeleryInstrumentor().uninstrument()
        _instrumented.clear()
    if provider is not None:
        provider.shutdown()
    tracer = provider = None


_instrumented: list[str] = []

# What an operator could ask the instrumentation to record and that must never be (docs/security.md, "Tracing"):
# request attributes by name (COOKIES, META, ...) and headers (Authorization, Cookie). They are turned off here,
# whatever the environment says.
_NEVER_RECORDED = ("OTEL_PYTHON_DJANGO_TRACED_REQUEST_ATTRS",
                   "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST",
                   "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_RESPONSE")
# The instrumentation's URL attributes, as it writes them (old and stable semantic conventions): the path and the
# query string, where a portal URL may hold a secret (a password reset's token is in its path).
_URL_ATTRIBUTES = ("http.target", "http.url", "url.path", "url.query", "url.full")


def instrument_portal() -> None:
    """The portal's own work traced by the SDK's Django and Celery instrumentation (docs/observability.md, "The
    portal's own work"), once tracing is on: a span per page or API request, a span per Celery task, the task's a
    child of the request (or task) that queued it (the instrumentation carries the context in the task's headers).
    Call it before Django loads its middleware (portal/asgi.py, portal/wsgi.py) and in the worker and beat. Nothing
    is imported while tracing is off. What is recorded is restricted: no header, no request attribute by name, and
    the URL as its route (`/api/v1/deployments/<str:name>/stop`), never the path as sent nor its query string."""
    if provider is None or _instrumented:
        return
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.django.middleware import otel_middleware

    for name in _NEVER_RECORDED:
        os.environ.pop(name, None)
    DjangoInstrumentor().instrument(tracer_provider=provider, request_hook=_without_url, response_hook=_routed_url)
    otel_middleware._DjangoMiddleware._traced_request_attrs = []
    CeleryInstrumentor().instrument(tracer_provider=provider)
    _instrumented.append("django, celery")


def _without_url(span: Span, request: Any) -> None:
    """The request's URL attributes, until it is routed (_routed_url): none of the path, none of the query."""
    if span.is_recording():
        for key in _URL_ATTRIBUTES:
            span.set_attribute(key, "")


def _routed_url(span: Span, request: Any, response: Any) -> None:
    """The URL as the route the request matched, with `{...}` for what the caller put there; `(unrouted)` else."""
    if not span.is_recording():
        return
    match = getattr(request, "resolver_match", None)
    route = "/" + match.route if match is not None and match.route else "(unrouted)"
    for key in ("http.target", "url.path"):
        span.set_attribute(key, route)
    for key in ("http.url", "url.full", "url.query"):
        span.set_attribute(key, "")


def continued(raw: Mapping[bytes, bytes]) -> Any:
    """The caller's trace context from its W3C `traceparent` (and `tracestate`), or an empty context to start a
    trace. Only asked while tracing is on. A malformed header starts a new trace."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {}
    parent = raw.get(TRACEPARENT)
    if parent is not None:
        carrier["traceparent"] = parent.decode("latin-1")
        state = raw.get(TRACESTATE)
        if state is not None:
            carrier["tracestate"] = state.decode("latin-1")
    return TraceContextTextMapPropagator().extract(carrier)


def traceparent(span: Span | None = None) -> bytes | None:
    """The W3C `traceparent` of `span` (default: the current one) for an upstream request, or None when there is no
    valid span or it is not sampled. Triton traces every request that carries a valid `traceparent` whatever its
    sampled flag, and (rate 0, deployments/runtimes/local/triton.py) none that carries none: sending it only for a
    sampled span makes Triton follow the gateway's sampler (../shared notes: triton-local.md, "tracing")."""
    from opentelemetry import trace

    context = (span if span is not None else trace.get_current_span()).get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return None
    return b"00-%032x-%016x-%02x" % (context.trace_id, context.span_id, context.trace_flags)
