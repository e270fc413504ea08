"""portal/web_server.py's held response start (the head leaves with the first piece of the body) on a real socket,
with uvloop, as uvicorn serves the portal: the cases around it that the in-memory tests
(tests/test_web_server_writes.py) cannot show: pipelined requests, `Expect: 100-continue`, chunked and streamed
bodies, 204/304 and HEAD, a reader slow enough that the transport pauses, and applications that fail, stall or are
left by their client after their start. Each server runs a small ASGI application in a thread of this process."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl

from portal.web_server import GuardedHttpToolsProtocol

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

BIG = 32 * 1024 * 1024  # far over the kernel's buffers and the transport's high-water mark: a slow reader pauses it


def _start(status: int, headers: list[tuple[bytes, bytes]] | None = None) -> Message:
    return {"type": "http.response.start", "status": status, "headers": headers or []}


def _body(body: bytes, more: bool = False) -> Message:
    return {"type": "http.response.body", "body": body, "more_body": more}


class App:
    """Routes by path; records what the server told the application (a disconnect, an error on send)."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/refuse":
            # A refusal decided before the body is read, with a watch for the client's leaving started meanwhile
            # (as gateway/app.py's streamed answers have, and Starlette's): receive() runs between start and body.
            await send(_start(413, [(b"content-length", b"8")]))
            watch = asyncio.ensure_future(receive())
            await asyncio.sleep(0.05)
            await send(_body(b"too big!"))
            self.events.append("watch:" + (await watch)["type"])
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.events.append("disconnect")
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if path == "/echo":
            await send(_start(200, [(b"content-length", b"%d" % len(body))]))
            await send(_body(body))
        elif path == "/chunked":
            await send(_start(200))
            for piece in (b"one", b"", b"two", b"three"):
                await send(_body(piece, more=True))
                await asyncio.sleep(0.01)
            await send(_body(b""))
        elif path == "/big":
            await send(_start(200, [(b"content-length", b"%d" % BIG)]))
            await send(_body(b"x" * BIG))
        elif path == "/big-pieces":
            await send(_start(200, [(b"content-length", b"%d" % BIG)]))
            eighth = BIG // 8
            for i in range(8):
                await send(_body(bytes([97 + i]) * eighth, more=i < 7))
        elif path == "/small":
            await send(_start(200, [(b"content-length", b"5")]))
            await send(_body(b"small"))
        elif path in ("/204", "/304"):
            await send(_start(int(path[1:])))
            await send(_body(b""))
        elif path == "/raise":
            await send(_start(200, [(b"content-length", b"5")]))
            raise RuntimeError("broken between the start and the body")
        elif path == "/stall":  # a start, then nothing until the client leaves
            await send(_start(200, [(b"content-length", b"5")]))
            self.events.append("stalled:" + (await receive())["type"])
            try:
                await send(_body(b"after"))
                self.events.append("sent after disconnect")
            except Exception as exc:  # noqa: BLE001 - what a server raises here is the finding
                self.events.append(f"send raised {exc!r}")
        else:
            await send(_start(404, [(b"content-length", b"0")]))
            await send(_body(b""))


