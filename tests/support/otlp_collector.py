"""A trace collector for the tests: an OTLP/HTTP receiver (POST /v1/traces) on a real socket, taking the protobuf
bodies the Python SDK's exporter sends and the JSON ones Triton sends, and keeping every span it is given. The real
OpenTelemetry Collector is not installed here; this speaks the same wire format to the same exporters."""

from __future__ import annotations

import base64
import gzip
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str  # hex, as in a traceparent
    span_id: str
    parent_span_id: str  # "" for a root span
    attributes: dict[str, Any]


@dataclass
class Collector:
    spans: list[Span] = field(default_factory=list)
    bodies: list[str] = field(default_factory=list)  # the content types of the exports received
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def of_trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def add(self, content_type: str, body: bytes) -> None:
        if content_type.startswith("application/x-protobuf"):
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            # Protobuf's JSON form writes ids in base64; the OTLP/JSON encoding (Triton's) writes them in hex.
            payload = MessageToDict(request)
            hex_ids = False
        else:
            payload = json.loads(body)
            hex_ids = True
        spans = list(_spans(payload, hex_ids))
        with self.lock:
            self.bodies.append(content_type)
            self.spans.extend(spans)


def _id(value: str, hex_ids: bool) -> str:
    if not value:
        return ""
    return value.lower() if hex_ids else base64.b64decode(value).hex()


def _value(value: dict[str, Any]) -> Any:
    for kind in ("stringValue", "boolValue", "doubleValue"):
        if kind in value:
            return value[kind]
    if "intValue" in value:
        return int(value["intValue"])
    return value


def _spans(payload: dict[str, Any], hex_ids: bool) -> Iterator[Span]:
    for resource_spans in payload.get("resourceSpans", []):
        resource = {a["key"]: _value(a["value"]) for a in resource_spans.get("resource", {}).get("attributes", [])}
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                yield Span(service=str(resource.get("service.name", "")), name=span.get("name", ""),
                           trace_id=_id(span.get("traceId", ""), hex_ids), span_id=_id(span.get("spanId", ""), hex_ids),
                           parent_span_id=_id(span.get("parentSpanId", ""), hex_ids),
                           attributes={a["key"]: _value(a["value"]) for a in span.get("attributes", [])})


def start() -> Collector:
    collector = Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding", "") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            content_type = self.headers.get("Content-Type", "")
            collector.add(content_type, body)
            answer = (ExportTraceServiceResponse().SerializeToString()
                      if content_type.startswith("application/x-protobuf") else b"{}")
            self.send_response(200)
            self.send_header("Content-Type", content_type or "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
            pass

    collector.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=collector.server.serve_forever, daemon=True).start()
    return collector


def stop(collector: Collector) -> None:
    assert collector.server is not None
    collector.server.shutdown()
    collector.server.server_close()
