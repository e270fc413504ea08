"""Pool deployments on a real Triton: the people, the deploy and settle steps and an in-process gateway, shared by the
pool end-to-end tests (a fixture module: nothing here is collected)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from deployments import reconcile
from deployments.models import Deployment, PoolServer
from deployments.runtimes.local import triton as local_triton
from tests.support.people import Person, make_person


@pytest.fixture
def people(transactional_db: Any) -> dict[str, Person]:
    return {"alice": make_person("alice", "acme", role="admin"), "charlie": make_person("charlie", "globex")}


@pytest.fixture(autouse=True)
def _stop_pool_servers() -> Iterator[None]:
    yield
    for server in PoolServer.objects.filter(state=PoolServer.State.RUNNING):
        local_triton.stop_server(server.pid, grace_seconds=5)


def settle(name: str, status: str = "ready", seconds: float = 90) -> Deployment:
    deployment = Deployment.objects.get(name=name)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reconcile.reconcile(deployment.pk)
        deployment.refresh_from_db()
        if deployment.status == status:
            return deployment
        assert deployment.status != "failed", deployment.status_message
        time.sleep(0.2)
    raise AssertionError(f"{name} is {deployment.status}: {deployment.status_message}")


def tick_until(deployment: Deployment, done: Callable[[], bool], what: str, seconds: float = 60) -> None:
    """Tick the deployment as a worker would until `done`, within a deadline rather than a number of ticks: on a
    loaded machine Triton takes longer, and a drain ends at its time whatever the ticks."""
    deadline = time.monotonic() + seconds
    while True:
        reconcile.reconcile(deployment.pk)
        if done():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {seconds:g} s")
        time.sleep(0.2)


def deploy(person: Person, name: str, **placement: Any) -> dict[str, Any]:
    body = {"name": name, "models": [{"model": "digits"}], "placement": {"mode": "shared", **placement}}
    response = person.client().post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 201, response.json()
    return dict(response.json())


class Asgi:
    """The gateway called as an ASGI app, in this process."""

    def __init__(self) -> None:
        from gateway.app import Gateway

        self.gateway = Gateway(django_app=None)  # type: ignore[arg-type]
        self.loop = asyncio.new_event_loop()

    def close(self) -> None:
        self.loop.run_until_complete(self.gateway.close())
        # Its lookup threads end here, not some time after the test (their database connections are then closed).
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()

    def call(self, person: Person, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], Any]:
        data = json.dumps(body).encode() if body is not None else b""
        headers = [(b"authorization", f"Bearer {person.token}".encode()), (b"content-length", b"%d" % len(data))]
        if body is not None:
            headers.append((b"content-type", b"application/json"))
        scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
                 "headers": headers}
        sent: list[dict[str, Any]] = []
        messages = [{"type": "http.request", "body": data, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        self.loop.run_until_complete(self.gateway(scope, receive, send))
        start = sent[0]
        payload = b"".join(m.get("body", b"") for m in sent[1:])
        out_headers = {k.decode(): v.decode() for k, v in start["headers"]}
        return start["status"], out_headers, json.loads(payload) if payload else None


@pytest.fixture
def gateway() -> Iterator[Asgi]:
    asgi = Asgi()
    yield asgi
    asgi.close()


def infer(gateway: Asgi, person: Person, deployment: str, rows: int = 2) -> tuple[int, Any]:
    body = {"inputs": [{"name": "x", "shape": [rows, 4], "datatype": "FP32", "data": [1.0] * (4 * rows)}]}
    status, _, answer = gateway.call(person, "POST", f"/serve/{deployment}/v2/models/digits/infer", body)
    return status, answer


class ClosedLoop:
    """A thread that calls `once` again as soon as it returned, until stopped; every outcome kept."""

    def __init__(self, once: Callable[[], Any], setup: Callable[[], Any] | None = None) -> None:
        self.once = once
        self.setup = setup
        self.outcomes: list[Any] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        context = self.setup() if self.setup is not None else None
        try:
            while not self.stopping.is_set():
                try:
                    self.outcomes.append(self.once() if context is None else self.once(context))
                except Exception as exc:  # kept, and the test fails on it
                    self.outcomes.append(f"error: {exc}")
        finally:
            if isinstance(context, Asgi):
                context.close()

    def stop(self) -> list[Any]:
        self.stopping.set()
        self.thread.join(60)
        return self.outcomes
