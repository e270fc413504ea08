"""How portal/web_server.py's protocol writes a response: its head together with the first piece of its body (one
write, a writev), and the order of everything around it (closing, lingering, uvicorn's own 500). The protocol is
driven in memory, with a transport that records each write, so that the number of writes is what is asserted; the
real socket's behaviour is tests/test_slow_clients.py's and tests/test_readable_refusals.py's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.fastpath.body_pieces import BodyPieces
from portal.web_server import GuardedHttpToolsProtocol

Message = MutableMapping[str, Any]
App = Callable[[Message, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class RecordingTransport(asyncio.Transport):
    """Each write as the kernel would see it: ("write", bytes) or ("writelines", the parts joined), and the end."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, bytes]] = []
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closing, "written after close"
        self.calls.append(("write", bytes(data)))

    def writelines(self, list_of_data: Any) -> None:
        assert not self.closing, "written after close"
        self.calls.append(("writelines", b"".join(list_of_data)))

    def write_eof(self) -> None:
        self.calls.append(("eof", b""))

    def can_write_eof(self) -> bool:
        return True

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.calls.append(("close", b""))
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _exchange(app: App, request: bytes) -> list[tuple[str, bytes]]:
    async def run() -> list[tuple[str, bytes]]:
        config = Config(app=app, http=GuardedHttpToolsProtocol, lifespan="off", access_log=False, log_level="error")
        config.load()
        protocol = GuardedHttpToolsProtocol(config, ServerState(), {})
        transport = RecordingTransport()
        protocol.connection_made(transport)
        protocol.data_received(request)
        for _ in range(100):  # the application's task, and uvicorn's after it
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return transport.calls

    return asyncio.run(run())


