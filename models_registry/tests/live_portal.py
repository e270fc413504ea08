"""The portal's ASGI application (portal.asgi, as `make run` serves it) on a real uvicorn server in a thread of the
test process, so that tests speak raw HTTP to it (chunked bodies, bodies cut short, dropped connections) while it
uses the test's database and settings."""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class Live:
    host: str
    port: int

    def connect(self, timeout: float = 10) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=timeout)


@contextmanager
def live_portal() -> Iterator[Live]:
    import uvicorn

    from portal.asgi import application

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off", access_log=False))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield Live("127.0.0.1", port)
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def request_head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode("latin-1")


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def read_answer(sock: socket.socket) -> Answer:
    """One HTTP/1.1 response (with a Content-Length, as every answer of the tus path has)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed before a response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return Answer(int(status_line.split()[1]), headers, body)


def chunked(*pieces: bytes) -> bytes:
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def settled(upload: Any, timeout: float = 10, offset: int | None = None) -> Any:
    """The upload once no request holds it (the server commits after the client is gone). With `offset`: once it has
    also reached that offset, for a request the client dropped without an answer, which the server (a thread of
    this process, slower on a loaded machine) may not even have claimed when this first looks."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        upload.refresh_from_db()
        if upload.busy_until is None and (offset is None or upload.offset == offset):
            return upload
        time.sleep(0.02)
    if upload.busy_until is not None:
        raise AssertionError("the upload is still claimed")
    raise AssertionError(f"the upload is at offset {upload.offset}, not {offset}")
