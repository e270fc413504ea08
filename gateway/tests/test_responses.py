"""Triton's answers on their way back: small ones in one message, large or chunked ones streamed within
GATEWAY_MAX_RESPONSE_BYTES (502 past it), HEAD without a body, and a client or an upstream that goes away in the
middle: the upstream connection is then closed, never pooled."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.tests.fake_upstream import FakeUpstream, Request, chunked, echo, response
from tests.processes import until
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person

MIB = 1024 * 1024


def test_responses_small_large_chunked_and_over_the_limit(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    settings.GATEWAY_MAX_RESPONSE_BYTES = 4 * MIB
    answers = {
        "small": response(200, b"s" * 1000, {"Content-Type": "application/json"}),
        "large": response(200, b"L" * (3 * MIB)),
        "too-large": response(200, b"T" * (5 * MIB)),
        "chunked-small": chunked(200, [b"a" * 1000, b"b" * 1000]),
        "chunked-large": chunked(200, [b"c" * (MIB // 2)] * 6),
        "chunked-too-large": chunked(200, [b"d" * MIB] * 6),
        "chunked-too-large-early": chunked(200, [b"e" * 5 * MIB]),  # its first chunk says so
    }

    def answer(request: Request) -> bytes:
        return answers[request.target.decode().split("/")[3]]

    async def scenario() -> None:
        async with FakeUpstream(answer) as upstream:
            # A model per kind of answer: the gateway refuses a model its deployment does not serve.
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url, tuple(answers))
            app = gateway_app()
            token = people["alice"].token

            async def get(model: str) -> Any:
                return await call(app, "GET", f"/serve/digits-prod/v2/models/{model}", token=token)

            small = await get("small")
            assert (small.status, small.body, small.headers[b"content-length"]) == (200, b"s" * 1000, b"1000")
            assert len(small.messages) == 2  # start and the whole body at once
            assert small.headers[b"content-type"] == b"application/json"

            large = await get("large")
            assert large.status == 200 and large.body == b"L" * (3 * MIB) and large.complete
            assert large.headers[b"content-length"] == str(3 * MIB).encode()
            assert len(large.messages) > 10  # streamed in pieces, never held whole

            too_large = await get("too-large")
            assert too_large.status == 502 and "GATEWAY_MAX_RESPONSE_BYTES" in too_large.json()["error"]

            small_chunked = await get("chunked-small")
            assert small_chunked.body == b"a" * 1000 + b"b" * 1000
            assert small_chunked.headers[b"content-length"] == b"2000"

            large_chunked = await get("chunked-large")
            assert large_chunked.body == b"c" * (3 * MIB) and large_chunked.complete
            assert b"content-length" not in large_chunked.headers  # the server sends it chunked in turn

            early = await get("chunked-too-large-early")  # over the limit before a byte went out: a 502
            assert early.status == 502

            late = await get("chunked-too-large")  # over the limit after the start: the answer is cut off
            assert late.status == 200 and not late.complete and len(late.body) <= 4 * MIB
            # Only connections whose exchange ended cleanly are kept: the cut one is closed.
            await until(lambda: app.pool.idle_count() <= 1, 10, what="the cut connection to leave the pool")

    run(scenario)


def test_head_is_answered_with_the_get_headers_and_no_body(people: dict[str, Person], gateway_app: Any) -> None:
    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            head = await call(app, "HEAD", "/serve/digits-prod/v2/models/digits", token=people["alice"].token)
            get = await call(app, "GET", "/serve/digits-prod/v2/models/digits", token=people["alice"].token)
            assert head.status == 200 and head.body == b""
            assert head.headers[b"content-length"] == get.headers[b"content-length"] != b"0"
            assert [r.method for r in upstream.requests] == ["GET", "GET"]

    run(scenario)


def test_bad_framing_from_upstream_is_a_502_and_a_missing_length_is_read_to_the_end(
    people: dict[str, Person], gateway_app: Any
) -> None:
    def answer(request: Request) -> bytes | None:
        model = request.target.decode().split("/")[3]
        if model == "two-lengths":
            return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc"
        if model == "bad-length":
            return b"HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\nabc"
        return echo(request)

    async def scenario() -> None:
        async with FakeUpstream(answer) as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url,
                                    ("two-lengths", "bad-length", "fine"))
            app = gateway_app()
            for model in ("two-lengths", "bad-length"):
                reply = await call(app, "GET", f"/serve/digits-prod/v2/models/{model}", token=people["alice"].token)
                assert reply.status == 502 and "Retry shortly" in reply.json()["error"]
            ok = await call(app, "GET", "/serve/digits-prod/v2/models/fine", token=people["alice"].token)
            assert ok.status == 200 and ok.json()["target"] == "/v2/models/fine"

        async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nno length, " + b"x" * 2 * MIB)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(until_close, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        await asyncio.to_thread(make_deployment, people["alice"], "no-length", f"http://127.0.0.1:{port}")
        reply = await call(app, "GET", "/serve/no-length/v2", token=people["alice"].token)
        assert reply.status == 200 and reply.body == b"no length, " + b"x" * 2 * MIB and reply.complete
        assert app.pool.idle_count() == 1  # the earlier, clean one only
        server.close()

    run(scenario)


def test_a_client_that_disconnects_mid_response_stops_the_relay_and_the_connection_is_closed(
    people: dict[str, Person], gateway_app: Any
) -> None:
    async def slow_stream(request: Request) -> bytes:
        return response(200, b"z" * (8 * MIB))

    async def scenario() -> None:
        async with FakeUpstream(slow_stream) as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            reply = await call(app, "GET", "/serve/digits-prod/v2/models/digits", token=people["alice"].token,
                               disconnect="after_start")
            assert reply.status == 200 and not reply.complete
            assert len(reply.body) < 8 * MIB  # it stopped relaying
            await until(lambda: app.pool.idle_count() == 0 and upstream.open_connections == 0, 10,
                        what="the relayed connection to close")
            collected = app.collector.take()
            assert [b.requests for b in collected.values()] == [1]

    run(scenario)


def test_a_slow_upstream_is_a_504_and_its_connection_is_not_reused(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    settings.GATEWAY_UPSTREAM_TIMEOUT_SECONDS = 0.1

    async def answer(request: Request) -> bytes:
        if b"slow" in request.target:
            await asyncio.sleep(0.2)
        return echo(request)

    async def scenario() -> None:
        async with FakeUpstream(answer) as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url, ("slow", "fast"))
            app = gateway_app()
            slow = await call(app, "GET", "/serve/digits-prod/v2/models/slow", token=people["alice"].token)
            assert slow.status == 504 and "did not answer within 0.1 s" in slow.json()["error"]
            assert app.pool.idle_count() == 0
            await asyncio.sleep(0.15)  # the late answer lands on a closed connection
            fast = await call(app, "GET", "/serve/digits-prod/v2/models/fast", token=people["alice"].token)
            assert fast.json()["target"] == "/v2/models/fast" and upstream.connections == 2

    run(scenario)


def test_an_upstream_that_stalls_mid_stream_is_cut_off_after_the_timeout(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    settings.GATEWAY_UPSTREAM_TIMEOUT_SECONDS = 0.2

    async def scenario() -> None:
        async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (4 * MIB) + b"y" * (2 * MIB))
            await writer.drain()
            await asyncio.sleep(2)
            writer.close()

        server = await asyncio.start_server(stall, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        await asyncio.to_thread(make_deployment, people["alice"], "stalls", f"http://127.0.0.1:{port}")
        app = gateway_app()
        reply = await call(app, "GET", "/serve/stalls/v2", token=people["alice"].token)
        assert reply.status == 200 and not reply.complete and len(reply.body) < 4 * MIB
        assert app.pool.idle_count() == 0
        server.close()

    run(scenario, timeout=5)
