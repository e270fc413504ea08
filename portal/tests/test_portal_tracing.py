"""The portal's own work traced (infra/tracing.py, instrument_portal): the SDK's Django and Celery instrumentation,
read from its in-memory exporter. A Django test client request that queues a reconcile gives the request's span and
the task's, the task's its child in one trace; what the spans record holds no token, cookie, query string or path
as sent. With tracing off nothing is instrumented (and nothing of OpenTelemetry imported:
gateway/tests/test_tracing.py). The task runs eagerly here: a real worker, which carries the context in the task's
headers, is not run by this test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from infra import tracing
from tests.support.people import Person
from tests.support.tracing_capture import traced

MIDDLEWARE = "opentelemetry.instrumentation.django.middleware.otel_middleware._DjangoMiddleware"


@contextlib.contextmanager
def _portal_traced() -> Iterator[InMemorySpanExporter]:
    with traced() as exporter:
        tracing.instrument_portal()
        yield exporter


def _values(span: ReadableSpan) -> str:
    return " ".join(f"{k}={v!r}" for k, v in (span.attributes or {}).items())


def test_a_request_and_the_task_it_queued_are_one_trace(alice: Person, deployment: Any, request: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    request.getfixturevalue("eager_tasks")  # once the deployment exists (its creation would start a Triton)
    # An operator asking for headers and request attributes gets none of them.
    monkeypatch.setenv("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST", "authorization,cookie")
    monkeypatch.setenv("OTEL_PYTHON_DJANGO_TRACED_REQUEST_ATTRS", "COOKIES,META")
    with _portal_traced() as exporter:
        client = alice.client()
        client.cookies["sessionid"] = "cookie-secret-value"
        response = client.post("/api/v1/deployments/digits-prod/stop?signature=query-secret-value")
        assert response.status_code == 202
        spans = exporter.get_finished_spans()
    [served] = [s for s in spans if s.kind == SpanKind.SERVER]
    tasks = [s for s in spans if s.kind == SpanKind.CONSUMER]
    assert served.name == "POST api/v1/deployments/<str:name>/stop"
    assert tasks and {s.name for s in tasks} >= {"run/deployments.tasks.reconcile_deployment"}
    request_context = served.get_span_context()
    assert request_context is not None
    for task in tasks:
        context = task.get_span_context()
        assert context is not None and context.trace_id == request_context.trace_id
    first = tasks[0]
    assert first.parent is not None and first.parent.span_id == request_context.span_id
    attributes = dict(served.attributes or {})
    assert attributes["http.target"] == "/api/v1/deployments/<str:name>/stop"
    assert attributes.get("http.status_code", attributes.get("http.response.status_code")) == 202
    for span in spans:
        text = _values(span)
        for secret in (alice.token, "cookie-secret-value", "query-secret-value", "digits-prod/stop", "Bearer"):
            assert secret not in text, (span.name, secret)
        assert "http.request.header" not in text and "COOKIES" not in text


@pytest.mark.django_db(transaction=True)  # the view runs on another thread, which sees only committed rows
def test_a_request_served_over_asgi_as_uvicorn_serves_the_portal_is_traced_and_records_no_secret(
        alice: Person) -> None:
    # Under ASGI (portal/asgi.py, what `make run` and production serve) the Django instrumentation needs
    # opentelemetry-instrumentation-asgi (requirements.txt); without it such a request gets no span at all.
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    with _portal_traced() as exporter:
        client = AsyncClient()
        response = async_to_sync(client.get)("/api/v1/deployments/?signature=query-secret-value", headers={
            "Authorization": f"Bearer {alice.token}", "Cookie": "sessionid=cookie-secret"})
        assert response.status_code == 200, response.json()
        spans = exporter.get_finished_spans()
    [served] = [s for s in spans if s.kind == SpanKind.SERVER]
    assert served.name == "GET api/v1/deployments/"
    attributes = dict(served.attributes or {})
    assert attributes["http.target"] == "/api/v1/deployments/"
    for span in spans:
        text = _values(span)
        for secret in (alice.token, "cookie-secret", "query-secret-value", "Bearer"):
            assert secret not in text, (span.name, secret)


def test_with_tracing_off_nothing_is_instrumented(alice: Person) -> None:
    tracing.instrument_portal()
    assert tracing.tracer is None
    assert MIDDLEWARE not in settings.MIDDLEWARE
    assert alice.client().get("/api/v1/deployments/").status_code == 200
