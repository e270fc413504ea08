"""The local runtime's Tritons and tracing (infra/tracing.py): with an endpoint set, a deployment's or a pool's
Triton is started with OpenTelemetry tracing to the same collector, and its sandbox lets it reach that collector's
port (and its name, through its own /etc/hosts) and nothing more; without one, nothing changes. A real Triton's
spans joining the gateway's trace: tests/test_tracing_e2e.py."""

from __future__ import annotations

import logging

import pytest

from deployments.runtimes.local import confined
from deployments.runtimes.local import triton as local_triton


def test_triton_is_traced_to_the_collector_by_opentelemetry() -> None:
    assert local_triton.trace_args("http://10.0.0.7:4318/v1/traces") == [
        "--trace-config", "mode=opentelemetry", "--trace-config", "rate=0", "--trace-config", "level=TIMESTAMPS",
        "--trace-config", "opentelemetry,url=http://10.0.0.7:4318/v1/traces"]


def test_without_an_endpoint_there_is_no_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert confined._collector("revision 1") is None


@pytest.mark.parametrize(("endpoint", "port", "hosts"), [
    ("http://127.0.0.1:4318", 4318, ()),
    ("http://[::1]:4318", 4318, ()),
    ("https://127.0.0.1", 443, ()),
    ("http://localhost:4318", 4318, (("localhost", "127.0.0.1"),)),
])
def test_the_collector_is_its_url_its_port_and_its_address(monkeypatch: pytest.MonkeyPatch, endpoint: str, port: int,
                                                           hosts: tuple[tuple[str, str], ...]) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    collector = confined._collector("revision 1")
    assert collector is not None
    assert (collector.url, collector.port) == (endpoint + "/v1/traces", port)
    if hosts:  # localhost may resolve to ::1 first
        assert collector.hosts[0][0] == "localhost" and collector.hosts[0][1] in ("127.0.0.1", "::1")
    else:
        assert collector.hosts == ()


@pytest.mark.parametrize("endpoint", ["ftp://10.0.0.7:21/v1/traces", "http://:4318/v1/traces",
                                      "http://no-such-host.invalid:4318/v1/traces", "http://10.0.0.7:99999/v1/traces"])
def test_an_unusable_collector_leaves_triton_untraced_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture,
                                                                   endpoint: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
    with caplog.at_level(logging.WARNING):
        assert confined._collector("revision 1") is None
    assert "revision 1 starts untraced" in caplog.text
