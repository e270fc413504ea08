"""The gateway's relay of a streaming model's Server-Sent Events (gateway/events.py) against a scripted upstream, for
what a real Triton does not do on demand: a piece without end, a connection cut in the middle, a model silent while
its caller leaves; its bounds on the OpenAI-compatible API's streamed chunks too. The real Triton's streams are
tests/test_streaming_e2e.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from deployments.models import Deployment
from gateway.tests.fake_upstream import FakeUpstream, Request, chunked
from gateway.tests.stream_support import (
    SSE_HEAD,
    STREAMED,
    Stalling,
    chunks,
    counted_stream,
    ended,
    endless,
    event,
    paced,
    streaming_deployment,
    text_deployment,
)
from tests.processes import wait_for
from tests.support.gateway_calls import call, run
from tests.support.people import Person

STREAM = "/serve/chat/v2/models/chat/generate_stream"


def sse(pieces: list[bytes], end: bool = True) -> bytes:
    """Triton's answer to /generate_stream: the head, each event a chunk, the last chunk (unless `end` is false)."""
    return SSE_HEAD + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + (b"0\r\n\r\n" if end else b"")


def sse_events(body: bytes) -> list[bytes]:
    return [e for e in body.split(b"\n\n") if e]


def test_a_piece_over_the_answer_limit_ends_the_stream_with_an_error_event_and_is_never_passed_on(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    settings.GATEWAY_MAX_RESPONSE_BYTES = 64 * 1024
    huge = b"data: " + b"x" * (4 * 1024 * 1024) + b"\n\n"

    async def scenario() -> None:
        async with FakeUpstream(lambda r: sse([event("one"), huge, event("after")])) as upstream:
            await asyncio.to_thread(streaming_deployment, people["alice"], upstream.url)
            reply = await call(gateway_app(), "POST", STREAM, token=people["alice"].token, body=b'{"text_input": "a"}')
            assert reply.status == 200 and reply.complete
            first, error = sse_events(reply.body)
            assert json.loads(first.removeprefix(b"data: "))["text_output"] == "one"
            assert error.startswith(b"event: error\ndata: ")
            assert "GATEWAY_MAX_RESPONSE_BYTES" in json.loads(error.split(b"data: ", 1)[1])["error"]
            # Not a byte of the huge piece went on, and the client got no more than the limit's worth in one message.
            assert b"xxxx" not in reply.body
            assert max(len(m.get("body", b"")) for m in reply.messages) < 64 * 1024

    run(scenario)


def test_each_event_goes_on_as_it_comes_and_a_cut_stream_ends_with_an_error_event(
    people: dict[str, Person], gateway_app: Any
) -> None:
    # Head and two events, then the connection closes in the middle of the chunked body.
    cut = sse([event("a"), event("b")], end=False)

    async def scenario() -> None:
        async with FakeUpstream(lambda r: cut + b"40\r\npartial") as upstream:
            await asyncio.to_thread(streaming_deployment, people["alice"], upstream.url)
            original = upstream._serve

            async def close_after(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                task = asyncio.ensure_future(original(reader, writer))
                await asyncio.sleep(0.2)
                writer.close()
                task.cancel()

            upstream.server.close()  # type: ignore[union-attr]
            upstream.server = await asyncio.start_server(close_after, "127.0.0.1", 0)
            await asyncio.to_thread(Deployment.objects.filter(name="chat").update, upstream_url=upstream.url)
            await asyncio.sleep(0.6)  # the gateway's route cache
            reply = await call(gateway_app(), "POST", STREAM, token=people["alice"].token, body=b'{"text_input": "a"}')
            assert reply.status == 200 and reply.complete
            headers = reply.headers
            assert headers[b"cache-control"] == b"no-cache" and headers[b"x-accel-buffering"] == b"no"
            assert b"content-length" not in headers
            events = sse_events(reply.body)
            # One body message per event as Triton sent it: nothing held back to be sent with the next.
            bodies = [m["body"] for m in reply.messages if m["type"] == "http.response.body" and m["body"]]
            assert bodies[:2] == [event("a"), event("b")]
            assert events[-1].startswith(b"event: error\n") and b"broke the connection" in events[-1]

    run(scenario)


def test_a_caller_that_leaves_while_the_model_is_silent_closes_the_connection_to_triton_at_once(
    people: dict[str, Person], gateway_app: Any
) -> None:
    first = sse([event("a")], end=False)  # then nothing: the model thinks

    async def scenario() -> None:
        async with FakeUpstream(lambda r: first) as upstream:
            await asyncio.to_thread(streaming_deployment, people["alice"], upstream.url)
            reply = await call(gateway_app(), "POST", STREAM, token=people["alice"].token, body=b'{"text_input": "a"}',
                               disconnect="after_start")
            assert reply.status == 200
            # Triton cancels a request whose connection closes: the gateway's is closed, not kept for the next caller.
            await asyncio.to_thread(wait_for, lambda: upstream.open_connections == 0, 5,
                                    what="the gateway to close its upstream connection")

    run(scenario)


def test_infer_on_a_streaming_model_is_a_400_naming_the_ways_to_stream_and_never_reaches_triton(
    people: dict[str, Person], gateway_app: Any
) -> None:
    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(streaming_deployment, people["alice"], upstream.url)
            body = b'{"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}'
            reply = await call(gateway_app(), "POST", "/serve/chat/v2/models/chat/infer", token=people["alice"].token,
                               body=body)
            assert reply.status == 400
            assert reply.json()["error"] == (
                "Model 'chat' streams its answer (a decoupled model), so it has no single answer for /infer: use POST "
                ".../v2/models/chat/generate_stream (Server-Sent Events, one per piece) or gRPC's ModelStreamInfer.")
            assert upstream.requests == []

    run(scenario)


def test_a_generate_request_is_forwarded_as_json_and_refused_when_it_is_no_json_object(
    people: dict[str, Person], gateway_app: Any
) -> None:
    def answer(request: Request) -> bytes:
        assert request.headers[b"content-type"] == b"application/json"
        assert b"accept-encoding" not in request.headers  # events are read one by one: never compressed
        return chunked(200, [b'{"model_name":"chat","model_version":"1","text_output":"hi"}'])

    async def scenario() -> None:
        async with FakeUpstream(answer) as upstream:
            await asyncio.to_thread(streaming_deployment, people["alice"], upstream.url, False)
            app = gateway_app()
            path = "/serve/chat/v2/models/chat/generate"
            token = people["alice"].token
            reply = await call(app, "POST", path, token=token, body=b'{"text_input": "a"}',
                               headers={"Content-Type": "text/plain", "Accept-Encoding": "gzip"})
            assert reply.status == 200 and reply.json()["text_output"] == "hi"
            for bad in (b"[1]", b"", b"{" * 100 + b"}" * 100):
                refused = await call(app, "POST", path, token=token, body=bad)
                assert refused.status == 400, bad
            assert len(upstream.requests) == 1

    run(scenario)


def test_a_team_past_its_open_streams_gets_a_429_naming_the_limit_and_other_teams_stream_on(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    settings.GATEWAY_MAX_STREAMS_PER_TEAM = 2
    open_stream = sse([event("a")], end=False)  # a model that keeps thinking: the stream stays open

    async def scenario() -> None:
        async with FakeUpstream(lambda r: open_stream) as upstream:
            await asyncio.to_thread(streaming_deployment, people["alice"], upstream.url)
            await asyncio.to_thread(streaming_deployment, people["charlie"], upstream.url)  # globex's own "chat"
            app = gateway_app()
            body = b'{"text_input": "a"}'
            alice, charlie = people["alice"].token, people["charlie"].token
            held = [asyncio.ensure_future(call(app, "POST", STREAM, token=alice, body=body)) for _ in range(2)]
            await asyncio.to_thread(wait_for, lambda: len(upstream.requests) == 2, 5, what="two streams to open")
            refused = await call(app, "POST", STREAM, token=alice, body=body)
            assert refused.status == 429 and refused.headers[b"retry-after"] == b"1"
            assert refused.json()["error"] == (
                "Team 'acme' has 2 streams open, the most it may have (GATEWAY_MAX_STREAMS_PER_TEAM=2): close one, or "
                "retry when one ends.")
            assert len(upstream.requests) == 2  # refused before Triton
            # Another team is not touched by acme's streams.
            other = await call(app, "POST", "/serve/chat/v2/models/chat/generate_stream", token=charlie, body=body,
                               disconnect="after_start")
            assert other.status == 200
            # A stream that ends gives its slot back.
            held[0].cancel()
            await asyncio.gather(held[0], return_exceptions=True)
            again = await call(app, "POST", STREAM, token=alice, body=body, disconnect="after_start")
            assert again.status == 200
            assert app.streams.open == {people["alice"].team.pk: 1}
            held[1].cancel()
            await asyncio.gather(held[1], return_exceptions=True)
            assert app.streams.open == {}

    run(scenario)


def test_a_teams_streams_in_another_web_process_count_against_it_through_redis(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    """Two gateways stand for two web processes sharing the rate limiter's Redis (gateway/tests/test_stream_slots.py
    has the Redis details, and this one's Redis and key prefix)."""
    from gateway.tests.stream_slots_support import REDIS_URL, processes, redis_or_skip, synced

    redis_or_skip()
    settings.REDIS_URL = REDIS_URL
    settings.GATEWAY_RATE_LIMIT_PER_SECOND = 0  # the rate limiter's Redis is not this test's
    settings.GATEWAY_MAX_STREAMS_PER_TEAM = 2
    open_stream = sse([event("a")], end=False)

    async def scenario() -> None:
        async with FakeUpstream(lambda r: open_stream) as upstream, processes(2, limit=2) as slots:
            await asyncio.to_thread(streaming_deployment, people["alice"], upstream.url)
            await asyncio.to_thread(streaming_deployment, people["charlie"], upstream.url)
            first, second = gateway_app(), gateway_app()
            assert (first.streams.redis_url, first.streams.limit) == (REDIS_URL, 2)  # what the gateway builds
            first.streams, second.streams = slots  # the same, under the test's own keys
            body = b'{"text_input": "a"}'
            alice, charlie = people["alice"].token, people["charlie"].token
            held = [asyncio.ensure_future(call(first, "POST", STREAM, token=alice, body=body)) for _ in range(2)]
            await asyncio.to_thread(wait_for, lambda: len(upstream.requests) == 2, 5, what="two streams to open")
            await synced(*slots)
            refused = await call(second, "POST", STREAM, token=alice, body=body)
            assert refused.status == 429 and refused.json()["error"] == (
                "Team 'acme' has 2 streams open, the most it may have (GATEWAY_MAX_STREAMS_PER_TEAM=2): close one, or "
                "retry when one ends.")
            other = await call(second, "POST", "/serve/chat/v2/models/chat/generate_stream", token=charlie, body=body,
                               disconnect="after_start")
            assert other.status == 200
            for each in held:
                each.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            await synced(*slots)
            again = await call(second, "POST", STREAM, token=alice, body=body, disconnect="after_start")
            assert again.status == 200

    run(scenario)


def test_a_pooled_models_stream_reaches_it_by_its_pool_name_and_comes_back_with_the_callers_names(
    people: dict[str, Person], gateway_app: Any
) -> None:
    from gateway.tests.pool_support import shared_deployment

    answers: dict[str, bytes] = {}

    async def scenario() -> None:
        async with FakeUpstream(lambda r: answers["stream"]) as pool_triton:
            deployment = await asyncio.to_thread(shared_deployment, people["alice"], "mine", pool_triton.url)
            pooled = f"d{deployment.pk}-r1-digits"
            named = b'data: {"model_name":"%s","model_version":"1","text_output":"a"}\n\n' % pooled.encode()
            failed = b'data: {"error":"model %s failed"}\n\n' % pooled.encode()
            answers["stream"] = sse([named, named, failed])
            reply = await call(gateway_app(), "POST", "/serve/mine/v2/models/digits/generate_stream",
                               token=people["alice"].token, body=b'{"text_input": "a"}')
            assert reply.status == 200 and reply.complete
            assert pool_triton.requests[0].target == b"/v2/models/%s/generate_stream" % pooled.encode()
            first, second, error = sse_events(reply.body)
            assert json.loads(first.removeprefix(b"data: "))["model_name"] == "digits" and first == second
            assert error.startswith(b"event: error\n") and pooled.encode() not in reply.body

    run(scenario)


# --- The stream's bounds and figures (docs/security.md, "Stream bounds"; gateway/stream_figures.py) -------------


def error_of(body: bytes) -> str:
    last = sse_events(body)[-1]
    assert last.startswith(b"event: error\ndata: "), last
    return str(json.loads(last.split(b"data: ", 1)[1])["error"])


def openai_error_of(body: bytes) -> str:
    """The OpenAI-compatible API's error event ending a stream: OpenAI's error object (the SDK raises an APIError
    for it), no [DONE] after it."""
    last = chunks(body)[-1]
    assert last != "[DONE]" and last["error"]["type"] == "server_error", last
    return str(last["error"]["message"])


@dataclass(frozen=True)
class Way:
    """A way to ask for a stream, each under the same bounds: Triton's /generate_stream relayed, or the
    OpenAI-compatible API's chat completion chunks."""

    path: str
    body: bytes
    deploy: Callable[[Person, str], None]
    error: Callable[[bytes], str]  # the message of the error event that ends the stream


WAYS = [pytest.param(Way(STREAM, b'{"text_input": "a"}', streaming_deployment, error_of), id="generate_stream"),
        pytest.param(Way("/serve/chat/v1/chat/completions", STREAMED, text_deployment, openai_error_of),
                     id="v1_chat_completions")]


@pytest.mark.parametrize("way", WAYS)
def test_a_stream_open_past_its_length_in_seconds_is_ended_with_an_error_event_and_triton_cancels(
    people: dict[str, Person], gateway_app: Any, settings: Any, way: Way
) -> None:
    settings.GATEWAY_MAX_STREAM_SECONDS = 0.5

    async def scenario() -> None:
        async with FakeUpstream(endless) as upstream:
            await asyncio.to_thread(way.deploy, people["alice"], upstream.url)
            app = gateway_app()
            started = asyncio.get_running_loop().time()
            reply = await call(app, "POST", way.path, token=people["alice"].token, body=way.body)
            assert 0.5 <= asyncio.get_running_loop().time() - started < 5
            assert reply.status == 200 and reply.complete
            assert len(sse_events(reply.body)) > 10  # it streamed until then
            assert "GATEWAY_MAX_STREAM_SECONDS" in way.error(reply.body)
            await asyncio.to_thread(wait_for, lambda: upstream.open_connections == 0, 5,
                                    what="the gateway to close its upstream connection")
            assert app.streams.open == {}
            assert ended(app.collector) == {"length_seconds": 1}

    run(scenario)


@pytest.mark.parametrize("way", WAYS)
def test_a_stream_past_its_length_in_bytes_is_ended_with_an_error_event_and_sends_no_more_than_the_bound(
    people: dict[str, Person], gateway_app: Any, settings: Any, way: Way
) -> None:
    settings.GATEWAY_MAX_STREAM_BYTES = 4096

    async def scenario() -> None:
        async with FakeUpstream(lambda r: endless(r, 0)) as upstream:
            await asyncio.to_thread(way.deploy, people["alice"], upstream.url)
            app = gateway_app()
            reply = await call(app, "POST", way.path, token=people["alice"].token, body=way.body)
            assert reply.status == 200 and reply.complete
            message = way.error(reply.body)
            assert "GATEWAY_MAX_STREAM_BYTES" in message and "4096 bytes" in message
            sent = [e + b"\n\n" for e in sse_events(reply.body)[:-1]]
            assert 4096 - max(map(len, sent)) < sum(map(len, sent)) <= 4096
            await asyncio.to_thread(wait_for, lambda: upstream.open_connections == 0, 5,
                                    what="the gateway to close its upstream connection")
            assert ended(app.collector) == {"length_bytes": 1}

    run(scenario)


@pytest.mark.parametrize("way", WAYS)
def test_a_caller_that_stops_taking_pieces_has_its_stream_ended_counted_and_its_slot_freed(
    people: dict[str, Person], gateway_app: Any, settings: Any, way: Way
) -> None:
    settings.GATEWAY_STREAM_SEND_SECONDS = 0.3
    settings.GATEWAY_MAX_STREAMS_PER_TEAM = 1

    async def scenario() -> None:
        async with FakeUpstream(endless) as upstream:
            await asyncio.to_thread(way.deploy, people["alice"], upstream.url)
            app = gateway_app()
            reply = await call(Stalling(app, 3), "POST", way.path, token=people["alice"].token, body=way.body)
            # Three pieces taken (the OpenAI API's first is the role's chunk), then nothing: no error event (it
            # would not be read), the answer left unfinished for the web server to reset, Triton's connection
            # closed and the team's one slot free again.
            assert reply.status == 200 and not reply.complete
            assert len(sse_events(reply.body)) == 3 and b'"error"' not in reply.body
            await asyncio.to_thread(wait_for, lambda: upstream.open_connections == 0, 5,
                                    what="the gateway to close its upstream connection")
            assert app.streams.open == {}
            assert ended(app.collector) == {"slow_reader": 1}
            again = await call(app, "POST", way.path, token=people["alice"].token, body=way.body,
                               disconnect="after_start")
            assert again.status == 200
            assert ended(app.collector) == {"cancelled": 1}

    run(scenario)


@pytest.mark.parametrize("way", WAYS)
def test_streams_ended_by_a_silent_model_or_a_piece_too_large_are_counted_by_their_reason(
    people: dict[str, Person], gateway_app: Any, settings: Any, way: Way
) -> None:
    settings.GATEWAY_STREAM_IDLE_SECONDS = 0.3
    settings.GATEWAY_MAX_RESPONSE_BYTES = 1024
    answers = iter([sse([event("a")], end=False), sse([event("a"), b"data: " + b"x" * 4096 + b"\n\n"])])

    async def scenario() -> None:
        async with FakeUpstream(lambda r: next(answers)) as upstream:
            await asyncio.to_thread(way.deploy, people["alice"], upstream.url)
            app = gateway_app()
            silent = await call(app, "POST", way.path, token=people["alice"].token, body=way.body)
            assert "GATEWAY_STREAM_IDLE_SECONDS" in way.error(silent.body)
            large = await call(app, "POST", way.path, token=people["alice"].token, body=way.body)
            assert "GATEWAY_MAX_RESPONSE_BYTES" in way.error(large.body)
            assert ended(app.collector) == {"idle": 1, "too_large": 1}

    run(scenario)


def test_a_streams_figures_are_counted_per_deployment_and_revision_and_reach_the_stats_api(
    people: dict[str, Person], gateway_app: Any
) -> None:
    from django.test import Client

    from gateway import stats

    go = asyncio.Event()

    async def scenario() -> None:
        async with FakeUpstream(paced(go)) as upstream:
            await asyncio.to_thread(streaming_deployment, people["alice"], upstream.url)
            reply, buckets = await counted_stream(gateway_app(), STREAM, people["alice"].token,
                                                  b'{"text_input": "a"}', go)
            assert reply.status == 200 and len(sse_events(reply.body)) == 4
            (counts,) = [b.streams for b in buckets.values() if b.streams.streams]
            # Stored beside the stream's request, under its model: one row, not one for the request, one for the stream
            assert {key[2] for key in buckets} == {"chat"}
            assert counts.pieces == 4 and counts.ends == {"complete": 1} and sum(counts.gaps) == 3
            first, gap = stats.percentile_ms(counts.first, 0.5), stats.percentile_ms(counts.gaps, 0.5)
            assert first is not None and first >= 50  # from the arrival, the model's 50 ms included
            assert gap is not None and 15 <= gap < 200
            await asyncio.to_thread(stats.flush, buckets)

    run(scenario)
    figures = Client(headers={"Authorization": f"Bearer {people['alice'].token}"}).get(
        "/api/v1/deployments/chat/metrics/").json()
    for streams in (figures["streams"], figures["revisions"]["1"]["streams"]):
        assert streams["streams"] == 1 and streams["pieces"] == 4
        assert streams["ttft_p50_ms"] >= 50 and streams["itl_p50_ms"] >= 15
        assert streams["cancelled"] == 0 and set(streams["ended_by"].values()) == {0}
