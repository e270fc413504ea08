"""A minimal HTTP/1.1 client for the gateway's one job: forward a request to a Triton server over a pooled
keep-alive connection and hand back the response.

Why not aiohttp: measured in bench/gateway_overhead.py, aiohttp's client cost about as much CPU per request as the
rest of the gateway together; on a machine whose CPUs also run Triton that CPU comes straight out of inference.

Why it is strict: the connections are shared by every caller of a deployment, so a response read one byte short or
long hands the next caller someone else's answer (issue 12: one request smuggled into a pooled connection made 29
of 30 later answers wrong). So it refuses any response whose framing is not plain (one Content-Length, or chunked
alone), and a connection goes back to the pool only when its exchange ended exactly: the request was written
whole, the body was read to its last byte, nothing more is buffered, and neither side asked to close. Anything
else (an error, a timeout, a cancelled task, a reader that stopped early) closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncGenerator, AsyncIterator
from urllib.parse import urlsplit

from infra import tracing

MAX_HEADER_BYTES = 64 * 1024
MAX_HEADER_LINES = 100
READ_SIZE = 64 * 1024

# Hop-by-hop headers and the ones the gateway sets itself are not passed to the client.
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"server", b"date",
              b"proxy-connection", b"te", b"trailer", b"upgrade"}
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: [^\r\n]*)?")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:;[^\r\n]*)?\r\n")
_UNSAFE_TARGET_BYTE = re.compile(rb"[\x00-\x20\x7f-\xff]")
# Small bodies go out with the head in one write (one system call); larger ones in two, so that a loop without a
# writev (asyncio's own on Python 3.11 joins what writelines is given) never copies a large body for it.
COALESCE_BYTES = 64 * 1024


def _chunk_size(line: bytes) -> int:
    match = _CHUNK_SIZE.fullmatch(line)
    if match is None:
        raise UpstreamError(f"bad chunk size line from upstream: {line[:100]!r}")
    return int(match.group(1), 16)


class UpstreamError(Exception):
    """The upstream could not be reached, or broke the connection or the protocol."""


class ResponseTooLarge(UpstreamError):
    """The response body is over the caller's limit."""


