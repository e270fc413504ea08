"""GET /metrics for a process that serves no HTTP of its own (the gRPC gateway): its Prometheus counters, behind
METRICS_TOKEN (or closed) as the portal's /metrics is. Prometheus keeps a registry per process, so the web process's
/metrics cannot show these.

A minimal HTTP/1.0-style exchange on asyncio streams: one request per connection, its head bounded and read within
a few seconds, the answer written and the connection closed. Nothing else is served.
"""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.stats import scrape_refusal

MAX_HEAD_BYTES = 8 * 1024
HEAD_TIMEOUT_SECONDS = 5.0


async def start(host: str, port: int, token: str, is_open: bool = False) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_SECONDS):
                head = await reader.readuntil(b"\r\n\r\n")
            status, content_type, body = answer(head, token, is_open)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            writer.close()
            return
        writer.write(b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                     % (status, _REASONS[status], content_type.encode(), len(body)) + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, host, port, limit=MAX_HEAD_BYTES)


_REASONS = {200: b"OK", 401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found", 405: b"Method Not Allowed"}


def answer(head: bytes, token: str, is_open: bool = False) -> tuple[int, str, bytes]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[1].split(b"?")[0] != b"/metrics":
        return 404, "text/plain", b"only /metrics is served here\n"
    if parts[0] != b"GET":
        return 405, "text/plain", b"use GET\n"
    authorization = None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"authorization":
            authorization = value.strip().decode("latin-1")
    refusal = scrape_refusal(authorization, token, is_open)
    if refusal is not None:
        return refusal[0], "text/plain", refusal[1].encode()
    return 200, CONTENT_TYPE_LATEST, generate_latest()
