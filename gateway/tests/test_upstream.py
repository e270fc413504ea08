"""The gateway's HTTP client against a scripted server on a real socket (gateway/tests/fake_upstream.py): it
reads each response to its exact end, refuses framing it cannot be sure of, and pools only connections whose
exchange ended cleanly."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.tests.fake_upstream import FakeUpstream, Request, chunked, echo, json_response, response
from gateway.upstream import Pool, ResponseTooLarge, UpstreamError

LIMIT = 1024 * 1024


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), 10))


async def get(pool: Pool, upstream: FakeUpstream, target: bytes = b"/v2", method: str = "GET") -> tuple[int, bytes]:
    answer = await pool.request(method, upstream.url, target, [], None, None)
    try:
        return answer.status, await answer.read(LIMIT)
    finally:
        answer.close()


def test_a_clean_exchange_leaves_the_connection_in_the_pool_for_the_next_request() -> None:
    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            pool = Pool()
            for n in range(3):
                status, body = await get(pool, upstream, b"/v2/models/m%d" % n)
                assert status == 200 and b'"/v2/models/m%d"' % n in body
            assert upstream.connections == 1 and pool.idle_count() == 1
            pool.close()

    run(scenario)


def test_it_decodes_a_chunked_body_with_extensions_and_trailers_and_then_reuses_the_connection() -> None:
    def answer(request: Request) -> bytes:
        if request.target == b"/chunked":
            return chunked(200, [b"hello ", b"world"], trailer=b"X-Checksum: 1\r\n").replace(b"6\r\n", b"6;ext=1\r\n")
        return echo(request)

    async def scenario() -> None:
        async with FakeUpstream(answer) as upstream:
            pool = Pool()
            assert await get(pool, upstream, b"/chunked") == (200, b"hello world")
            status, body = await get(pool, upstream, b"/after")
            assert status == 200 and b'"/after"' in body
            assert upstream.connections == 1

    run(scenario)


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nContent-Length: 0x5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n Folded: header\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nBad Header: x\r\n\r\n",
    b"HTTP/2 200 OK\r\n\r\n",
    b"garbage\r\n\r\n",
])
def test_it_refuses_responses_whose_framing_is_ambiguous(raw: bytes) -> None:
    async def scenario() -> None:
        async with FakeUpstream(lambda request: raw) as upstream:
            pool = Pool()
            with pytest.raises(UpstreamError):
                await get(pool, upstream)
            assert pool.idle_count() == 0

    run(scenario)


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",  # bad size
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n",  # chunk longer than its size
])
def test_it_refuses_a_broken_chunked_body(raw: bytes) -> None:
    async def scenario() -> None:
        async with FakeUpstream(lambda request: raw) as upstream:
            pool = Pool()
            with pytest.raises(UpstreamError):
                await get(pool, upstream)
            assert pool.idle_count() == 0

    run(scenario)


def test_a_body_shorter_than_its_content_length_times_out_and_the_connection_is_dropped() -> None:
    async def scenario() -> None:
        async with FakeUpstream(lambda request: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this") as upstream:
            pool = Pool()
            answer = await pool.request("GET", upstream.url, b"/v2", [], None, None)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await answer.read(LIMIT)
            assert answer._conn is None and pool.idle_count() == 0

    run(scenario)


def test_a_body_cut_by_the_server_closing_is_an_error_and_the_connection_is_not_pooled() -> None:
    async def scenario() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pool = Pool()
        answer = await pool.request("GET", url, b"/v2", [], None, None)
        with pytest.raises(UpstreamError, match="mid-response"):
            await answer.read(LIMIT)
        assert pool.idle_count() == 0
        server.close()

    run(scenario)


def test_a_response_without_length_is_read_to_the_end_of_the_connection_and_never_pooled() -> None:
    async def scenario() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pool = Pool()
        answer = await pool.request("GET", url, b"/v2", [], None, None)
        assert answer.content_length is None and not answer.chunked
        assert await answer.read(LIMIT) == b"until the end"
        assert pool.idle_count() == 0
        server.close()

    run(scenario)


def test_bytes_after_the_response_mean_the_connection_is_closed_not_reused() -> None:
    """What a smuggled request leaves behind: a second answer nobody asked for. Reusing the connection would
    hand it to the next caller as theirs."""
    def answer(request: Request) -> bytes:
        if request.target == b"/smuggled":
            return json_response({"for": "smuggled"}) + json_response({"for": "someone else"})
        return echo(request)

    async def scenario() -> None:
        async with FakeUpstream(answer) as upstream:
            pool = Pool()
            assert (await get(pool, upstream, b"/smuggled"))[1] == b'{"for": "smuggled"}'
            await asyncio.sleep(0.05)
            for n in range(30):
                status, body = await get(pool, upstream, b"/v2/models/m%d" % n)
                assert b'"/v2/models/m%d"' % n in body, (n, body)
            assert upstream.connections == 2

    run(scenario)


def test_bytes_that_arrive_while_a_connection_is_idle_make_it_unusable() -> None:
    async def scenario() -> None:
        writers: list[asyncio.StreamWriter] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                target = head.split(b" ")[1]
                writer.write(json_response({"target": target.decode()}))
                await writer.drain()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pool = Pool()
        first = await pool.request("GET", url, b"/first", [], None, None)
        assert await first.read(LIMIT) == b'{"target": "/first"}'
        assert pool.idle_count() == 1
        writers[0].write(json_response({"target": "/unasked"}))  # a late, unrequested answer
        await writers[0].drain()
        await asyncio.sleep(0.05)
        second = await pool.request("GET", url, b"/second", [], None, None)
        assert await second.read(LIMIT) == b'{"target": "/second"}'
        assert len(writers) == 2
        server.close()

    run(scenario)


def test_a_head_response_has_no_body_whatever_its_content_length_and_the_connection_is_not_reused() -> None:
    """Triton answers HEAD with 405, a Content-Length and a body: nothing of it may reach the next request."""
    def answer(request: Request) -> bytes:
        if request.method == "HEAD":
            return response(405, b'{"error":"Method Not Allowed"}')
        return echo(request)

    async def scenario() -> None:
        async with FakeUpstream(answer) as upstream:
            pool = Pool()
            head = await pool.request("HEAD", upstream.url, b"/v2/health/ready", [], None, None)
            assert head.status == 405 and head.content_length == 0
            assert await head.read(LIMIT) == b""
            status, body = await get(pool, upstream, b"/next")
            assert status == 200 and b'"/next"' in body
            assert upstream.connections == 2

    run(scenario)


def test_interim_100_continue_answers_are_skipped() -> None:
    async def scenario() -> None:
        async with FakeUpstream(lambda request: b"HTTP/1.1 100 Continue\r\n\r\n"
                                + json_response({"ok": 1})) as upstream:
            assert await get(Pool(), upstream) == (200, b'{"ok": 1}')

    run(scenario)


def test_connection_close_from_upstream_is_honoured() -> None:
    async def scenario() -> None:
        async with FakeUpstream(lambda request: response(200, b"bye", {"Connection": "close"})) as upstream:
            pool = Pool()
            assert await get(pool, upstream) == (200, b"bye")
            assert pool.idle_count() == 0

    run(scenario)


def test_a_response_over_the_limit_is_refused_and_its_connection_dropped() -> None:
    def answer(request: Request) -> bytes:
        if request.target == b"/big":
            return response(200, b"x" * 5000)
        return chunked(200, [b"y" * 3000, b"y" * 3000])

    async def scenario() -> None:
        async with FakeUpstream(answer) as upstream:
            pool = Pool()
            for target in (b"/big", b"/chunked"):
                answer_ = await pool.request("GET", upstream.url, target, [], None, None)
                with pytest.raises(ResponseTooLarge):
                    await answer_.read(4096)
                answer_.close()
            assert pool.idle_count() == 0

    run(scenario)


def test_a_timed_out_read_closes_the_connection_instead_of_pooling_it() -> None:
    async def slow(request: Request) -> bytes:
        if request.target == b"/slow":
            await asyncio.sleep(0.15)
        return echo(request)

    async def scenario() -> None:
        async with FakeUpstream(slow) as upstream:
            pool = Pool()
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await get(pool, upstream, b"/slow")
            assert pool.idle_count() == 0
            await asyncio.sleep(0.2)  # the slow answer arrives on the closed connection, read by no one
            status, body = await get(pool, upstream, b"/next")
            assert b'"/next"' in body and upstream.connections == 2

    run(scenario)


def test_a_body_read_cancelled_half_way_closes_the_connection() -> None:
    async def scenario() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n" + b"x" * 70000)
            await writer.drain()
            await asyncio.sleep(5)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pool = Pool()
        answer = await pool.request("GET", url, b"/v2", [], None, None)
        pieces = answer.iter_body(LIMIT, idle_timeout=0.1)
        assert len(await pieces.__anext__()) > 0
        reading = asyncio.create_task(pieces.__anext__())
        await asyncio.sleep(0)
        reading.cancel()
        with pytest.raises((asyncio.CancelledError, StopAsyncIteration, TimeoutError)):
            while True:
                await reading
                reading = asyncio.create_task(pieces.__anext__())
        await pieces.aclose()
        assert pool.idle_count() == 0 and answer._conn is None
        server.close()

    run(scenario)


def test_a_consumer_that_stops_reading_early_drops_the_connection() -> None:
    async def scenario() -> None:
        async with FakeUpstream(lambda request: response(200, b"x" * 300_000)) as upstream:
            pool = Pool()
            answer = await pool.request("GET", upstream.url, b"/v2", [], None, None)
            pieces = answer.iter_body(LIMIT)
            async for _ in pieces:
                break
            await pieces.aclose()
            answer.close()
            assert pool.idle_count() == 0

    run(scenario)


def test_a_streamed_request_body_is_sent_chunked_or_with_its_length_and_must_match_it() -> None:
    async def body(parts: list[bytes]) -> Any:
        for part in parts:
            yield part

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            pool = Pool()
            for length in (None, 10):
                answer = await pool.request("POST", upstream.url, b"/infer", [], body([b"hello", b"world"]), length)
                assert b'"body": "helloworld"' in await answer.read(LIMIT)
            assert upstream.requests[0].headers[b"transfer-encoding"] == b"chunked"
            assert upstream.requests[1].headers[b"content-length"] == b"10"
            with pytest.raises(UpstreamError, match="ended after 5 of 10"):
                await pool.request("POST", upstream.url, b"/infer", [], body([b"hello"]), 10)
            assert pool.idle_count() <= 1

    run(scenario)


def test_a_stale_pooled_connection_is_retried_once_on_a_fresh_one() -> None:
    async def scenario() -> None:
        served = 0

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal served
            await reader.readuntil(b"\r\n\r\n")
            served += 1
            writer.write(json_response({"n": served}))
            await writer.drain()
            if served == 1:
                # Keep-alive announced, then the server closes the idle connection (as a restarted Triton does).
                await asyncio.sleep(0.05)
                writer.close()
                return
            await asyncio.sleep(1)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pool = Pool()
        first = await pool.request("GET", url, b"/v2", [], None, None)
        assert await first.read(LIMIT) == b'{"n": 1}'
        await asyncio.sleep(0.2)
        second = await pool.request("POST", url, b"/v2", [], b"{}", None)
        assert await second.read(LIMIT) == b'{"n": 2}'
        server.close()

    run(scenario)


def test_it_never_writes_a_target_with_spaces_or_control_characters() -> None:
    async def scenario() -> None:
        pool = Pool()
        for target in (b"/v2/models/m HTTP/1.1\r\nHost: x", b"/v2\x00", b"v2", b"/v2/\xff"):
            with pytest.raises(ValueError, match="unsafe request target"):
                await pool.request("GET", "http://127.0.0.1:9", target, [], None, None)

    run(scenario)


def test_small_and_large_chunks_read_back_as_sent_and_the_connection_is_kept() -> None:
    # A small chunk is read in one piece with its CRLF; one over READ_SIZE in reads of it: both must give the bytes.
    large = bytes(range(256)) * 400  # 102,400 bytes: over READ_SIZE
    raw = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n"
           + b"%x\r\n" % len(large) + large + b"\r\n3;ext=1\r\nend\r\n0\r\n\r\n")

    async def scenario() -> None:
        async with FakeUpstream(lambda request: raw) as upstream:
            pool = Pool()
            answer = await pool.request("GET", upstream.url, b"/v2", [], None, None)
            body = b"".join([piece async for piece in answer.iter_body(LIMIT, idle_timeout=5)])
            assert body == b"first" + large + b"end"
            assert pool.idle_count() == 1

    run(scenario)


def test_a_small_chunk_over_the_limit_is_refused_before_it_is_read() -> None:
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + b"x" * 1024 + b"\r\n0\r\n\r\n"

    async def scenario() -> None:
        async with FakeUpstream(lambda request: raw) as upstream:
            pool = Pool()
            answer = await pool.request("GET", upstream.url, b"/v2", [], None, None)
            with pytest.raises(ResponseTooLarge):
                async for _ in answer.iter_body(1000, idle_timeout=5):
                    pass
            assert pool.idle_count() == 0 and answer._conn is None

    run(scenario)


def test_a_small_chunk_trickled_for_longer_than_the_idle_timeout_times_out_and_drops_the_connection() -> None:
    # A byte every 50 ms never leaves a 0.3 s gap, but a piece of 40 bytes taking 2 s is an upstream holding the
    # stream open for nothing: the idle timeout covers a small chunk whole.
    async def scenario() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n28\r\n")
            for _ in range(40):
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(0.05)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pool = Pool()
        answer = await pool.request("GET", url, b"/v2", [], None, None)
        with pytest.raises(TimeoutError):
            async for _ in answer.iter_body(LIMIT, idle_timeout=0.3):
                pass
        assert pool.idle_count() == 0 and answer._conn is None
        server.close()

    run(scenario)
