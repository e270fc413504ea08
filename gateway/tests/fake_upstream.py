"""A scriptable HTTP/1.1 server on a real socket, standing in for Triton where a test needs an answer that a real
Triton never gives (bad framing, a stall, an extra response) or needs to count connections. The real Triton runs
in tests/test_gateway_e2e.py.

Each request is parsed (Content-Length or chunked body) and handed to `answer(request)`, which returns the raw
bytes to write (or None to close the connection without answering), or an async iterator of bytes written as they
come (a stream that may never end); requests and connections are recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field


@dataclass
class Request:
    method: str
    target: bytes
    headers: dict[bytes, bytes]
    body: bytes
    connection: int  # which connection (0, 1, ...) it came on


Answer = Callable[[Request], Awaitable[bytes | None] | bytes | AsyncIterator[bytes] | None]


def response(status: int = 200, body: bytes = b"", headers: dict[str, str] | None = None,
             content_length: bool = True) -> bytes:
    head = [f"HTTP/1.1 {status} X".encode()]
    for name, value in (headers or {}).items():
        head.append(f"{name}: {value}".encode())
    if content_length:
        head.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def json_response(payload: object, status: int = 200) -> bytes:
    return response(status, json.dumps(payload).encode(), {"Content-Type": "application/json"})


def chunked(status: int, pieces: list[bytes], trailer: bytes = b"") -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n" + trailer + b"\r\n"
    return b"HTTP/1.1 %d X\r\nTransfer-Encoding: chunked\r\n\r\n" % status + body


def echo(request: Request) -> bytes:
    """The request as JSON: what the gateway forwarded, for the test to compare."""
    return json_response({"method": request.method, "target": request.target.decode("latin-1"),
                          "body": request.body.decode("latin-1"), "connection": request.connection})


@dataclass
class FakeUpstream:
    answer: Answer = echo
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    open_connections: int = 0
    server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> FakeUpstream:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.wait_closed(), 1)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = self.connections
        self.connections += 1
        self.open_connections += 1
        try:
            while True:
                request = await _read_request(reader, number)
                if request is None:
                    return
                self.requests.append(request)
                answer = self.answer(request)
                if asyncio.iscoroutine(answer):
                    answer = await answer
                if answer is None:
                    return
                if hasattr(answer, "__aiter__"):
                    async for written in answer:
                        writer.write(written)
                        await writer.drain()
                    continue
                writer.write(answer)  # type: ignore[arg-type]
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self.open_connections -= 1
            writer.close()


async def _read_request(reader: asyncio.StreamReader, connection: int) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head[:-4].split(b"\r\n")
    method, target, _version = lines[0].split(b" ")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    elif headers.get(b"transfer-encoding") == b"chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    else:
        body = b""
    return Request(method.decode(), target, headers, body, connection)
