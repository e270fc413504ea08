"""A ModelStreamInfer caller that stops reading (issue 33, containment; docs/security.md, "Streams" over gRPC): the
gateway holds what gRPC's flow control lets it hold, then ends the stream after GATEWAY_STREAM_SEND_SECONDS, cancels
its requests in Triton and counts it as a slow reader. A scripted gRPC server stands in for Triton
(grpc_fake_upstream.py), since no real model can be made to stream this fast on demand; it writes each piece as soon
as the gateway takes the last one, so what it has written is what the gateway read from it.

Measured on grpcio 1.85 before the bound existed: the server's `context.write()` waits while the caller's HTTP/2
window is used up (a tritonclient-like caller that reads nothing lets one 1 KB piece through past its window) or,
for a caller announcing 2 GiB windows that does not read its socket, while the kernel's socket buffers are full
(2.8 MB went, the server's resident memory grew by 76 KiB); nothing piles up in grpc.aio. What a slow reader held
was time: the write, the stream slot and the model's instance, for as long as the caller stayed."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from gateway.tests import raw_http2
from gateway.tests.grpc_fake_upstream import piece_reply
from gateway.tests.grpc_support import (
    PREFIX,
    chat_request,
    deploy_streaming,
    infer_request,
    is_chat,
    meta,
    next_answer,
    settles,
    stack,
    stream_counts,
)
from tests.support.gateway_calls import run
from tests.support.people import Person

SEND_SECONDS = 1.0
PIECE_TEXT = "x" * (64 * 1024)
# What the gateway may take from the upstream while its caller reads nothing: the response it is writing and the
# upstream call's HTTP/2 window (64 KiB: the streams' channel does not grow it, grpc_app.Channels). Measured: 131 KB
# written by the fake (5.8 MB while the channel probed the bandwidth-delay product), the test's process (gateway,
# fake and caller) grown by 0.7 to 0.8 MiB.
UPSTREAM_BOUND = 1024**2
# A caller that reads no socket also has the sockets' buffers between it and the gateway filled: measured 2.8 to
# 2.9 MB written by the fake, the process grown by 0.65 to 0.85 MiB.
SOCKET_BOUND = 8 * 1024**2
RSS_BOUND = 16 * 1024**2


@pytest.fixture(autouse=True)
def _grpc_slow_reader_settings(settings: Any) -> None:
    settings.GATEWAY_CACHE_TTL_SECONDS = 5
    settings.GATEWAY_RATE_LIMIT_PER_SECOND = 1000
    settings.GATEWAY_RATE_LIMIT_BURST = 1000
    settings.GATEWAY_UPSTREAM_TIMEOUT_SECONDS = 10
    settings.GATEWAY_MAX_STREAMS_PER_TEAM = 4
    settings.GATEWAY_STREAM_IDLE_SECONDS = 10.0
    settings.GATEWAY_MAX_STREAM_SECONDS = 60.0
    settings.GATEWAY_MAX_STREAM_BYTES = 2**40  # never the bound that ends these streams
    settings.GATEWAY_STREAM_SEND_SECONDS = SEND_SECONDS


class Flood:
    """A decoupled model that never stops: 64 KiB pieces, each written as soon as the gateway took the last."""

    def __init__(self) -> None:
        self.written = 0

    def __call__(self, request: bytes) -> AsyncIterator[bytes] | None:
        if not is_chat(request):
            return None

        async def pieces() -> AsyncIterator[bytes]:
            while True:
                piece = piece_reply(request, PIECE_TEXT)
                yield piece
                self.written += len(piece)

        return pieces()


def resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def slow_readers(deployment: str, before: dict[str, float]) -> float:
    return stream_counts(deployment).get("slow_reader", 0) - before.get("slow_reader", 0)


def test_a_caller_that_stops_reading_has_its_stream_ended_its_request_cancelled_and_counted(
    people: dict[str, Person]
) -> None:
    from gateway.stats import REQUESTS

    async def scenario() -> None:
        async with stack() as (gateway, fake, _):
            await asyncio.to_thread(deploy_streaming, people["alice"], "hogs", fake.target)
            fake.pieces = flood = Flood()
            before = stream_counts("hogs")
            rss_before = resident()
            # tritonclient's stream as a hostile caller makes it: a small window, grown by nothing, and no reads
            # after the first response.
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}", options=[
                ("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)])
            try:
                stream = channel.stream_stream(PREFIX + "ModelStreamInfer")(
                    metadata=meta(people["alice"], "hogs"), timeout=30)
                await stream.write(chat_request("hog"))
                assert (await next_answer(stream)).infer_response.id == "hog"
                stopped = time.monotonic()
                assert await settles(lambda: slow_readers("hogs", before), 1) == 1
                took = time.monotonic() - stopped
                assert SEND_SECONDS * 0.9 <= took <= SEND_SECONDS + 2.0, took
                # Its request is cancelled in Triton, its slot freed, and it counts as a 408 (the caller's doing).
                assert await settles(lambda: fake.cancelled, ["hog"]) == ["hog"]
                assert await settles(lambda: gateway.streams.open, {}) == {}
                assert REQUESTS.labels("acme", "hogs", "1", "chat", "408")._value.get() == 1
                # The gateway took no more than flow control let it, however fast the model went.
                assert flood.written <= UPSTREAM_BOUND, flood.written
                assert resident() - rss_before <= RSS_BOUND, resident() - rss_before
                # A caller that reads again gets what was on its way, then the status naming the setting.
                with pytest.raises(grpc.aio.AioRpcError) as ended:
                    while await asyncio.wait_for(stream.read(), 10) is not grpc.aio.EOF:
                        pass
                assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "GATEWAY_STREAM_SEND_SECONDS" in (ended.value.details() or "")
            finally:
                await channel.close()

    run(scenario, timeout=30)


def test_a_caller_that_reads_nothing_with_windows_wide_open_is_bounded_by_its_socket_and_ended(
    people: dict[str, Person]
) -> None:
    async def scenario() -> None:
        async with stack() as (gateway, fake, _):
            await asyncio.to_thread(deploy_streaming, people["alice"], "wide", fake.target)
            fake.pieces = flood = Flood()
            before = stream_counts("wide")
            rss_before = resident()
            sock = await asyncio.to_thread(raw_http2.open_unread_call, gateway.port, PREFIX + "ModelStreamInfer",
                                           meta(people["alice"], "wide"), chat_request("wide"))
            try:
                opened = time.monotonic()
                assert await settles(lambda: slow_readers("wide", before), 1) == 1
                assert time.monotonic() - opened <= SEND_SECONDS + 3.0
                assert await settles(lambda: fake.cancelled, ["wide"]) == ["wide"]
                assert await settles(lambda: gateway.streams.open, {}) == {}
                # HTTP/2 held nothing back: the sockets' buffers did, the gateway's part of it its one response.
                assert flood.written <= SOCKET_BOUND, flood.written
                assert resident() - rss_before <= RSS_BOUND, resident() - rss_before
            finally:
                sock.close()

    run(scenario, timeout=30)


def test_answers_of_one_answer_models_left_unread_end_the_stream_too(people: dict[str, Person]) -> None:
    from gateway.stats import REQUESTS

    big = b"\0" * (1024 * 1024)

    def answers(request: bytes) -> AsyncIterator[bytes] | None:
        async def one() -> AsyncIterator[bytes]:
            parsed = pb.ModelInferRequest.FromString(request)
            answer = pb.ModelInferResponse(model_name=parsed.model_name, id=parsed.id, raw_output_contents=[big])
            yield pb.ModelStreamInferResponse(infer_response=answer).SerializeToString()

        return one()

    async def scenario() -> None:
        async with stack() as (gateway, fake, _):
            await asyncio.to_thread(deploy_streaming, people["alice"], "answers", fake.target)
            fake.pieces = answers  # one response a request, as Triton answers a one-answer model
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}", options=[
                ("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)])
            try:
                stream = channel.stream_stream(PREFIX + "ModelStreamInfer")(
                    metadata=meta(people["alice"], "answers"), timeout=30)
                for index in range(32):
                    await stream.write(infer_request([1], b"\0" * 4, request_id=f"d{index}"))
                # Answers Triton made that the caller never read: the one being written, and those behind it.
                assert await settles(lambda: REQUESTS.labels("acme", "answers", "1", "digits", "408")._value.get() > 0,
                                     True)
                assert await settles(lambda: len(fake.cancelled), 1) == 1  # the upstream stream was cancelled
                assert len(fake.calls) < 32  # the rest never reached Triton
                with pytest.raises(grpc.aio.AioRpcError) as ended:
                    while await asyncio.wait_for(stream.read(), 10) is not grpc.aio.EOF:
                        pass
                assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            finally:
                await channel.close()

    run(scenario, timeout=30)


def test_a_caller_slower_than_the_model_but_within_the_bound_is_never_ended(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (gateway, fake, _):
            await asyncio.to_thread(deploy_streaming, people["alice"], "steady", fake.target)
            fake.pieces = Flood()
            before = stream_counts("steady")
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}", options=[
                ("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)])
            try:
                stream = channel.stream_stream(PREFIX + "ModelStreamInfer")(
                    metadata=meta(people["alice"], "steady"), timeout=30)
                await stream.write(chat_request("steady"))
                started = time.monotonic()
                # A response taken every SEND_SECONDS / 4, for three times the bound: each write waits for the
                # caller, none for as long as the bound.
                while time.monotonic() - started < 3 * SEND_SECONDS:
                    assert (await next_answer(stream)).infer_response.id == "steady"
                    await asyncio.sleep(SEND_SECONDS / 4)
                assert slow_readers("steady", before) == 0 and fake.cancelled == []
                # Its cancel while a write waits for it counts as a cancel (the failed write once counted as a
                # complete stream).
                stream.cancel()
                assert await settles(lambda: fake.cancelled, ["steady"]) == ["steady"]
                assert await settles(lambda: stream_counts("steady").get("cancelled", 0) - before.get("cancelled", 0),
                                     1) == 1
                assert stream_counts("steady").get("complete", 0) == before.get("complete", 0)
            finally:
                await channel.close()

    run(scenario, timeout=30)
