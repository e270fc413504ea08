"""uvicorn's httptools protocol with the limits it lacks against slow and greedy clients (docs/security.md, "Slow
clients"): `uvicorn portal.asgi:application --http portal.web_server:GuardedHttpToolsProtocol`.

Measured on uvicorn 0.54 (httptools, the default): a connection that sent nothing, half a header, a head without its
final blank line or a body shorter than its Content-Length stayed open indefinitely (its only timer,
`--timeout-keep-alive`, is armed after a response, and cancelled by the next byte), so 20,000 of them used up the
process's descriptors. `--limit-concurrency` does not help: it counts those idle connections and answers every
other caller 503. What this adds, per connection, with one timer at a time:
- the head of a request must arrive whole within WEB_HEADER_TIMEOUT_SECONDS of its first byte (of the
  connection's opening for the first request): else 408 and closed (closed without an answer when nothing was sent);
- a body from which nothing arrives for WEB_BODY_TIMEOUT_SECONDS while the server is ready to read it (not while
  the application holds reading back, nor while the client waits for `100 Continue`): 408 and closed, and the
  application's `receive()` sees `http.disconnect`;
- at most WEB_MAX_CONNECTIONS_PER_CLIENT open connections per client address (an IPv6 client's /64): past it a
  new connection is answered 429 at once and closed, before any of it is read;
- at most WEB_MAX_CONNECTIONS in all (never more than the descriptors allow, infra/open_files.py): at it a new
  connection takes the place of the connection idle longest (no request head complete yet, or kept alive after
  its response), which is closed (408 when it had sent part of a head); only when every connection has a request
  in progress is the new one answered 503 and closed. Without this, half-sent heads from a few dozen addresses,
  each within its cap, filled the total and every new client was answered 503 until the header deadline, and an
  attacker reopening them kept it so;
- a refusal sent before the request's body was read (401, 404, 413) reaches a client that is still sending it.
  uvicorn closed such a connection at once when it was not kept alive (urllib always sends `Connection: close`),
  and the kernel answered the unread bytes with a reset that destroyed the answer: the client saw
  `BrokenPipeError` or `ConnectionResetError`. Now the rest of the body is read and dropped, on a kept-alive
  connection when at most WEB_DRAIN_BYTES of it are left, else in a lingering close (as nginx and Apache do):
  the answer is sent, the writing side shut, and what the client still sends is dropped for up to
  WEB_LINGER_SECONDS and WEB_DRAIN_BYTES, then the connection is closed;
- an answer the application ended before its end (the gateway ending a stream whose caller does not read,
  GATEWAY_STREAM_SEND_SECONDS) is reset (SO_LINGER 0, then aborted), not closed, while what was written is still
  unread: uvicorn's close waits for the buffer to drain, so the buffer and the descriptor stayed as long as the
  client did (and the kernel's send buffer after them).

And one thing for the cost of a response: uvicorn writes a response's head and its body in two system calls, two
TCP segments for the client to wake up for. A response's start is held until its first body message (the ASGI
specification allows a server to do so), and the two leave in one write (bench/gateway_options.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
import weakref
from collections import Counter, OrderedDict
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.fastpath.body_pieces import BodyPieces
from infra.open_files import connection_cap, raise_open_files_limit


@dataclass
class Limits:
    header_timeout: float
    body_timeout: float
    per_client: int
    total: int
    linger_seconds: float = 10.0
    drain_bytes: int = 64 * 1024**2
    # Not a limit: whether a body is kept as its pieces (gateway/fastpath/body_pieces.py) or in uvicorn's own
    # bytearray, the fast path's switch (GATEWAY_JSON_FAST_PATH) for an operator bisecting a problem.
    body_pieces: bool = True


@dataclass
class _Shared:
    """What the connections of one server count together."""

    limits: Limits
    open: int = 0
    per_address: Counter[str] = field(default_factory=Counter)
    # The counted connections without a request in progress, idle longest first: the ones a new connection may
    # take the place of at the total cap. An OrderedDict: O(1) to add at the end, remove anywhere and pop the first.
    idle: OrderedDict[GuardedHttpToolsProtocol, None] = field(default_factory=OrderedDict)


# uvicorn's --http value for this protocol (bin/run-portal, the image, the manifests, the tests).
UVICORN_HTTP = "portal.web_server:GuardedHttpToolsProtocol"

_shared: weakref.WeakKeyDictionary[ServerState, _Shared] = weakref.WeakKeyDictionary()


def limits_from_settings() -> Limits:
    from django.conf import settings  # the application (portal.asgi) has set Django up before the first connection

    return Limits(header_timeout=settings.WEB_HEADER_TIMEOUT_SECONDS, body_timeout=settings.WEB_BODY_TIMEOUT_SECONDS,
                  per_client=settings.WEB_MAX_CONNECTIONS_PER_CLIENT,
                  total=connection_cap(settings.WEB_MAX_CONNECTIONS, raise_open_files_limit()),
                  linger_seconds=settings.WEB_LINGER_SECONDS, drain_bytes=settings.WEB_DRAIN_BYTES,
                  body_pieces=settings.GATEWAY_JSON_FAST_PATH)


def address_key(client: tuple[str, int] | None) -> str | None:
    """The address a client's connections are counted under: an IPv6 client owns a /64 (2**64 addresses), so it
    is counted by that prefix, not by each address it can pick."""
    if client is None:  # a Unix socket: no address to tell clients apart
        return None
    try:
        address = ipaddress.ip_address(client[0].split("%", 1)[0])
    except ValueError:
        return client[0]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def plain_response(status: int, message: str) -> bytes:
    body = message.encode()
    return b"".join([STATUS_LINE[status], b"content-type: text/plain; charset=utf-8\r\n",
                     b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body])


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        shared = _shared.get(server_state)
        if shared is None:
            shared = _shared[server_state] = _Shared(limits_from_settings())
        self.shared = shared
        self.limits = shared.limits
        self.body_pieces = shared.limits.body_pieces
        self.address: str | None = None
        self.counted = False
        self.awaiting_head = True  # between a request's end (or the connection's start) and the next one's headers
        self.head_started = False  # a byte of the awaited head has arrived
        self.head_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.body_seen = 0.0
        self.body_declared: int | None = None  # the request's Content-Length; None: chunked
        self.body_read = 0
        self.drained = 0  # body bytes dropped after the response
        self.lingering = False
        self.linger_timer: asyncio.TimerHandle | None = None
        self.held_head: _ClosingAfterResponse | None = None  # the cycle whose response head waits for its body

    # --- Connections ----------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.address = address_key(self.client)
        shared, limits = self.shared, self.limits
        # The address's own cap first: a connection it refuses must not cost another client its connection.
        if self.address is not None and shared.per_address[self.address] >= limits.per_client:
            self._refuse(429, f"Too many open connections from your address (at most {limits.per_client}): "
                              "close some, or reuse them (keep-alive), and try again.")
            return
        if shared.open >= limits.total:
            if not shared.idle:
                self._refuse(503, f"The server holds its most open connections ({limits.total}), each with a "
                                  "request in progress; try again shortly.")
                return
            oldest, _ = shared.idle.popitem(last=False)
            oldest._shed()
        shared.open += 1
        if self.address is not None:
            shared.per_address[self.address] += 1
        self.counted = True
        self._arm_head_timer()
        self._mark_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self._uncount()
        super().connection_lost(exc)

    def _uncount(self) -> None:
        self._mark_busy()
        if not self.counted:
            return
        self.counted = False
        self.shared.open -= 1
        if self.address is not None:
            left = self.shared.per_address[self.address] - 1
            if left > 0:
                self.shared.per_address[self.address] = left
            else:  # so that the counter holds only addresses with connections open
                del self.shared.per_address[self.address]

    # An idle connection: counted, nothing of a request being read, answered or drained. Half-open connections
    # (part of a head, or nothing yet) are the cheap way to fill the total cap, from many addresses; a kept-alive
    # one costs its client a reconnect at most. One with a request in progress is never closed for another.

    def _mark_idle(self) -> None:
        """At the events after which the connection may have become idle: it goes to the end of the order."""
        cycle = self.cycle
        if (self.counted and self.awaiting_head and not self.lingering and not self.pipeline
                and (cycle is None or cycle.response_complete) and not self.transport.is_closing()):
            self.shared.idle[self] = None
            self.shared.idle.move_to_end(self)

    def _mark_busy(self) -> None:
        self.shared.idle.pop(self, None)

    def _shed(self) -> None:
        """Close this idle connection for a new one at the total cap: uncounted now, as the new one is counted."""
        self._uncount()
        self._cancel_timers()
        self._unset_keepalive_if_required()
        if self.head_started:
            self.transport.write(plain_response(
                408, "The server is at its connection cap and closed the connections that had not sent a whole "
                     "request head, the oldest first: send the request line and headers at once."))
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # a client that does not read would hold the descriptor until it did
        else:
            self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        self.transport.write(plain_response(status, message))
        self.transport.close()

    def _cancel_timers(self) -> None:
        for timer in (self.head_timer, self.body_timer, self.linger_timer):
            if timer is not None:
                timer.cancel()
        self.head_timer = self.body_timer = self.linger_timer = None

    # --- The head -------------------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            self._drop(len(data))
            return
        # After a response the next request's first byte starts its deadline (uvicorn's keep-alive timer, which
        # this byte cancels, bounded the wait for it).
        if self.awaiting_head and self.head_timer is None and self.counted:
            self._arm_head_timer()
        super().data_received(data)

    def on_message_begin(self) -> None:
        self.head_started = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self.awaiting_head = self.head_started = False
        self._mark_busy()
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        previous = self.cycle
        super().on_headers_complete()
        if self.cycle is not None and self.cycle is not previous:
            self.body_declared = _content_length(self.headers)
            self.body_read = self.drained = 0
            # The cycle closes the connection after a response that is not kept alive: through this, so that a
            # body still on its way is read first; and it writes a response's head with its body's first piece.
            transport = _ClosingAfterResponse(self, self.cycle)
            self.cycle.transport = transport  # type: ignore[assignment]
            self.cycle.send = transport.send  # type: ignore[method-assign,assignment]
        self.body_seen = self.loop.time()
        self.body_timer = self.loop.call_later(self.limits.body_timeout, self._body_timeout)

    def _arm_head_timer(self) -> None:
        self.head_timer = self.loop.call_later(self.limits.header_timeout, self._head_timeout)

    def _head_timeout(self) -> None:
        self.head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head waits behind the response being written: the server's delay, not the client's.
            self._arm_head_timer()
            return
        if self.head_started:
            self.transport.write(plain_response(
                408, f"The request's headers did not arrive within {self.limits.header_timeout:g} s: send the "
                     "request line and headers, and the blank line that ends them, at once."))
        self.transport.close()

    # --- The body -------------------------------------------------------------------------------------------

    def on_body(self, body: bytes) -> None:
        self.body_seen = self.loop.time()
        self.body_read += len(body)
        cycle = self.cycle
        if cycle is not None and cycle.response_complete:
            # The answer went out before the body was read: uvicorn's parser drops the rest, up to the bound.
            self.drained += len(body)
            if self.drained > self.limits.drain_bytes:
                self._linger()
                return
        if cycle is not None and self.body_pieces and type(cycle.body) is not BodyPieces:
            # uvicorn's empty bytearray, new with each receive(): what it does with it, BodyPieces does too.
            cycle.body = BodyPieces(cycle.body)  # type: ignore[assignment]
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        self.awaiting_head = True
        super().on_message_complete()
        self._mark_idle()  # a body read to its end after its response was sent

    # --- Refusals a client can read ------------------------------------------------------------------------

    def on_response_complete(self) -> None:
        self._flush_head()  # a response without a body write (HEAD) ends here: its head goes before anything else
        if self.lingering:
            return
        cycle = self.cycle
        # With requests queued (pipelined), self.cycle is the last of them, not the one answered; and the one
        # answered had its body read whole, or the next one's head could not have been parsed: nothing to drop.
        if cycle is not None and not self.pipeline and cycle.more_body and not self.transport.is_closing():
            left = None if self.body_declared is None else self.body_declared - self.body_read
            if left is None or left > self.limits.drain_bytes:
                # Too much (or an unknown amount) left to read it for the next request: answered, then closed.
                self.server_state.total_requests += 1
                self._linger()
                return
        super().on_response_complete()
        self._mark_idle()  # kept alive, waiting for the next request

    def close_after_response(self, cycle: Any) -> None:
        """The cycle's close: lingering when its answer is complete but its body is not (nothing else reads it)."""
        if self.lingering:
            return
        self._flush_head()
        if cycle.response_complete and cycle.more_body and not self.transport.is_closing():
            self._linger()
        elif not cycle.response_complete and self.transport.get_write_buffer_size():
            # An answer cut short (a stream the gateway ended for a slow reader) whose client is not reading what
            # was written: closed, the transport would hold that buffer and the descriptor until it did. Reset, not
            # only aborted: the kernel would otherwise keep trying to deliver its own send buffer to the client.
            _reset(self.transport)
        else:
            self.transport.close()

    def _flush_head(self) -> None:
        if self.held_head is not None:
            self.held_head.flush()

    def _linger(self) -> None:
        self._flush_head()
        self.lingering = True
        self._mark_busy()
        self._cancel_timers()
        self._unset_keepalive_if_required()
        self.drained = 0
        if self.transport.can_write_eof():
            self.transport.write_eof()  # sent after the answer: the client reads it, then the end
        self.flow.resume_reading()
        self.linger_timer = self.loop.call_later(self.limits.linger_seconds, self.transport.close)

    def _drop(self, size: int) -> None:
        self.drained += size
        if self.drained > self.limits.drain_bytes:
            self.transport.close()

    def _body_timeout(self) -> None:
        self.body_timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None:
            return
        now = self.loop.time()
        if self.flow.read_paused or cycle.waiting_for_100_continue:
            # The application has not asked for more yet: the client is not the one stalling.
            self.body_seen = now
        idle = now - self.body_seen
        if idle < self.limits.body_timeout:
            self.body_timer = self.loop.call_later(self.limits.body_timeout - idle, self._body_timeout)
            return
        if not cycle.response_started:
            self.transport.write(plain_response(
                408, f"Nothing of the request's body arrived for {self.limits.body_timeout:g} s: send it whole "
                     "(as many bytes as its Content-Length says), without pauses."))
        # The application's receive() now returns http.disconnect, and what it sends is dropped.
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()


