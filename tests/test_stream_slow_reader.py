"""A stream's slow reader against the real web server (uvicorn with portal/web_server.py's protocol serving
portal.asgi, a process of its own): a client with a tiny receive buffer that stops reading while a scripted upstream
on a real socket (in place of Triton, which cannot be made to stream this fast on demand) streams as fast as it is
let. docs/security.md, "What a stream holds, and what bounds it".

What it shows: uvicorn's `send` waits while its transport's buffer is past the high-water mark, so the gateway
reads the upstream no faster than the client takes the pieces (the upstream's writes stop growing: nothing piles up
in the gateway); after GATEWAY_STREAM_SEND_SECONDS the stream is ended, its connection aborted (the client sees a
reset, not a wait), its upstream connection closed, and it is counted as a slow reader in /metrics."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gateway.tests import fake_upstream
from gateway.tests.stream_support import SSE_HEAD, event, streaming_deployment
from tests import processes
from tests.support.people import Person

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SEND_SECONDS = 2
PIECE = event("x" * 1000)
CHUNK = b"%x\r\n%s\r\n" % (len(PIECE), PIECE)


class Flood:
    """An upstream stream that never ends, each piece written as soon as the last one was taken (drained)."""

    def __init__(self) -> None:
        self.written = 0  # bytes the gateway has taken from it

    def __call__(self, request: fake_upstream.Request) -> AsyncIterator[bytes]:
        async def pieces() -> AsyncIterator[bytes]:
            yield SSE_HEAD
            while True:
                yield CHUNK
                self.written += len(CHUNK)

        return pieces()


@pytest.fixture
def flood() -> Iterator[tuple[str, Flood, fake_upstream.FakeUpstream]]:
    """The scripted upstream, served by an event loop of its own in a thread (the test's calls are blocking)."""
    loop = asyncio.new_event_loop()
    answer = Flood()
    server = fake_upstream.FakeUpstream(answer=answer)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(10)
    try:
        yield server.url, answer, server
    finally:
        asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _metric(base: str, name: str, **labels: str) -> float | None:
    text = requests.get(f"{base}/metrics", timeout=10).text
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    assert wanted  # a series not there yet
    return None


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _plateau(flood: Flood, seconds: float = 1.0) -> int:
    """Wait until the upstream's bytes taken stop growing for `seconds`; what they are then."""
    deadline = time.monotonic() + 30
    last, since = flood.written, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if flood.written != last:
            last, since = flood.written, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return last
    raise AssertionError(f"the upstream kept being read while the client read nothing ({flood.written} bytes)")


def test_a_client_that_stops_reading_holds_no_more_than_the_send_buffers_and_its_stream_is_ended_and_counted(
        tmp_path: Path, alice_tx: Person, flood: tuple[str, Flood, Any]) -> None:
    url, answer, server = flood
    streaming_deployment(alice_tx, url)
    log = tmp_path / "web.log"
    port = processes.free_port()
    web = processes.start_web(log, port, {"GATEWAY_STREAM_SEND_SECONDS": str(SEND_SECONDS), "METRICS_OPEN": "true"})
    base = f"http://127.0.0.1:{port}"
    labels = {"team": "acme", "deployment": "chat", "revision": "1"}
    try:
        processes.wait_for(lambda: _healthy(base), 60, what="the web server")
        rss_before = _rss_kib(web.pid)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window stays small
        sock.connect(("127.0.0.1", port))
        body = b'{"text_input": "a"}'
        sock.sendall(b"POST /serve/chat/v2/models/chat/generate_stream HTTP/1.1\r\nHost: localhost\r\n"
                     b"Authorization: Bearer " + alice_tx.token.encode() + b"\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        sock.settimeout(10)
        head = sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 200 "), head
        # Now the client reads nothing. The gateway stops reading the upstream once the buffers between are full:
        # the kernel's (the client's tiny window, the web server's socket, the upstream's socket) and uvicorn's
        # transport buffer up to its high-water mark, plus the piece being sent.
        held = _plateau(answer)
        assert held < 16 * 1024**2, held
        grown = _rss_kib(web.pid) - rss_before
        print(f"upstream bytes taken while the client read nothing: {held}; web process RSS grew {grown} KiB")
        assert grown < 64 * 1024, f"the web process grew by {grown} KiB"
        # Then, GATEWAY_STREAM_SEND_SECONDS after the piece it could not send, the stream is ended: the connection
        # is reset (aborted: closed, it would wait for the client to read), the upstream's closed, and it is counted.
        processes.wait_for(lambda: server.open_connections == 0, SEND_SECONDS + 10,
                           what="the gateway to close its upstream connection")
        assert answer.written == held  # nothing more was read from the upstream meanwhile
        with pytest.raises(ConnectionResetError):
            while sock.recv(65536):
                pass
        sock.close()
        assert _metric(base, "modelport_gateway_streams_ended_total", reason="slow_reader", **labels) == 1
        assert _metric(base, "modelport_gateway_streams_in_flight", **labels) == 0
        # The team's stream slot is free again, and the web server serves on.
        assert _healthy(base)
    finally:
        processes.kill(web)
    text = log.read_text(errors="replace")
    print(text[-3000:])


def _healthy(base: str) -> bool:
    try:
        return requests.get(f"{base}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False
