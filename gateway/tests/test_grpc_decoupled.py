"""ModelStreamInfer on a decoupled (streaming) model through the gRPC gateway (issue 33): each of the model's
responses relayed as it comes, its final flag as Triton sends it, a request's own upstream call cancelled when the
caller goes or a bound is passed, and the stream bounds per request. A scripted gRPC server stands in for Triton
(grpc_fake_upstream.py, which answers as the real Triton 2.51 was measured to); the real one runs in
tests/test_grpc_stream_e2e.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from gateway.tests.grpc_fake_upstream import final_reply, piece_reply
from gateway.tests.grpc_support import (
    chat_request,
    deploy_streaming,
    infer_request,
    is_chat,
    meta,
    next_answer,
    open_stream,
    settles,
    stack,
    stream_counts,
)
from tests.support.gateway_calls import run
from tests.support.people import Person


@pytest.fixture(autouse=True)
def _decoupled_settings(settings: Any) -> None:
    settings.GATEWAY_CACHE_TTL_SECONDS = 0.5
    settings.GATEWAY_RATE_LIMIT_PER_SECOND = 1000
    settings.GATEWAY_RATE_LIMIT_BURST = 1000
    settings.GATEWAY_UPSTREAM_TIMEOUT_SECONDS = 5
    settings.GATEWAY_MAX_STREAMS_PER_TEAM = 4
    settings.GATEWAY_STREAM_IDLE_SECONDS = 5.0
    settings.GATEWAY_MAX_STREAM_SECONDS = 30.0
    settings.GATEWAY_MAX_STREAM_BYTES = 1024 * 1024


def text_of(answer: pb.ModelStreamInferResponse) -> str:
    return answer.infer_response.raw_output_contents[0][4:].decode()


def final_of(answer: pb.ModelStreamInferResponse) -> bool | None:
    flag = answer.infer_response.parameters.get("triton_final_response")
    return None if flag is None else flag.bool_param


def in_flight() -> float:
    from gateway.stats import IN_FLIGHT

    return float(IN_FLIGHT.labels("acme", "streams")._value.get())


def test_each_piece_arrives_as_the_model_sends_it_with_the_final_flag_only_where_the_caller_asked(
    people: dict[str, Person]
) -> None:
    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy_streaming, people["alice"], "streams", fake.target)
            gates = {"asked": asyncio.Event(), "not-asked": asyncio.Event()}

            async def pieces(request: bytes) -> AsyncIterator[bytes]:
                yield piece_reply(request, "first ")
                await gates[pb.ModelInferRequest.FromString(request).id].wait()
                yield piece_reply(request, "second")
                if (final := final_reply(request)) is not None:
                    yield final

            fake.pieces = lambda request: pieces(request) if is_chat(request) else None
            stream = await open_stream(channel, meta(people["alice"], "streams"))
            for request_id, asked in (("asked", True), ("not-asked", None)):
                await stream.write(chat_request(request_id, empty_final=asked))
                first = await next_answer(stream)  # before the model has sent its second piece: nothing held back
                assert (first.infer_response.id, text_of(first), final_of(first)) == (request_id, "first ", False)
                gates[request_id].set()
                second = await next_answer(stream)
                assert (text_of(second), final_of(second)) == ("second", False)
                if asked:
                    final = await next_answer(stream)
                    assert final.infer_response.id == "asked" and final_of(final) is True
                    assert not final.infer_response.outputs and not final.error_message
            await stream.done_writing()
            assert await stream.read() is grpc.aio.EOF  # no empty final the second caller did not ask for
            assert await stream.code() == grpc.StatusCode.OK
            # The requests went to Triton as they came (the flag as the caller set it, nothing added), each on a
            # call of its own.
            assert [c.request for c in fake.calls] == [chat_request("asked", empty_final=True),
                                                      chat_request("not-asked")]
            assert await settles(in_flight, 0) == 0

    run(scenario)


def test_a_stream_mixing_streaming_and_one_answer_models_pairs_every_answer_with_its_request(
    people: dict[str, Person]
) -> None:
    from gateway.stats import REQUESTS

    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            await asyncio.to_thread(deploy_streaming, people["alice"], "streams", fake.target)
            release = asyncio.Event()

            async def pieces(request: bytes) -> AsyncIterator[bytes]:
                parsed = pb.ModelInferRequest.FromString(request)
                yield piece_reply(request, "a")
                await release.wait()
                if parsed.id == "chat-bad":
                    error = pb.ModelStreamInferResponse(error_message=(
                        "Failed to process the request(s) for model 'chat_0_0', message: RuntimeError: boom\n\nAt:\n"
                        "  /models/chat/1/model.py(12): execute"),
                        infer_response=pb.ModelInferResponse(model_name="chat", id=parsed.id))
                    error.infer_response.parameters["triton_final_response"].bool_param = True
                    yield error.SerializeToString()
                    return
                yield piece_reply(request, "b", final=True)

            fake.pieces = lambda request: pieces(request) if is_chat(request) else None
            stream = await open_stream(channel, meta(people["alice"], "streams"))
            await stream.write(chat_request("chat-1"))
            await stream.write(chat_request("chat-bad"))
            for index in range(3):  # answered while both decoupled requests are still streaming
                await stream.write(infer_request([1], b"\0" * 4, request_id=f"digits-{index}"))
            answers = [await next_answer(stream) for _ in range(5)]
            assert sorted(a.infer_response.id for a in answers) == ["chat-1", "chat-bad", "digits-0", "digits-1",
                                                                   "digits-2"]
            assert await settles(in_flight, 2) == 2  # the two decoupled requests, not the answered digits
            release.set()
            rest = {a.infer_response.id: a for a in [await next_answer(stream) for _ in range(2)]}
            assert text_of(rest["chat-1"]) == "b" and final_of(rest["chat-1"]) is True
            error = rest["chat-bad"].error_message
            # A model's failure in a unary call's words, the request id in front, no internals; still the final one.
            assert error.startswith("[request id: chat-bad] ") and "model.py" not in error, error
            assert final_of(rest["chat-bad"]) is True
            await stream.done_writing()
            assert await stream.read() is grpc.aio.EOF
            assert await settles(in_flight, 0) == 0
            assert REQUESTS.labels("acme", "streams", "1", "chat", "200")._value.get() >= 1
            assert REQUESTS.labels("acme", "streams", "1", "chat", "500")._value.get() >= 1
            assert REQUESTS.labels("acme", "streams", "1", "digits", "200")._value.get() >= 3

    run(scenario)


def _endless(pause: float = 0.05, size: int = 8) -> Any:
    async def pieces(request: bytes) -> AsyncIterator[bytes]:
        while True:
            yield piece_reply(request, "x" * size)
            await asyncio.sleep(pause)

    return lambda request: pieces(request) if is_chat(request) else None


def test_a_caller_that_cancels_cancels_the_request_in_triton_and_frees_its_slot(people: dict[str, Person]) -> None:
    from gateway.stream_slots import StreamSlots

    async def scenario() -> None:
        async with stack() as (gateway, fake, channel):
            await asyncio.to_thread(deploy_streaming, people["alice"], "streams", fake.target)
            fake.pieces = _endless()
            stream = await open_stream(channel, meta(people["alice"], "streams"))
            await stream.write(chat_request("long"))
            await next_answer(stream)
            slots: StreamSlots = gateway.streams
            assert slots.open == {people["alice"].team.id: 1}
            stream.cancel()
            assert await settles(lambda: fake.cancelled, ["long"]) == ["long"]
            assert await settles(lambda: slots.open, {}) == {}
            assert await settles(in_flight, 0) == 0

    run(scenario)


def test_past_the_teams_stream_slots_a_request_is_refused_in_the_stream_and_other_teams_are_untouched(
    settings: Any, people: dict[str, Person]
) -> None:
    settings.GATEWAY_MAX_STREAMS_PER_TEAM = 1

    async def scenario() -> None:
        async with stack() as (gateway, fake, channel):
            await asyncio.to_thread(deploy_streaming, people["alice"], "streams", fake.target)
            await asyncio.to_thread(deploy_streaming, people["charlie"], "theirs", fake.target)
            fake.pieces = _endless()
            stream = await open_stream(channel, meta(people["alice"], "streams"))
            await stream.write(chat_request("one"))
            assert (await next_answer(stream)).infer_response.id == "one"
            await stream.write(chat_request("two"))
            while (refused := await next_answer(stream)).infer_response.id != "two":
                pass
            assert "GATEWAY_MAX_STREAMS_PER_TEAM=1" in refused.error_message and final_of(refused) is True
            assert refused.error_message.startswith("[request id: two] Team 'acme' has 1 streams open")
            # Another team streams on: the slots are per team.
            other = await open_stream(channel, meta(people["charlie"], "theirs"))
            await other.write(chat_request("theirs"))
            assert (await next_answer(other)).infer_response.id == "theirs"
            assert [pb.ModelInferRequest.FromString(c.request).id for c in fake.calls] == ["one", "theirs"]
            other.cancel()
            stream.cancel()
            assert await settles(lambda: gateway.streams.open, {}) == {}

    run(scenario)


@pytest.mark.parametrize("bound", ["GATEWAY_STREAM_IDLE_SECONDS", "GATEWAY_MAX_STREAM_SECONDS",
                                   "GATEWAY_MAX_STREAM_BYTES"])
def test_a_request_past_a_stream_bound_gets_an_error_naming_it_and_is_cancelled_in_triton_while_the_stream_goes_on(
    bound: str, settings: Any, people: dict[str, Person]
) -> None:
    async def silent(request: bytes) -> AsyncIterator[bytes]:
        yield piece_reply(request, "only one")
        await asyncio.Event().wait()

    if bound == "GATEWAY_STREAM_IDLE_SECONDS":
        settings.GATEWAY_STREAM_IDLE_SECONDS = 0.3
        pieces = lambda request: silent(request) if is_chat(request) else None  # noqa: E731
    elif bound == "GATEWAY_MAX_STREAM_SECONDS":
        settings.GATEWAY_MAX_STREAM_SECONDS = 1.0
        settings.GATEWAY_STREAM_IDLE_SECONDS = 0.5
        pieces = _endless(pause=0.05)  # never idle, never ending
    else:
        settings.GATEWAY_MAX_STREAM_BYTES = 4096
        pieces = _endless(pause=0.01, size=1000)

    async def scenario() -> None:
        async with stack() as (gateway, fake, channel):
            await asyncio.to_thread(deploy_streaming, people["alice"], "streams", fake.target)
            fake.pieces = pieces
            stream = await open_stream(channel, meta(people["alice"], "streams"))
            await stream.write(chat_request("bounded"))
            received = []
            while not (answer := await next_answer(stream)).error_message:
                received.append(answer)
            assert bound in answer.error_message and answer.infer_response.id == "bounded", answer.error_message
            assert answer.error_message.startswith("[request id: bounded] ") and final_of(answer) is True
            assert received and all(a.infer_response.id == "bounded" for a in received)
            if bound == "GATEWAY_MAX_STREAM_BYTES":
                assert sum(len(a.SerializeToString()) for a in received) <= 4096
            assert await settles(lambda: fake.cancelled, ["bounded"]) == ["bounded"]
            assert await settles(lambda: gateway.streams.open, {}) == {}
            # The stream itself goes on: a request to the one-answer model is answered.
            await stream.write(infer_request([1], b"\0" * 4, request_id="after"))
            assert (await next_answer(stream)).infer_response.id == "after"
            await stream.done_writing()
            assert await stream.read() is grpc.aio.EOF
            assert await stream.code() == grpc.StatusCode.OK

    run(scenario)


def streamed_models(deployment: str) -> set[str]:
    from gateway.models import RequestStats

    return set(RequestStats.objects.filter(deployment__name=deployment, streams__gt=0).values_list("model", flat=True))


def test_a_decoupled_request_is_counted_in_the_stream_figures_as_http_streams_are(people: dict[str, Person]) -> None:
    async def scenario() -> None:
        async with stack() as (gateway, fake, channel):
            await asyncio.to_thread(deploy_streaming, people["alice"], "figures", fake.target)
            before = stream_counts("figures")
            silent = asyncio.Event()

            async def pieces(request: bytes) -> AsyncIterator[bytes]:
                yield piece_reply(request, "one ")
                if pb.ModelInferRequest.FromString(request).id == "left":
                    await silent.wait()  # never set: the caller goes away meanwhile
                yield piece_reply(request, "two ")
                yield piece_reply(request, "three")

            fake.pieces = lambda request: pieces(request) if is_chat(request) else None
            stream = await open_stream(channel, meta(people["alice"], "figures"))
            await stream.write(chat_request("whole"))
            assert [text_of(await next_answer(stream)) for _ in range(3)] == ["one ", "two ", "three"]
            await stream.write(chat_request("left"))
            assert text_of(await next_answer(stream)) == "one "
            stream.cancel()

            def counted() -> dict[str, float]:
                now = stream_counts("figures")
                return {key: now.get(key, 0) - before.get(key, 0) for key in ("pieces", "complete", "cancelled")}

            assert await settles(counted, {"pieces": 4, "complete": 1, "cancelled": 1}) == {
                "pieces": 4, "complete": 1, "cancelled": 1}
            # Stored under the model called, beside its requests: its figures count in the model's gateway share.
            await gateway._flush()  # what its own flushes have not written yet
            assert await asyncio.to_thread(streamed_models, "figures") == {"chat"}

    run(scenario)
