"""Spans a test reads back: tracing configured with the SDK's in-memory exporter for the length of a `with`, then
shut down, so the next test starts with tracing off (infra/tracing.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infra import tracing


@contextlib.contextmanager
def traced() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure(exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown()