@pytest.fixture
def served() -> Iterator[tuple[int, App]]:
    app = App()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, http=GuardedHttpToolsProtocol, loop="uvloop", lifespan="off", access_log=False,
                            log_level="critical", timeout_keep_alive=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield port, app
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _read_response(sock: socket.socket, buffered: bytearray, method: bytes = b"GET") -> tuple[bytes, bytes]:
    """One response (its head, its body decoded from Content-Length or chunks) read off `sock`; `buffered` holds
    what was read past it."""
    while b"\r\n\r\n" not in buffered:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole head: {bytes(buffered)[:200]!r}"
        buffered += chunk
    end = buffered.index(b"\r\n\r\n") + 4
    head = bytes(buffered[:end])
    del buffered[:end]
    if head.startswith(b"HTTP/1.1 100 "):
        return head, b""
    fields = {line.split(b":", 1)[0].lower(): line.split(b":", 1)[1].strip()
              for line in head.split(b"\r\n")[1:] if b":" in line}
    status = int(head.split()[1])
    if method == b"HEAD" or status in (204, 304):
        return head, b""

    def need(size: int) -> None:
        while len(buffered) < size:
            chunk = sock.recv(1024 * 1024)
            assert chunk, "closed before the whole body"
            buffered.extend(chunk)

    if b"content-length" in fields:
        size = int(fields[b"content-length"])
        need(size)
        body = bytes(buffered[:size])
        del buffered[:size]
        return head, body
    assert fields.get(b"transfer-encoding") == b"chunked", head
    body = b""
    while True:
        while b"\r\n" not in buffered:
            need(len(buffered) + 1)
        line_end = buffered.index(b"\r\n")
        size = int(bytes(buffered[:line_end]), 16)
        need(line_end + 2 + size + 2)
        body += bytes(buffered[line_end + 2:line_end + 2 + size])
        assert buffered[line_end + 2 + size:line_end + 4 + size] == b"\r\n"
        del buffered[:line_end + 4 + size]
        if size == 0:
            return head, body


def _get(path: bytes, method: bytes = b"GET", extra: bytes = b"") -> bytes:
    return method + b" " + path + b" HTTP/1.1\r\nHost: localhost\r\n" + extra + b"\r\n"