def _reset(transport: asyncio.Transport) -> None:
    """Drop a connection at once, with what is buffered for it here and in the kernel (a TCP reset)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length" and value.isdigit():
            return int(value)
    return None


class _ClosingAfterResponse:
    """The transport as a request's cycle sees it: the same, except that its close() lets the protocol read what
    is left of the request's body first, and that it sends a response's head together with the body's first
    piece (`send` is the cycle's ASGI send, holding the start message until a body message comes)."""

    def __init__(self, protocol: GuardedHttpToolsProtocol, cycle: Any) -> None:
        self._protocol = protocol
        self._cycle = cycle
        self._transport = protocol.transport
        self._send = cycle.send  # uvicorn's
        self._start: MutableMapping[str, Any] | None = None  # a response start held until its first body message
        self._holding = False  # the next write is the head: keep it for the write after it
        self._head: bytes | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start" and not self._cycle.response_started:
            # The specification lets a server hold the start until the first body message, so that an error
            # meanwhile can still be answered with a 500 instead of a response cut short: uvicorn's 500 for an
            # application that failed (or returned) after its start replaces the start held.
            self._start = message
            # The answer is decided: a receive() before its body must not send `100 Continue` and invite the body
            # the answer may refuse (uvicorn sends none once it has written a start).
            self._cycle.waiting_for_100_continue = False
            return
        start = self._start
        if start is None:
            await self._send(message)
            return
        self._start = None
        # Within these two calls nothing else runs on the connection: uvicorn writes without awaiting (it waits
        # for the client only before writing, while the transport is paused, and this head is not written yet).
        self._holding = True
        try:
            await self._send(start)
            await self._send(message)
        finally:
            self._holding = False
            self.flush()

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = self._protocol.held_head = None
            self._transport.writelines((head, data))  # one system call (writev), the body not copied
        elif self._holding:
            self._holding = False
            self._head = data
            self._protocol.held_head = self
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Write a held head now (a response with no body write, or before the connection's end)."""
        self._holding = False
        head, self._head = self._head, None
        if head is not None:
            self._protocol.held_head = None
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._protocol.close_after_response(self._cycle)
