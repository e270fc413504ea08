"""A tiny HTTP server in a thread on 127.0.0.1 that records every request and answers from routes a test sets up,
plus a tus server with fault injection. A fake, not the portal: the CLI's failure paths (a connection dropped in
the middle of a chunk, a 500 once, a checksum mismatch) cannot be provoked on demand on the real portal; the
happy paths run against the real one in test_e2e.py."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

TOKEN = "mp_test_token"  # the token the CLI under test is given (conftest.py)


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    status: int
    body: Any = None  # a dict/list becomes JSON; bytes are sent as they are
    headers: dict[str, str] = field(default_factory=dict)


# A handler may return DROP: the server closes the connection without answering.
DROP = Reply(status=-1)

Handler = Callable[[Seen], Reply]


class FakePortal:
    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Handler] = {}
        self.requests: list[Seen] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def on(self, method: str, path: str, reply: Reply | Handler | list[Reply]) -> None:
        """Answer `method path` with a fixed reply, a handler, or a list of replies in turn (the last repeats)."""
        if isinstance(reply, Reply):
            fixed = reply
            self.routes[(method, path)] = lambda seen: fixed
        elif isinstance(reply, list):
            replies = list(reply)
            self.routes[(method, path)] = lambda seen: replies.pop(0) if len(replies) > 1 else replies[0]
        else:
            self.routes[(method, path)] = reply

    def seen(self, method: str | None = None, path: str | None = None) -> list[Seen]:
        return [r for r in self.requests if (method is None or r.method == method) and (path is None or r.path == path)]

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        portal = self

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                parts = urlsplit(self.path)
                headers = {k.lower(): v for k, v in self.headers.items()}
                route = portal.routes.get((self.command, parts.path))
                # A route may read the body itself (to drop the connection half-way); others get it whole.
                if route is not None and getattr(route, "streaming", False):
                    seen = Seen(self.command, parts.path, parse_qs(parts.query), headers, b"")
                    with portal.lock:
                        portal.requests.append(seen)
                    reply = route(seen, self.rfile)  # type: ignore[call-arg]
                else:
                    length = int(headers.get("content-length") or 0)
                    body = self.rfile.read(length) if length else b""
                    seen = Seen(self.command, parts.path, parse_qs(parts.query), headers, body)
                    with portal.lock:
                        portal.requests.append(seen)
                    not_found = {"error": {"code": "not_found", "message": "Not found.", "fields": {}}}
                    reply = route(seen) if route else Reply(404, not_found)
                if reply is DROP:
                    self.close_connection = True
                    return
                payload = reply.body if isinstance(reply.body, bytes) else (
                    b"" if reply.body is None else json.dumps(reply.body).encode())
                self.send_response(reply.status)
                if payload and not isinstance(reply.body, bytes):
                    self.send_header("Content-Type", "application/json")
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_POST = do_PATCH = do_DELETE = do_HEAD = do_PUT = _handle

        return RequestHandler

    def __enter__(self) -> FakePortal:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeTus:
    """The tus 1.0 endpoints of the portal on a FakePortal. `faults` are used up one per PATCH:
    "drop" (keeps the first half of the chunk, then closes the connection without an answer, as a server that
    crashed mid-request), "500", "409" (answered without writing), "460" (pretends the checksum did not match)."""

    def __init__(self, portal: FakePortal, faults: Iterator[str] | list[str] | None = None) -> None:
        self.portal = portal
        self.faults = list(faults or [])
        self.uploads: dict[str, dict[str, Any]] = {}
        portal.on("POST", "/api/v1/uploads/", self.create)

    def create(self, seen: Seen) -> Reply:
        upload_id = str(uuid.uuid4())
        self.uploads[upload_id] = {"length": int(seen.headers["upload-length"]), "data": bytearray(),
                                   "metadata": seen.headers.get("upload-metadata", "")}
        path = f"/api/v1/uploads/{upload_id}"
        self.portal.on("HEAD", path, lambda s: self.head(upload_id))
        patch = lambda s, stream: self.patch(upload_id, s, stream)  # noqa: E731
        patch.streaming = True  # type: ignore[attr-defined]
        self.portal.on("PATCH", path, patch)
        return Reply(201, headers={"Location": self.portal.url + path, "Upload-Offset": "0"})

    def head(self, upload_id: str) -> Reply:
        upload = self.uploads.get(upload_id)
        if upload is None:
            return Reply(404)
        return Reply(200, headers={"Upload-Offset": str(len(upload["data"])), "Upload-Length": str(upload["length"]),
                                   "Cache-Control": "no-store"})

    def patch(self, upload_id: str, seen: Seen, stream: Any) -> Reply:
        upload = self.uploads[upload_id]
        length = int(seen.headers["content-length"])
        fault = self.faults.pop(0) if self.faults else ""
        if fault == "drop":
            half = stream.read(length // 2)
            seen.body = half
            if int(seen.headers["upload-offset"]) == len(upload["data"]):
                upload["data"] += half
            return DROP
        seen.body = stream.read(length)
        if fault == "500":
            return Reply(500, {"error": {"code": "error", "message": "Internal server error.", "fields": {}}})
        offset = int(seen.headers["upload-offset"])
        if fault == "409" or offset != len(upload["data"]):
            return Reply(409, {"error": {"code": "conflict", "message": f"Upload-Offset is {offset} but the server has "
                                         f"{len(upload['data'])} bytes", "fields": {}}})
        algorithm, _, digest = seen.headers["upload-checksum"].partition(" ")
        if fault == "460" or algorithm != "sha256" or base64.b64decode(digest) != hashlib.sha256(seen.body).digest():
            return Reply(460, {"error": {"code": "checksum_mismatch", "message": "Checksum mismatch.", "fields": {}}})
        upload["data"] += seen.body
        return Reply(204, headers={"Upload-Offset": str(len(upload["data"]))})


# --- What the CLI's tests ask of its answers -----------------------------------------------------------------


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err
    return lines[0]


def api_error(status: int, message: str, code: str = "error", fields: dict[str, list[str]] | None = None) -> Reply:
    return Reply(status, {"error": {"code": code, "message": message, "fields": fields or {}}})


def deployment(**fields: Any) -> dict[str, Any]:
    return {"name": "digits-prod", "runtime": "local", "desired_state": "running", "status": "pending",
            "status_message": "", "revision": 1, "serving_revision": None, "endpoint": "/serve/digits-prod",
            "models": [], **fields}


# A served model as the API's output has it, with settings someone tuned.
TUNED = {"model": "digits", "version": 1, "format": "onnx", "max_batch_size": 32,
         "dynamic_batching": {"max_queue_delay_microseconds": 1000, "preferred_batch_size": [4, 8],
                              "preserve_ordering": False},
         "instance_group": {"count": 2, "kind": "cpu", "gpus": []}, "response_cache": True, "warmup": None}


def existing(portal: FakePortal, *models: dict[str, Any], **fields: Any) -> None:
    """digits-prod exists, serving `models`: GET finds it, PATCH makes revision 2 (a POST is not routed: 404)."""
    portal.on("GET", "/api/v1/deployments/digits-prod/", Reply(200, deployment(models=list(models), **fields)))
    portal.on("PATCH", "/api/v1/deployments/digits-prod/", Reply(200, deployment(revision=2, serving_revision=1)))


NO_DEPLOYMENT = api_error(404, "There is no deployment named 'digits-prod' in team 'acme', the team this request "
                               "acts for.", "not_found")


def new(portal: FakePortal, *polls: Reply) -> None:
    """digits-prod does not exist until POSTed (201); then GET answers `polls` in turn (the last repeats)."""
    portal.on("POST", "/api/v1/deployments/", Reply(201, deployment()))
    later = list(polls) or [Reply(200, deployment())]

    def get(seen: Seen) -> Reply:
        if not portal.seen("POST", "/api/v1/deployments/"):
            return NO_DEPLOYMENT
        return later.pop(0) if len(later) > 1 else later[0]

    portal.on("GET", "/api/v1/deployments/digits-prod/", get)