def test_pipelined_requests_are_answered_whole_and_in_order(served: tuple[int, App]) -> None:
    port, _ = served
    with _connect(port) as sock:
        sock.sendall(_get(b"/small") + _get(b"/small", b"HEAD") + _get(b"/chunked") + _get(b"/204")
                     + _get(b"/big-pieces") + _get(b"/304") + _get(b"/small"))
        buffered = bytearray()
        answers = [_read_response(sock, buffered, method)
                   for method in (b"GET", b"HEAD", b"GET", b"GET", b"GET", b"GET", b"GET")]
        assert [int(head.split()[1]) for head, _ in answers] == [200, 200, 200, 204, 200, 304, 200]
        assert answers[0][1] == answers[6][1] == b"small"
        assert answers[1] == (answers[1][0], b"") and b"content-length: 5\r\n" in answers[1][0]
        assert answers[2][1] == b"onetwothree"
        assert answers[4][1] == b"".join(bytes([97 + i]) * (BIG // 8) for i in range(8))
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # nothing more: no stray head or body
        assert not buffered


def test_a_slow_reader_gets_the_large_answer_whole_and_the_next_one_after_it(
    served: tuple[int, App], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, _ = served
    drains: list[bool] = []  # each wait for the paused transport: was a response start held meanwhile?
    real_drain = FlowControl.drain

    async def drain(self: FlowControl) -> None:
        drains.append(self.write_paused)
        await real_drain(self)

    monkeypatch.setattr(FlowControl, "drain", drain)
    with _connect(port) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        # The second request's start is held while the first answer fills the paused transport: its head waits
        # for the transport to drain (uvicorn's send waits before it writes), and must come after the whole first.
        sock.sendall(_get(b"/big") + _get(b"/small"))
        time.sleep(0.5)
        buffered = bytearray()
        head, body = _read_response(sock, buffered)
        assert head.startswith(b"HTTP/1.1 200 ") and body == b"x" * BIG
        head, body = _read_response(sock, buffered)
        assert head.startswith(b"HTTP/1.1 200 ") and body == b"small"
        sock.sendall(_get(b"/chunked"))  # the same connection serves on
        assert _read_response(sock, buffered)[1] == b"onetwothree"
    assert drains and all(drains), "the transport never paused: the case was not made"


def test_expect_100_continue_is_answered_and_then_the_body_is_echoed(served: tuple[int, App]) -> None:
    port, _ = served
    with _connect(port) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        buffered = bytearray()
        head, _ = _read_response(sock, buffered)
        assert head == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"hello")
        head, body = _read_response(sock, buffered, b"POST")
        assert head.startswith(b"HTTP/1.1 200 ") and body == b"hello"


def test_a_refusal_decided_before_the_body_sends_no_100_continue(served: tuple[int, App]) -> None:
    """The application started a 413 and only then looked at the connection (receive()): the start is held, but it
    is the answer; a 100 Continue would have the client send the body it refuses (uvicorn sends none once the start
    is sent)."""
    port, app = served
    with _connect(port) as sock:
        sock.sendall(b"POST /refuse HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000000\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        buffered = bytearray()
        head, body = _read_response(sock, buffered, b"POST")
        assert head.startswith(b"HTTP/1.1 413 "), head
        assert body == b"too big!"
    deadline = time.monotonic() + 5
    while not app.events and time.monotonic() < deadline:
        time.sleep(0.02)
    assert app.events == ["watch:http.disconnect"]  # the watch saw the answer's end, not a body


def test_an_application_that_fails_after_its_start_is_answered_500_and_the_connection_serves_on(
    served: tuple[int, App]
) -> None:
    port, _ = served
    with _connect(port) as sock:
        sock.sendall(_get(b"/raise"))
        buffered = bytearray()
        head, body = _read_response(sock, buffered)
        assert head.startswith(b"HTTP/1.1 500 ") and body == b"Internal Server Error"
        assert b"200 OK" not in head


def test_a_start_with_no_body_before_the_client_leaves_writes_nothing_and_raises_nothing(
    served: tuple[int, App]
) -> None:
    port, app = served
    with _connect(port) as sock:
        sock.sendall(_get(b"/stall"))
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # the start is held: nothing is written before a body
    deadline = time.monotonic() + 5
    while "sent after disconnect" not in app.events and time.monotonic() < deadline:
        time.sleep(0.02)
    assert app.events == ["stalled:http.disconnect", "sent after disconnect"]
    with _connect(port) as sock:  # the server serves on
        sock.sendall(_get(b"/small"))
        assert _read_response(sock, bytearray())[1] == b"small"


def test_a_pipelined_request_with_a_large_body_is_answered_after_the_one_before_it(
    served: tuple[int, App], settings: Any
) -> None:
    """The request queued behind an answer has a body larger than WEB_DRAIN_BYTES still to come: the answer before
    it completing is no refusal of that body (the earlier request's body was read whole, or its successor's head
    could not have been parsed), so the queued request is served, not cut off by a lingering close."""
    settings.WEB_DRAIN_BYTES = 1024 * 1024  # read when the server's first connection comes
    port, _ = served
    body = b"b" * (4 * 1024 * 1024)
    with _connect(port) as sock:
        sender = threading.Thread(target=sock.sendall, args=(
            _get(b"/small") + b"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body,))
        sender.start()
        buffered = bytearray()
        assert _read_response(sock, buffered)[1] == b"small"
        head, echoed = _read_response(sock, buffered, b"POST")
        sender.join(10)
        assert head.startswith(b"HTTP/1.1 200 ") and echoed == body


def test_a_pipelined_chunked_request_is_answered_after_the_one_before_it(served: tuple[int, App]) -> None:
    """A chunked body has no length to judge: queued behind an answer, it was taken for a refused body still on its
    way, and the connection closed under it."""
    port, _ = served
    with _connect(port) as sock:
        sock.sendall(_get(b"/small") + b"POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + b"5\r\nhello\r\n")
        buffered = bytearray()
        assert _read_response(sock, buffered)[1] == b"small"  # answered while the queued body is still on its way
        sock.sendall(b"6\r\n world\r\n0\r\n\r\n")
        head, echoed = _read_response(sock, buffered, b"POST")
        assert head.startswith(b"HTTP/1.1 200 ") and echoed == b"hello world"
