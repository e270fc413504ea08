"""The OpenAI-compatible API (gateway/openai/) against a scripted Triton: the generate_stream call it makes, the
chunks and whole answers it makes of Triton's events, its refusals in OpenAI's error shape. The official SDK against
a real Triton is left to an end-to-end test."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from deployments.models import Deployment
from gateway.tests.fake_upstream import FakeUpstream, json_response, response
from gateway.tests.stream_support import STREAMED, TEXT_SIGNATURE, chunks, counted_stream, paced, text_deployment
from tests.support.gateway_calls import call, run
from tests.support.people import Person

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
CHAT = "/serve/chat/v1/chat/completions"


def event(text: str | list[str]) -> bytes:
    return b"data: " + json.dumps({"model_name": "chat", "model_version": "1", "text_output": text}).encode() + b"\n\n"


def sse(pieces: list[bytes]) -> bytes:
    return SSE_HEAD + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def body(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode()


def test_a_chat_request_renders_the_template_calls_generate_stream_and_joins_the_pieces(
    people: dict[str, Person], gateway_app: Any
) -> None:
    template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                "{% if add_generation_prompt %}<a>{% endif %}")

    async def scenario() -> None:
        async with FakeUpstream(lambda r: sse([event("Hello "), event("world")])) as upstream:
            await asyncio.to_thread(text_deployment, people["alice"], upstream.url, TEXT_SIGNATURE, template)
            reply = await call(gateway_app(), "POST", CHAT, token=people["alice"].token,
                               body=body({"model": "chat", "messages": [{"role": "user", "content": "hi there"}],
                                          "max_tokens": 5}))
            assert reply.status == 200, reply.body
            answer = reply.json()
            assert answer["object"] == "chat.completion" and answer["model"] == "chat"
            assert answer["choices"][0]["message"] == {"role": "assistant", "content": "Hello world", "refusal": None}
            assert answer["choices"][0]["finish_reason"] == "stop"
            assert answer["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
            (sent,) = upstream.requests
            assert sent.target == b"/v2/models/chat/generate_stream"
            assert json.loads(sent.body) == {"text_input": "<user>hi there<a>", "stream": True, "max_tokens": 5}
            assert reply.headers[b"modelport-revision"] == b"1"

    run(scenario)


def test_a_streamed_completion_is_chunks_then_usage_then_done(people: dict[str, Person], gateway_app: Any) -> None:
    async def scenario() -> None:
        async with FakeUpstream(lambda r: sse([event("a "), event("b ")])) as upstream:
            await asyncio.to_thread(text_deployment, people["alice"], upstream.url)
            reply = await call(gateway_app(), "POST", "/serve/chat/v1/completions", token=people["alice"].token,
                               body=body({"model": "chat", "prompt": "once upon", "stream": True, "max_tokens": 2,
                                          "stream_options": {"include_usage": True}}))
            assert reply.status == 200 and reply.complete
            assert reply.headers[b"content-type"].startswith(b"text/event-stream")
            got = chunks(reply.body)
            assert [c["choices"][0]["text"] for c in got[:2]] == ["a ", "b "]
            assert got[2]["choices"][0]["finish_reason"] == "length"
            assert got[3]["choices"] == [] and got[3]["usage"]["completion_tokens"] == 2
            assert got[-1] == "[DONE]"
            assert json.loads(upstream.requests[0].body)["stream"] is True

    run(scenario)


def test_an_event_carrying_several_pieces_is_one_chunk_and_counts_each_piece(
    people: dict[str, Person], gateway_app: Any
) -> None:
    """A model whose sending fell behind sends the pieces it has in one response (text_output [1, pieces], a list in
    the event): one chunk of their text, each piece counted, so usage and the finish reason stay right."""
    async def scenario() -> None:
        async with FakeUpstream(lambda r: sse([event("a "), event(["b ", "c ", "d "])])) as upstream:
            await asyncio.to_thread(text_deployment, people["alice"], upstream.url)
            app = gateway_app()
            streamed = await call(app, "POST", "/serve/chat/v1/completions", token=people["alice"].token,
                                  body=body({"model": "chat", "prompt": "once", "stream": True, "max_tokens": 4,
                                             "stream_options": {"include_usage": True}}))
            got = chunks(streamed.body)
            assert [c["choices"][0]["text"] for c in got[:2]] == ["a ", "b c d "]
            assert got[2]["choices"][0]["finish_reason"] == "length"  # 4 pieces of max_tokens 4, in 2 events
            assert got[3]["usage"]["completion_tokens"] == 4
            whole = await call(app, "POST", "/serve/chat/v1/completions", token=people["alice"].token,
                               body=body({"model": "chat", "prompt": "once", "max_tokens": 5}))
            answer = whole.json()
            assert answer["choices"][0]["text"] == "a b c d " and answer["choices"][0]["finish_reason"] == "stop"
            assert answer["usage"]["completion_tokens"] == 4

    run(scenario)


def test_a_streamed_chat_opens_with_the_role_and_an_error_event_ends_it_in_openai_shape(
    people: dict[str, Person], gateway_app: Any
) -> None:
    failing = b'data: {"error": "Traceback (most recent call last): /srv/model.py"}\n\n'

    async def scenario() -> None:
        async with FakeUpstream(lambda r: sse([event("one"), failing])) as upstream:
            await asyncio.to_thread(text_deployment, people["alice"], upstream.url)
            reply = await call(gateway_app(), "POST", CHAT, token=people["alice"].token,
                               body=body({"model": "chat", "stream": True,
                                          "messages": [{"role": "user", "content": "x"}]}))
            got = chunks(reply.body)
            assert got[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            assert got[1]["choices"][0]["delta"] == {"content": "one"}
            assert got[2]["error"]["type"] == "server_error" and "model.py" not in got[2]["error"]["message"]
            assert reply.complete

    run(scenario)


def test_what_the_deployment_cannot_honour_is_a_400_naming_it(people: dict[str, Person], gateway_app: Any) -> None:
    messages = [{"role": "user", "content": "x"}]
    cases = [({"n": 2}, "n"), ({"logprobs": True}, "logprobs"), ({"tools": [{"type": "function"}]}, "tools"),
             ({"response_format": {"type": "json_object"}}, "response_format"), ({"temperature": 0.5}, "temperature"),
             ({"logit_bias": {"1": 2}}, "logit_bias"), ({"frobnicate": 1}, "frobnicate"),
             ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
              "messages[0].content[0].type"),
             ({"messages": [{"role": "user", "content": "x"}] * 2000}, "messages")]

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(text_deployment, people["alice"], upstream.url)
            app = gateway_app()
            for extra, param in cases:
                reply = await call(app, "POST", CHAT, token=people["alice"].token,
                                   body=body({"model": "chat", "messages": messages, **extra}))
                assert reply.status == 400, (extra, reply.body)
                error = reply.json()["error"]
                assert error["type"] == "invalid_request_error" and error["param"] == param, error
            assert upstream.requests == []

    run(scenario)


def test_a_hostile_template_is_a_400_and_the_gateway_keeps_answering(people: dict[str, Person],
                                                                     gateway_app: Any) -> None:
    forever = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(text_deployment, people["alice"], upstream.url, TEXT_SIGNATURE, forever)
            reply = await call(gateway_app(), "POST", CHAT, token=people["alice"].token,
                               body=body({"model": "chat", "messages": [{"role": "user", "content": "x"}]}))
            assert reply.status == 400 and "took more than" in reply.json()["error"]["message"]
            assert upstream.requests == []

    run(scenario)


def test_unknown_model_wrong_token_and_a_model_without_the_contract_answer_in_openai_shape(
    people: dict[str, Person], gateway_app: Any
) -> None:
    image = {"inputs": [{"name": "image", "datatype": "FP32", "dims": [3]}],
             "outputs": [{"name": "scores", "datatype": "FP32", "dims": [10]}]}

    async def scenario() -> None:
        async with FakeUpstream(lambda r: json_response({"error": "no"})) as upstream:
            await asyncio.to_thread(text_deployment, people["alice"], upstream.url, image)
            app = gateway_app()
            chat = body({"model": "chat", "messages": [{"role": "user", "content": "x"}]})
            refused = await call(app, "POST", CHAT, token=people["alice"].token, body=chat)
            assert refused.status == 400 and "'text_input' (BYTES)" in refused.json()["error"]["message"]
            unknown = await call(app, "POST", CHAT, token=people["alice"].token,
                                 body=body({"model": "other", "messages": [{"role": "user", "content": "x"}]}))
            assert unknown.status == 404 and unknown.json()["error"]["code"] == "model_not_found"
            other_team = await call(app, "POST", CHAT, token=people["charlie"].token, body=chat)
            assert other_team.status == 404 and "error" in other_team.json()
            bad = await call(app, "POST", CHAT, token="mp_nope_nope", body=chat)
            assert bad.status == 401 and bad.json()["error"]["code"] == "invalid_api_key"
            listed = await call(app, "GET", "/serve/chat/v1/models", token=people["alice"].token)
            assert listed.json()["object"] == "list" and [m["id"] for m in listed.json()["data"]] == ["chat"]
            assert upstream.requests == []

    run(scenario)


# --- A streamed answer's figures (its bounds: gateway/tests/test_streams.py, run on both ways to stream) ---------

def test_a_v1_streams_figures_count_its_pieces_ttft_and_gaps_per_deployment_and_revision(
    people: dict[str, Person], gateway_app: Any
) -> None:
    from gateway import stats

    go = asyncio.Event()

    async def scenario() -> None:
        async with FakeUpstream(paced(go)) as upstream:
            await asyncio.to_thread(text_deployment, people["alice"], upstream.url)
            reply, buckets = await counted_stream(gateway_app(), CHAT, people["alice"].token, STREAMED, go)
            assert reply.status == 200 and chunks(reply.body)[-1] == "[DONE]"
            (counts,) = [b.streams for b in buckets.values() if b.streams.streams]
            # Stored under the model called, the stream's figures with its request's in one row.
            assert {key[2] for key in buckets} == {"chat"}
            # The model's four pieces, not the role's chunk, the finish chunk or [DONE]; TTFT from the arrival.
            assert counts.pieces == 4 and counts.ends == {"complete": 1} and sum(counts.gaps) == 3
            first = stats.percentile_ms(counts.first, 0.5)
            assert first is not None and first >= 50

    run(scenario)


def test_the_models_refusal_of_the_request_is_a_400_with_its_words_streamed_or_not(
    people: dict[str, Person], gateway_app: Any
) -> None:
    # As Triton answers a decoupled model's INVALID_ARG to the first response: a 400 whose body is one event.
    refusal = b'data: {"error":"max_tokens must be between 1 and 1024, got 5000"}\n\n'

    async def scenario() -> None:
        async with FakeUpstream(lambda r: response(400, refusal, {"Content-Type": "text/event-stream"})) as upstream:
            await asyncio.to_thread(text_deployment, people["alice"], upstream.url)
            for stream in (False, True):
                reply = await call(gateway_app(), "POST", CHAT, token=people["alice"].token,
                                   body=body({"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                                              "max_tokens": 5000, "stream": stream}))
                assert reply.status == 400, reply.body
                error = reply.json()["error"]
                assert error["type"] == "invalid_request_error"
                assert error["message"] == "max_tokens must be between 1 and 1024, got 5000"
        # Not an event: Triton's plain words are kept from the caller as before.
        async with FakeUpstream(lambda r: response(400, b"data: not json\n\n", {})) as upstream:
            await asyncio.to_thread(Deployment.objects.filter(name="chat").update, upstream_url=upstream.url)
            reply = await call(gateway_app(), "POST", CHAT, token=people["alice"].token,
                               body=body({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}))
            assert reply.status == 400 and reply.json()["error"]["message"] == "Triton answered with an error."

    run(scenario)