class _Connection:
    def __init__(self, key: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.key = key
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()

    def is_clean(self) -> bool:
        """Open, and with no byte waiting that belongs to no request of ours."""
        reader = self.reader
        # StreamReader has no public "bytes buffered" API; its _buffer is the one place unread bytes can hide.
        return (not self.writer.is_closing() and not reader.at_eof() and reader.exception() is None
                and not getattr(reader, "_buffer", b""))


class Response:
    """The status and headers of one upstream response; its body is read with read() or iter_body(), once.

    Framing: `content_length` bytes, or chunked (`content_length` None, `chunked` True), or up to the end of the
    connection (neither; never pooled). Call close() when done in any case: it is a no-op after a complete read,
    and drops the connection otherwise."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], content_length: int | None, chunked: bool,
                 keep_alive: bool, conn: _Connection, pool: Pool) -> None:
        self.status = status
        self.headers = headers  # lower-case names, hop-by-hop headers removed
        self.content_length = content_length
        self.chunked = chunked
        self._keep_alive = keep_alive
        self._conn: _Connection | None = conn
        self._pool = pool

    async def read(self, limit: int) -> bytes:
        """The whole body; ResponseTooLarge past `limit` bytes."""
        if self.content_length is not None and self.content_length > limit:
            self.close()
            raise ResponseTooLarge(f"the response is {self.content_length} bytes")
        if self.content_length is not None and self._conn is not None:
            # The common case in one call: no generator, no list of parts.
            try:
                body = await self._conn.reader.readexactly(self.content_length) if self.content_length else b""
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                self.close()
                raise UpstreamError(f"the upstream closed the connection mid-response: {exc}") from None
            except BaseException:
                self.close()
                raise
            self._finish()
            return body
        parts = []
        async for part in self.iter_body(limit):
            parts.append(part)
        return b"".join(parts)

    async def iter_body(self, limit: int, idle_timeout: float | None = None) -> AsyncGenerator[bytes, None]:
        """The body in pieces as they arrive; ResponseTooLarge past `limit` bytes, TimeoutError when no byte
        comes for `idle_timeout` seconds. Stopping early (break, an exception, a cancelled task) closes the
        connection."""
        conn = self._conn
        if conn is None:
            raise UpstreamError("the response body was already read")
        if self.content_length is not None and self.content_length > limit:
            self.close()
            raise ResponseTooLarge(f"the response is {self.content_length} bytes")
        reader = conn.reader
        received = 0
        try:
            if self.content_length is not None:
                remaining = self.content_length
                while remaining:
                    async with asyncio.timeout(idle_timeout):
                        piece = await reader.read(min(remaining, READ_SIZE))
                    if not piece:
                        raise UpstreamError(f"the upstream closed the connection with {remaining} bytes unsent")
                    remaining -= len(piece)
                    yield piece
            elif self.chunked:
                while True:
                    small = None
                    # A small chunk (a stream's piece is one) is read with its size line and CRLF under one timeout:
                    # a timeout per read was three per piece, a third of the relay's CPU per piece
                    # (docs/benchmarks.md, "Streaming"). A chunk this small taking the idle time to arrive is an idle
                    # upstream.
                    async with asyncio.timeout(idle_timeout):
                        size = _chunk_size(await reader.readuntil(b"\r\n"))
                        if 0 < size <= READ_SIZE and received + size <= limit:
                            small = await reader.readexactly(size + 2)
                    if size == 0:
                        break
                    received += size
                    if received > limit:
                        raise ResponseTooLarge(f"the response is over {limit} bytes")
                    if small is not None:
                        if small[-2:] != b"\r\n":
                            raise UpstreamError("a chunk from upstream is longer than its size")
                        yield small[:-2]
                        continue
                    while size:
                        async with asyncio.timeout(idle_timeout):
                            piece = await reader.read(min(size, READ_SIZE))
                        if not piece:
                            raise UpstreamError("the upstream closed the connection mid-chunk")
                        size -= len(piece)
                        yield piece
                    async with asyncio.timeout(idle_timeout):
                        if await reader.readexactly(2) != b"\r\n":
                            raise UpstreamError("a chunk from upstream is longer than its size")
                # Trailer fields up to the empty line; read and dropped.
                for _ in range(MAX_HEADER_LINES):
                    async with asyncio.timeout(idle_timeout):
                        if await reader.readuntil(b"\r\n") == b"\r\n":
                            break
                else:
                    raise UpstreamError("too many trailer lines from upstream")
            else:
                while True:
                    async with asyncio.timeout(idle_timeout):
                        piece = await reader.read(READ_SIZE)
                    if not piece:
                        break
                    received += len(piece)
                    if received > limit:
                        raise ResponseTooLarge(f"the response is over {limit} bytes")
                    yield piece
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as exc:
            self.close()
            raise UpstreamError(f"bad response body from upstream: {exc!r}") from None
        except BaseException:
            self.close()  # a timeout, a cancelled task, a consumer that stopped early (GeneratorExit)
            raise
        self._finish()

    def _finish(self) -> None:
        """The body was read to its end: the connection may serve the next request if nothing else is pending."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._keep_alive and (self.content_length is not None or self.chunked):
            self._pool.release(conn)
        else:
            conn.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class Pool:
    """Idle keep-alive connections per upstream (host, port)."""

    def __init__(self, max_idle_per_host: int = 64, connect_timeout: float = 5.0) -> None:
        self.idle: dict[tuple[str, int], list[_Connection]] = {}
        self.max_idle = max_idle_per_host
        self.connect_timeout = connect_timeout
        self._upstreams: dict[str, tuple[str, int, bytes]] = {}  # base URL -> host, port, Host header

    def release(self, conn: _Connection) -> None:
        if not conn.is_clean():
            conn.close()
            return
        idle = self.idle.setdefault(conn.key, [])
        if len(idle) < self.max_idle:
            idle.append(conn)
        else:
            conn.close()

    def idle_count(self) -> int:
        return sum(len(conns) for conns in self.idle.values())

    async def _connect(self, host: str, port: int) -> _Connection:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=MAX_HEADER_BYTES),
                                                    self.connect_timeout)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to {host}:{port}: {exc}") from None
        return _Connection((host, port), reader, writer)

    def _take_idle(self, key: tuple[str, int]) -> _Connection | None:
        idle = self.idle.get(key)
        while idle:
            conn = idle.pop()
            # Bytes that arrived while it was idle answer no request of ours: never read them as the next answer.
            if conn.is_clean():
                return conn
            conn.close()
        return None

    async def request(self, method: str, base_url: str, target: bytes, headers: list[tuple[bytes, bytes]],
                      body: bytes | AsyncIterator[bytes] | None, content_length: int | None) -> Response:
        """Send one request; `target` is the raw request target (path and query), already checked by the caller
        to hold no space or control character. A streamed `body` is sent with `content_length` (exactly that many
        bytes, else the connection is dropped) or chunked when it is None."""
        if not target.startswith(b"/") or _UNSAFE_TARGET_BYTE.search(target):
            raise ValueError(f"unsafe request target {target[:100]!r}")  # the caller's bug, never sent
        upstream = self._upstreams.get(base_url)
        if upstream is None:
            parts = urlsplit(base_url)
            upstream = self._upstreams[base_url] = (parts.hostname or "127.0.0.1", parts.port or 80,
                                                    parts.netloc.encode("idna"))
        host, port, netloc = upstream
        head = [method.encode("ascii") + b" " + target + b" HTTP/1.1\r\nhost: " + netloc + b"\r\n"]
        head += [name + b": " + value + b"\r\n" for name, value in headers]
        if tracing.tracer is not None:
            # The gateway's span (the current one) as the parent of Triton's: the caller's own traceparent is never
            # forwarded (it is not in the gateway's list of forwarded headers).
            parent = tracing.traceparent()
            if parent is not None:
                head.append(b"traceparent: " + parent + b"\r\n")
        if isinstance(body, bytes):
            head.append(b"content-length: %d\r\n" % len(body))
        elif body is not None:
            head.append(b"content-length: %d\r\n" % content_length if content_length is not None
                        else b"transfer-encoding: chunked\r\n")
        head.append(b"\r\n")
        request_head = b"".join(head)
        # A pooled connection may have been closed by the server meanwhile: retry once on a fresh one, but only
        # when nothing of a streamed body was consumed and not one byte of an answer came back.
        for attempt in (0, 1):
            conn = self._take_idle((host, port)) if attempt == 0 else None
            fresh = conn is None
            if conn is None:
                conn = await self._connect(host, port)
            try:
                try:
                    if isinstance(body, bytes):
                        if len(body) <= COALESCE_BYTES:
                            # One system call; uvloop's writelines is a writev, with no copy of the body.
                            conn.writer.writelines((request_head, body))
                        else:
                            conn.writer.write(request_head)
                            conn.writer.write(body)
                    else:
                        conn.writer.write(request_head)
                        if body is not None:
                            await _send_stream(conn, body, content_length)
                    await conn.writer.drain()
                except ConnectionError as exc:
                    raise _NothingBack(f"writing failed: {exc!r}") from None
                return await self._read_head(conn, method)
            except _NothingBack as exc:
                conn.close()
                if fresh or not isinstance(body, (bytes, type(None))):
                    raise UpstreamError(f"the upstream connection failed: {exc.reason}") from None
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                conn.close()
                raise UpstreamError(f"the upstream connection failed: {exc!r}") from None
            except BaseException:
                conn.close()  # half an exchange happened: the connection cannot be reused
                raise
        raise UpstreamError("the upstream connection failed")

    async def _read_head(self, conn: _Connection, method: str) -> Response:
        while True:
            try:
                raw = await conn.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    raise _NothingBack("closed before answering") from None
                raise UpstreamError("the upstream closed the connection mid-header") from None
            except ConnectionResetError:
                raise _NothingBack("reset before answering") from None
            except asyncio.LimitOverrunError:
                raise UpstreamError("the upstream sent oversized headers") from None
            lines = raw[:-4].split(b"\r\n")
            status_line = _STATUS_LINE.fullmatch(lines[0])
            if status_line is None:
                raise UpstreamError(f"bad status line from upstream: {lines[0][:100]!r}")
            status = int(status_line.group(2))
            if status == 100 or status == 103:
                continue  # interim answers; the real one follows
            if status < 200:
                raise UpstreamError(f"unexpected status {status} from upstream")
            break
        if len(lines) > MAX_HEADER_LINES:
            raise UpstreamError("too many header lines from upstream")
        headers: list[tuple[bytes, bytes]] = []
        lengths: set[bytes] = set()
        transfer_encoding: bytes | None = None
        keep_alive = status_line.group(1) == b"1"
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or _TOKEN.fullmatch(name) is None:
                raise UpstreamError(f"bad header line from upstream: {line[:100]!r}")
            name, value = name.lower(), value.strip(b" \t")
            if name == b"content-length":
                lengths.add(value)
            elif name == b"transfer-encoding":
                if transfer_encoding is not None:
                    raise UpstreamError("more than one Transfer-Encoding header from upstream")
                transfer_encoding = value.lower()
            elif name == b"connection":
                tokens = {t.strip() for t in value.lower().split(b",")}
                if b"close" in tokens:
                    keep_alive = False
                elif b"keep-alive" in tokens and status_line.group(1) == b"0":
                    keep_alive = True
            if name not in HOP_BY_HOP:
                headers.append((name, value))
        if len(lengths) > 1:
            raise UpstreamError("conflicting Content-Length headers from upstream")
        if lengths and transfer_encoding is not None:
            raise UpstreamError("both Content-Length and Transfer-Encoding from upstream")
        if transfer_encoding is not None and transfer_encoding != b"chunked":
            raise UpstreamError(f"unsupported Transfer-Encoding from upstream: {transfer_encoding[:50]!r}")
        length: int | None = None
        if lengths:
            value = lengths.pop()
            if not value.isdigit() or len(value) > 18:
                raise UpstreamError(f"bad Content-Length from upstream: {value[:30]!r}")
            length = int(value)
        if method == "HEAD" or status in (204, 304):
            length, transfer_encoding = 0, None  # no body, whatever the headers say
            # Triton answers a HEAD with a 405 *and a body*: a connection that saw a HEAD is never reused.
            keep_alive = keep_alive and method != "HEAD"
        return Response(status, headers, length, transfer_encoding == b"chunked", keep_alive, conn, self)

    def close(self) -> None:
        for conns in self.idle.values():
            for conn in conns:
                conn.close()
        self.idle.clear()


class _NothingBack(Exception):
    """The connection ended before a single byte of the answer: safe to retry a pooled one."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def _send_stream(conn: _Connection, body: AsyncIterator[bytes], content_length: int | None) -> None:
    sent = 0
    async for chunk in body:
        if not chunk:
            continue
        sent += len(chunk)
        if content_length is None:
            conn.writer.write(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        else:
            if sent > content_length:
                raise UpstreamError("the request body is longer than its Content-Length")
            conn.writer.write(chunk)
        await conn.writer.drain()
    if content_length is None:
        conn.writer.write(b"0\r\n\r\n")
    elif sent != content_length:
        raise UpstreamError(f"the request body ended after {sent} of {content_length} bytes")
