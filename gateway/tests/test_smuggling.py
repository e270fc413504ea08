"""Issue 12's request smuggling: one request whose decoded path held `%20HTTP/1.1%0D%0A...` wrote a second request
into a pooled keep-alive connection to Triton, after which callers got each other's answers (29 of 30 wrong).

The exploit runs here through a real uvicorn (its HTTP parser decides what `path` and `raw_path` are) against a
keep-alive HTTP/1.1 server standing in for Triton that answers every request it parses, as Triton does; the same
exploit against a real Triton is in tests/test_gateway_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import uvicorn

from deployments.runtimes.local.triton import pick_free_ports
from gateway.tests.fake_upstream import FakeUpstream
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person

SMUGGLED = ("/serve/digits-prod/v2/models/digits%20HTTP/1.1%0D%0AHost:%20x%0D%0A%0D%0A"
            "GET%20/v2/logging%20HTTP/1.1%0D%0AX-Pad:%20y")


async def http(port: int, method: str, target: str, token: str) -> tuple[int, bytes]:
    """One request on its own connection: the client side is not what is under test."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {target} HTTP/1.1\r\nHost: portal\r\nAuthorization: Bearer {token}\r\n"
                 f"Connection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


async def serving(app: Any) -> tuple[uvicorn.Server, int, asyncio.Task[None]]:
    port = pick_free_ports(1)[0]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                                           http="httptools"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, port, task


def test_a_smuggled_request_is_refused_and_every_later_caller_gets_their_own_answer(
    people: dict[str, Person], gateway_app: Any
) -> None:
    alice = people["alice"]

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, alice, "digits-prod", upstream.url,
                                    tuple(f"m{n}" for n in range(30)))
            server, port, task = await serving(gateway_app())
            try:
                exploit_status, exploit_body = await http(port, "GET", SMUGGLED, alice.token)
                reached = list(upstream.requests)
                wrong = []
                for n in range(30):
                    status, body = await http(port, "GET", f"/serve/digits-prod/v2/models/m{n}", alice.token)
                    if status != 200 or json.loads(body)["target"] != f"/v2/models/m{n}":
                        wrong.append((n, status, body[:80]))
                assert wrong == [], f"{len(wrong)} of 30 answers were someone else's"
                assert exploit_status == 400, exploit_body
                assert "control character" in json.loads(exploit_body)["error"]
                assert reached == []  # nothing of it reached the upstream
                assert all(not r.target.startswith(b"/v2/logging") for r in upstream.requests)
            finally:
                server.should_exit = True
                await task

    run(scenario)


UNSAFE_PATHS = [
    b"/serve/digits-prod/v2/models/digits%0D%0A/ready",
    b"/serve/digits-prod/v2/models/digits%20x/ready",
    b"/serve/digits-prod/v2/models/dig%00its",
    b"/serve/digits-prod/v2/models/digits\r\nX: y",
    b"/serve/digits-prod/v2/models/digits HTTP/1.1",
    b"/serve/digits-prod/v2/models/d\xc3\xa9",
]


def test_spaces_and_control_characters_in_the_path_or_query_are_refused_raw_or_percent_encoded(
    people: dict[str, Person], gateway_app: Any
) -> None:
    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            for raw_path in UNSAFE_PATHS:
                reply = await call(app, "GET", "", raw_path=raw_path, token=people["alice"].token)
                assert reply.status == 400, raw_path
                assert "percent-encode" in reply.json()["error"]
            reply = await call(app, "GET", "/serve/digits-prod/v2", query=b"a=1 HTTP/1.1\r\nX: y",
                               token=people["alice"].token)
            assert reply.status == 400
            assert upstream.requests == []

    run(scenario)


def test_the_upstream_target_is_the_raw_path_not_the_decoded_one(people: dict[str, Person], gateway_app: Any) -> None:
    """Triton does not percent-decode model names either: what the client encoded stays encoded (a model of that
    name, which no real one is: names are DNS labels, and any other is the gateway's 404)."""
    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url, ("dig%2Fits",))
            reply = await call(gateway_app(), "GET", "", raw_path=b"/serve/digits-prod/v2/models/dig%2Fits/config",
                               query=b"x=%41", token=people["alice"].token)
            assert reply.status == 200
            assert reply.json()["target"] == "/v2/models/dig%2Fits/config?x=%41"

    run(scenario)


def test_a_target_longer_than_triton_takes_is_414_not_a_dropped_connection(
    people: dict[str, Person], gateway_app: Any
) -> None:
    """Found by tests/test_nasty_inputs.py: Triton drops the connection on a request target of 8,190 bytes, which
    the gateway answered 502 ("Triton is unreachable"). It is the client's request that is too long."""
    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            long_name = b"/serve/digits-prod/v2/models/" + b"m" * 10_000
            reply = await call(app, "GET", "", raw_path=long_name, token=people["alice"].token)
            assert reply.status == 414
            assert "at most 8000" in reply.json()["error"]
            reply = await call(app, "GET", "/serve/digits-prod/v2/models/digits", query=b"x=" + b"a" * 9000,
                               token=people["alice"].token)
            assert reply.status == 414
            assert upstream.requests == []
            # A long target that fits (a query: a model name that long is no model of the deployment, a 404).
            fits = await call(app, "GET", "/serve/digits-prod/v2/models/digits", query=b"x=" + b"a" * 7000,
                              token=people["alice"].token)
            assert fits.status == 200 and len(upstream.requests) == 1

    run(scenario)
