"""Requests through the real Gateway ASGI app as uvicorn would present them, and the deployments they reach (rows
only: the upstream is whatever URL the test gives, a scripted one on a real socket or a Triton)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from tests.support.people import Person


@dataclass
class Reply:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    messages: list[dict[str, Any]] = field(default_factory=list)

    def json(self) -> Any:
        import json

        return json.loads(self.body)

    @property
    def complete(self) -> bool:
        """The last body message said there is no more (an aborted stream never does)."""
        bodies = [m for m in self.messages if m["type"] == "http.response.body"]
        return bool(bodies) and not bodies[-1].get("more_body", False)


async def call(app: Any, method: str, path: str, *, raw_path: bytes | None = None, query: bytes = b"",
               headers: dict[str, str] | None = None, body: bytes | list[bytes] = b"", token: str | None = None,
               disconnect: str = "never") -> Reply:
    """One request through an ASGI app, as uvicorn would present it: `path` decoded, `raw_path` as sent.
    `disconnect`: "never", "after_body" (once the chunks given are read) or "after_start" (of the response)."""
    raw = raw_path if raw_path is not None else path.encode()
    decoded = unquote(raw.decode("latin-1"), encoding="latin-1") if raw_path is not None else path
    header_list = [(k.lower().encode(), v.encode("latin-1")) for k, v in (headers or {}).items()]
    if token is not None:
        header_list.append((b"authorization", b"Bearer " + token.encode()))
    chunks = body if isinstance(body, list) else [body]
    if not isinstance(body, list) and not any(k == b"content-length" for k, _ in header_list):
        header_list.append((b"content-length", b"%d" % len(body)))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": decoded, "raw_path": raw, "query_string": query, "root_path": "", "headers": header_list,
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    messages: list[dict[str, Any]] = []
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    started = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        if disconnect == "after_body":
            return {"type": "http.disconnect"}
        if disconnect == "after_start":
            await started.wait()
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)
        if message["type"] == "http.response.start":
            started.set()

    await app(scope, receive, send)
    start = next((m for m in messages if m["type"] == "http.response.start"), {"status": 0})  # 0: nothing sent
    payload = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return Reply(start["status"], {k: v for k, v in start.get("headers", [])}, payload, messages)


def run(scenario: Callable[[], Awaitable[Any]], timeout: float = 20) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout))


def make_deployment(person: Person, name: str, upstream_url: str, models: tuple[str, ...] = ("digits",)) -> Any:
    from deployments.models import Deployment, Revision

    deployment = Deployment.objects.create(team=person.team, name=name, upstream_url=upstream_url,
                                           status=Deployment.Status.READY)
    revision = Revision.objects.create(deployment=deployment, number=1,
                                       spec={"models": [{"name": m, "version": 1, "format": "onnx"} for m in models]})
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=revision, revision=revision)
    return deployment