def _writes(calls: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The writes alone (the transport refuses a write after its close, so a close can only come after them)."""
    return [(kind, data) for kind, data in calls if kind in ("write", "writelines")]


def _sends(*messages: Message) -> App:
    async def app(scope: Message, receive: Callable[[], Awaitable[Message]],
                  send: Callable[[Message], Awaitable[None]]) -> None:
        while (await receive()).get("more_body"):
            pass
        for message in messages:
            await send(message)

    return app


START = {"type": "http.response.start", "status": 200,
         "headers": [(b"content-type", b"application/json"), (b"content-length", b"11")]}
GET = b"GET /serve/x/v2 HTTP/1.1\r\nHost: localhost\r\n\r\n"


def test_a_response_head_and_its_body_leave_in_one_write() -> None:
    calls = _writes(_exchange(_sends(START, {"type": "http.response.body", "body": b'{"a": true}'}), GET))
    assert len(calls) == 1
    kind, data = calls[0]
    assert kind == "writelines"
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-length: 11\r\n" in data
    assert data.endswith(b'\r\n\r\n{"a": true}')


def test_a_streamed_response_sends_its_head_with_the_first_piece_and_the_rest_as_it_comes() -> None:
    start = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"9")]}
    calls = _writes(_exchange(_sends(start, {"type": "http.response.body", "body": b"abc", "more_body": True},
                                     {"type": "http.response.body", "body": b"def", "more_body": True},
                                     {"type": "http.response.body", "body": b"ghi"}), GET))
    assert [kind for kind, _ in calls] == ["writelines", "write", "write"]
    assert calls[0][1].endswith(b"\r\n\r\nabc")
    assert b"".join(data for _, data in calls).endswith(b"\r\n\r\nabcdefghi")


def test_a_head_request_gets_its_head_alone() -> None:
    start = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"11")]}
    calls = _writes(_exchange(_sends(start, {"type": "http.response.body", "body": b""}),
                              b"HEAD /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"))
    assert len(calls) == 1
    assert calls[0][0] == "write"
    assert calls[0][1].startswith(b"HTTP/1.1 200 OK\r\n") and calls[0][1].endswith(b"content-length: 11\r\n\r\n")


def test_a_response_that_closes_the_connection_is_written_whole_before_the_close() -> None:
    calls = _exchange(_sends(START, {"type": "http.response.body", "body": b'{"a": true}'}),
                      b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert [kind for kind, _ in calls] == ["writelines", "close"]
    assert b"connection: close\r\n" in calls[0][1]
    assert calls[0][1].endswith(b'{"a": true}')


def test_an_application_that_fails_after_its_start_is_answered_500_not_cut_short() -> None:
    async def failing(scope: Message, receive: Callable[[], Awaitable[Message]],
                      send: Callable[[Message], Awaitable[None]]) -> None:
        await send(START)
        raise RuntimeError("the application broke between its start and its body")

    calls = _exchange(failing, GET)
    sent = b"".join(data for _, data in calls)
    assert sent.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert b"200 OK" not in sent
    assert sent.endswith(b"Internal Server Error")


def test_an_application_that_returns_after_its_start_is_answered_500() -> None:
    calls = _exchange(_sends(START), GET)
    sent = b"".join(data for _, data in calls)
    assert sent.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert b"200 OK" not in sent


def test_a_refusal_sent_before_the_body_is_written_whole_before_the_lingering_close() -> None:
    async def refusing(scope: Message, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        await send({"type": "http.response.start", "status": 413, "headers": [(b"content-length", b"8")]})
        await send({"type": "http.response.body", "body": b"too big!"})

    # A body far larger than WEB_DRAIN_BYTES is announced and only its first bytes sent: the answer, then the end
    # of the writing side (the lingering close), in that order.
    request = (b"POST /serve/x/v2/models/m/infer HTTP/1.1\r\nHost: localhost\r\nContent-Length: 999999999\r\n\r\n"
               + b"x" * 1000)
    calls = _exchange(refusing, request)
    assert [kind for kind, _ in calls][:2] == ["writelines", "eof"]
    assert calls[0][1].startswith(b"HTTP/1.1 413 ") and calls[0][1].endswith(b"too big!")


def _bodies(pieces: list[bytes], yield_between: bool) -> list[Any]:
    """The body of each http.request message the application receives when the request's bytes arrive in
    `pieces` (the application's task runs between them when `yield_between`)."""
    bodies: list[Any] = []

    async def app(scope: Message, receive: Callable[[], Awaitable[Message]],
                  send: Callable[[Message], Awaitable[None]]) -> None:
        while True:
            message = await receive()
            bodies.append(message["body"])
            if not message.get("more_body"):
                break
        await send(START)
        await send({"type": "http.response.body", "body": b'{"a": true}'})

    async def run() -> None:
        config = Config(app=app, http=GuardedHttpToolsProtocol, lifespan="off", access_log=False, log_level="error")
        config.load()
        protocol = GuardedHttpToolsProtocol(config, ServerState(), {})
        transport = RecordingTransport()
        protocol.connection_made(transport)
        for piece in pieces:
            protocol.data_received(piece)
            for _ in range(20 if yield_between else 0):
                await asyncio.sleep(0)
        for _ in range(100):
            await asyncio.sleep(0)
        assert _writes(transport.calls)[0][1].startswith(b"HTTP/1.1 200")
        protocol.connection_lost(None)

    asyncio.run(run())
    return bodies


BODY = bytes(range(256)) * 1000  # over uvicorn's 64 KB mark, where it pauses reading until the next receive()
POST = b"POST /serve/x/v2/models/m/infer HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % len(BODY)


def test_a_body_that_arrives_in_one_piece_reaches_the_application_as_those_bytes() -> None:
    bodies = _bodies([POST + BODY], yield_between=False)
    assert bodies == [BODY] and type(bodies[0]) is bytes


def test_with_the_fast_path_off_uvicorns_own_buffer_gives_the_application_the_same_bodies(settings: Any) -> None:
    """GATEWAY_JSON_FAST_PATH=false (an operator bisecting) leaves uvicorn's bytearray in place: the reference."""
    cases = [[POST + BODY], [POST] + [BODY[at:at + 7000] for at in range(0, len(BODY), 7000)],
             [POST] + [BODY[at:at + 1] for at in range(0, 3000)] + [BODY[3000:]]]
    for yield_between in (False, True):
        fast = [_bodies(pieces, yield_between) for pieces in cases]
        settings.GATEWAY_JSON_FAST_PATH = False
        plain = [_bodies(pieces, yield_between) for pieces in cases]
        settings.GATEWAY_JSON_FAST_PATH = True
        assert [[bytes(body) for body in bodies] for bodies in plain] == fast


def test_a_body_in_many_pieces_reaches_the_application_whole_and_in_order_as_bytes() -> None:
    pieces = [POST] + [BODY[at:at + 7000] for at in range(0, len(BODY), 7000)]
    for yield_between in (False, True):  # every piece before the first receive(), or a receive() after each
        bodies = _bodies(pieces, yield_between)
        assert b"".join(bodies) == BODY and all(type(body) is bytes for body in bodies)
        assert len(bodies) == (1 if not yield_between else len(pieces) - 1)


def test_a_body_trickled_a_byte_per_read_is_kept_in_a_bounded_number_of_pieces() -> None:
    """A hostile client's one-byte reads must not cost a Python object each while the application is not reading."""
    kept = BodyPieces()
    for byte in BODY[:5000]:
        kept += bytes([byte])
        assert len(kept.pieces) <= BodyPieces.MAX_PIECES
    assert kept.buffer is not None and not kept.pieces  # one buffer from then on, as uvicorn's, no join per piece
    assert len(kept) == 5000 and bytes(kept) == BODY[:5000]
    pieces = [POST] + [BODY[at:at + 1] for at in range(0, 3000)] + [BODY[3000:]]
    bodies = _bodies(pieces, yield_between=False)
    assert bodies == [BODY]
