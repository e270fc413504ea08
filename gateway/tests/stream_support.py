"""What the stream tests share (gateway/tests/test_streams.py, test_openai_api.py, tests/test_stream_slow_reader.py):
Triton's SSE head, an event as it writes one, a deployment of a streaming model, a model that never stops, a caller
that stops reading, and how the counted streams ended."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from deployments.models import Deployment, Revision
from gateway.tests.fake_upstream import Request
from tests.support.people import Person

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"


def event(text: str) -> bytes:
    return b"data: " + json.dumps({"model_name": "chat", "model_version": "1", "text_output": text}).encode() + b"\n\n"


def streaming_deployment(person: Person, upstream_url: str, decoupled: bool = True) -> None:
    deployment = Deployment.objects.create(team=person.team, name="chat", upstream_url=upstream_url,
                                           status=Deployment.Status.READY)
    entry: dict[str, Any] = {"name": "chat", "version": 1, "format": "python", "decoupled": decoupled}
    revision = Revision.objects.create(deployment=deployment, number=1, spec={"models": [entry]})
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=revision, revision=revision)


def endless(request: Request, gap: float = 0.002) -> AsyncIterator[bytes]:
    """A model that never stops: the head, then an event every `gap` seconds for as long as the connection lasts."""

    async def pieces() -> AsyncIterator[bytes]:
        yield SSE_HEAD
        number = 0
        while True:
            piece = event(str(number))
            yield b"%x\r\n%s\r\n" % (len(piece), piece)
            number += 1
            await asyncio.sleep(gap)

    return pieces()


def ended(collector: Any) -> dict[str, int]:
    """How the streams counted in the collector's buckets ended, {reason: streams}."""
    ends: dict[str, int] = {}
    for bucket in collector.take().values():
        for reason, count in bucket.streams.ends.items():
            ends[reason] = ends.get(reason, 0) + count
    return ends


class Stalling:
    """The gateway behind a caller that takes `taken` body messages, then no more (a send that never returns, as
    uvicorn's does while its transport's buffer stays past the high-water mark)."""

    def __init__(self, gateway: Any, taken: int) -> None:
        self.gateway = gateway
        self.taken = taken

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        left = [self.taken]

        async def stalling(message: Any) -> None:
            if message["type"] == "http.response.body":
                if left[0] == 0:
                    await asyncio.Event().wait()
                left[0] -= 1
            await send(message)

        await self.gateway(scope, receive, stalling)


def paced(go: asyncio.Event) -> Callable[[Request], AsyncIterator[bytes]]:
    """A model that thinks until `go` is set (the test has seen the stream in flight), 50 ms more (its time to first
    piece), then sends the pieces a, b, c and d 20 ms apart and ends."""

    def answer(request: Request) -> AsyncIterator[bytes]:
        async def pieces() -> AsyncIterator[bytes]:
            yield SSE_HEAD
            await go.wait()
            await asyncio.sleep(0.05)
            for text in ("a", "b", "c", "d"):
                piece = event(text)
                yield b"%x\r\n%s\r\n" % (len(piece), piece)
                await asyncio.sleep(0.02)
            yield b"0\r\n\r\n"

        return pieces()

    return answer


async def counted_stream(app: Any, path: str, token: str, body: bytes, go: asyncio.Event) -> tuple[Any, Any]:
    """A stream to a `paced` model, seen in flight (Prometheus' gauge of acme's chat, revision 1), then out of it with
    one more TTFT counted: its reply and the collector's buckets taken."""
    from prometheus_client import REGISTRY

    from tests.processes import wait_for
    from tests.support.gateway_calls import call

    labels = {"team": "acme", "deployment": "chat", "revision": "1"}
    before = REGISTRY.get_sample_value("modelport_gateway_stream_first_piece_seconds_count", labels) or 0
    streaming = asyncio.ensure_future(call(app, "POST", path, token=token, body=body))
    await asyncio.to_thread(wait_for, lambda: REGISTRY.get_sample_value(
        "modelport_gateway_streams_in_flight", labels) == 1, 5, what="the stream to count in flight")
    go.set()
    reply = await streaming
    assert REGISTRY.get_sample_value("modelport_gateway_streams_in_flight", labels) == 0
    assert REGISTRY.get_sample_value("modelport_gateway_stream_first_piece_seconds_count", labels) == before + 1
    return reply, app.collector.take()


# The OpenAI-compatible API's model (gateway/openai/), streamed to by its chat completions.
TEXT_SIGNATURE = {"inputs": [{"name": "text_input", "datatype": "BYTES", "dims": [1]},
                             {"name": "max_tokens", "datatype": "INT32", "dims": [1]},
                             {"name": "stream", "datatype": "BOOL", "dims": [1]}],
                  "outputs": [{"name": "text_output", "datatype": "BYTES", "dims": [-1]}]}
STREAMED = json.dumps({"model": "chat", "stream": True, "messages": [{"role": "user", "content": "x"}]}).encode()


def text_deployment(person: Person, upstream_url: str, signature: dict[str, Any] = TEXT_SIGNATURE,
                    chat_template: str = "") -> None:
    deployment = Deployment.objects.create(team=person.team, name="chat", upstream_url=upstream_url,
                                           status=Deployment.Status.READY)
    entry: dict[str, Any] = {"name": "chat", "version": 1, "format": "python", "decoupled": True,
                             "signature": signature, "chat_template": chat_template}
    revision = Revision.objects.create(deployment=deployment, number=1, spec={"models": [entry]})
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=revision, revision=revision)


def chunks(reply_body: bytes) -> list[Any]:
    out = []
    for e in reply_body.split(b"\n\n"):
        if e.startswith(b"data: "):
            data = e.removeprefix(b"data: ")
            out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out
