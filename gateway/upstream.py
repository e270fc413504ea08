"""A minimal HTTP/1.1 client for the gateway's one job: forward a request to a Triton server over a pooled
keep-alive connection and hand back the response.

Why not aiohttp: measured in bench/gateway_overhead.py, aiohttp's client cost about as much CPU per request as the
rest of the gateway together; on a machine whose CPUs also run Triton that CPU comes straight out of inference.
Triton answers with Content-Length (or chunked for streamed responses), which is all this needs to understand.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEADER_BYTES = 64 * 1024


class UpstreamError(Exception):
    """The upstream could not be reached, or broke the connection / the protocol."""


@dataclass
class Response:
    status: int
    headers: list[tuple[bytes, bytes]]  # lower-case names, hop-by-hop headers removed
    content_length: int | None  # None: chunked, read with iter_body()
    _conn: _Connection
    _pool: Pool

    async def read(self) -> bytes:
        assert self.content_length is not None
        try:
            body = await self._conn.reader.readexactly(self.content_length) if self.content_length else b""
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self._conn.close()
            raise UpstreamError(f"the upstream closed the connection mid-response: {exc}") from None
        self._pool.release(self._conn)
        return body

    async def iter_body(self) -> AsyncIterator[bytes]:
        """Chunked transfer decoding."""
        reader = self._conn.reader
        try:
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                yield await reader.readexactly(size)
                await reader.readexactly(2)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError) as exc:
            self._conn.close()
            raise UpstreamError(f"bad chunked response from upstream: {exc}") from None
        self._pool.release(self._conn)

    def discard(self) -> None:
        self._conn.close()


class _Connection:
    def __init__(self, key: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.key = key
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"server", b"date"}


class Pool:
    """Idle keep-alive connections per upstream (host, port)."""

    def __init__(self, max_idle_per_host: int = 64, connect_timeout: float = 5.0) -> None:
        self.idle: dict[tuple[str, int], list[_Connection]] = {}
        self.max_idle = max_idle_per_host
        self.connect_timeout = connect_timeout

    def release(self, conn: _Connection) -> None:
        if conn.writer.is_closing() or conn.reader.at_eof():
            conn.close()
            return
        idle = self.idle.setdefault(conn.key, [])
        if len(idle) < self.max_idle:
            idle.append(conn)
        else:
            conn.close()

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
            if not conn.writer.is_closing() and not conn.reader.at_eof():
                return conn
            conn.close()
        return None

    async def request(self, method: str, base_url: str, target: str, headers: list[tuple[bytes, bytes]],
                      body: bytes | AsyncIterator[bytes] | None, content_length: int | None) -> Response:
        parts = urlsplit(base_url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        head = [f"{method} {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n".encode("latin-1")]
        head += [name + b": " + value + b"\r\n" for name, value in headers]
        if isinstance(body, bytes):
            head.append(b"content-length: %d\r\n" % len(body))
        elif body is not None:
            head.append(b"content-length: %d\r\n" % content_length if content_length is not None
                        else b"transfer-encoding: chunked\r\n")
        head.append(b"\r\n")
        request_head = b"".join(head)
        # A pooled connection may have been closed by the server meanwhile: retry once on a fresh one, but only
        # when nothing of a streamed body was consumed yet.
        for attempt in (0, 1):
            conn = self._take_idle((host, port)) if attempt == 0 else None
            fresh = conn is None
            if conn is None:
                conn = await self._connect(host, port)
            try:
                conn.writer.write(request_head)
                if isinstance(body, bytes):
                    conn.writer.write(body)
                elif body is not None:
                    await _send_stream(conn, body, chunked=content_length is None)
                await conn.writer.drain()
                return await self._read_head(conn)
            except (ConnectionError, asyncio.IncompleteReadError, UpstreamError) as exc:
                conn.close()
                if fresh or not isinstance(body, (bytes, type(None))):
                    raise UpstreamError(f"the upstream connection failed: {exc}") from None
            except BaseException:
                conn.close()  # half a request was written: the connection cannot be reused
                raise
        raise UpstreamError("the upstream connection failed")

    async def _read_head(self, conn: _Connection) -> Response:
        try:
            raw = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise UpstreamError("the upstream sent oversized headers") from None
        lines = raw[:-4].split(b"\r\n")
        try:
            status = int(lines[0].split(b" ", 2)[1])
        except (IndexError, ValueError):
            raise UpstreamError(f"bad status line from upstream: {lines[0][:100]!r}") from None
        headers: list[tuple[bytes, bytes]] = []
        length: int | None = None
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            if name not in HOP_BY_HOP:
                headers.append((name, value))
        if length is None and not chunked:
            length = 0
        return Response(status=status, headers=headers, content_length=None if chunked else length, _conn=conn, _pool=self)

    def close(self) -> None:
        for conns in self.idle.values():
            for conn in conns:
                conn.close()
        self.idle.clear()


async def _send_stream(conn: _Connection, body: AsyncIterator[bytes], chunked: bool) -> None:
    async for chunk in body:
        if chunked:
            conn.writer.write(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        else:
            conn.writer.write(chunk)
        await conn.writer.drain()
    if chunked:
        conn.writer.write(b"0\r\n\r\n")
