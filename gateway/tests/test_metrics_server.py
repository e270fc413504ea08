"""The gRPC gateway process's own GET /metrics (gateway/metrics_server.py), on a real socket."""

from __future__ import annotations

import asyncio

from gateway import metrics_server
from tests.support.gateway_calls import run


async def fetch(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


def test_it_serves_the_processs_counters_to_the_token_holder_only() -> None:
    from gateway.stats import REQUESTS

    REQUESTS.labels("acme", "metrics-test", "1", "digits", "200").inc()

    async def scenario() -> None:
        server = await metrics_server.start("127.0.0.1", 0, "s3cret-token")
        port = server.sockets[0].getsockname()[1]
        try:
            ok = await fetch(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret-token\r\n\r\n")
            assert ok.startswith(b"HTTP/1.1 200 OK\r\n")
            assert (b'modelport_gateway_requests_total{code="200",deployment="metrics-test",model="digits",'
                    b'revision="1",team="acme"} 1.0' in ok)
            for request in (b"GET /metrics HTTP/1.1\r\n\r\n",
                            b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer wrong\r\n\r\n"):
                assert (await fetch(port, request)).startswith(b"HTTP/1.1 401 ")
            assert (await fetch(port, b"GET /admin HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404 ")
            assert (await fetch(port, b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405 ")
            # A head that never ends, or one over the limit, gets no answer and the connection is closed.
            assert await fetch(port, b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 2000) == b""
        finally:
            server.close()

    run(scenario)


def test_without_a_token_configured_it_is_closed_unless_opened_as_the_portals_metrics_are() -> None:
    assert metrics_server.answer(b"GET /metrics HTTP/1.1\r\n\r\n", "")[0] == 403
    assert metrics_server.answer(b"GET /metrics HTTP/1.1\r\n\r\n", "", True)[0] == 200
