"""Helpers for the gateway's fast tests: the real Gateway ASGI app, the real access checks on the test database,
and a scripted upstream on a real socket (fake_upstream.py) in place of Triton.

The gateway looks callers and routes up in worker threads, which see only committed rows: these tests use
`transactional_db`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pytest

from conftest import Person, make_person


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


@pytest.fixture
def people(transactional_db: Any) -> dict[str, Person]:
    return {"alice": make_person("alice", "acme", role="admin"), "bob": make_person("bob", "acme"),
            "charlie": make_person("charlie", "globex", role="admin")}


def make_deployment(person: Person, name: str, upstream_url: str, models: tuple[str, ...] = ("digits",)) -> Any:
    from deployments.models import Deployment, Revision

    deployment = Deployment.objects.create(team=person.team, name=name, upstream_url=upstream_url,
                                           status=Deployment.Status.READY)
    revision = Revision.objects.create(deployment=deployment, number=1,
                                       spec={"models": [{"name": m, "version": 1, "format": "onnx"} for m in models]})
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=revision, revision=revision)
    return deployment


@pytest.fixture
def gateway_app(settings: Any) -> Callable[[], Any]:
    """A fresh Gateway (its caches and pool) in front of a Django stand-in that says where a request went."""
    settings.GATEWAY_CACHE_TTL_SECONDS = 0.5

    def build() -> Any:
        from gateway.app import Gateway

        async def django(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 299, "headers": []})
            await send({"type": "http.response.body", "body": b"django"})

        return Gateway(django)

    return build


def browser_cookies(person: Person) -> str:
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(person.user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}; csrftoken=abc123"
