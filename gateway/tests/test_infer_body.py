"""Inference requests are checked before they reach Triton: what would crash it (a declared shape of
[2**40, 64], JSON nested 300,000 deep) and what it would answer with a 500 (issue 12's fuzzing: malformed JSON,
null or array bodies, wrong types, shape/data mismatch, negative shapes, bad binary_data_size) get a 400 or 413
with a message that says what to fix. Triton's own 500s for parse failures become 400s, and its internal
`raw_input` name never reaches the user."""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import struct
import time
import zlib
from typing import Any

import numpy as np
import pytest

from gateway.fastpath import reference
from gateway.fastpath.depth import (
    _FIND_OPENERS_MAX,
    _MAX_BRACKET_POSITIONS,
    _MAX_QUOTE_POSITIONS,
    _depth_steps,
    _few_openers,
    _openers,
    _without_escapes,
    json_too_deep,
)
from gateway.fastpath.json_body import check_json
from gateway.protocol import Refusal, check_infer_request, client_error, parse_json_header
from gateway.tests.fake_upstream import FakeUpstream, Request, echo, json_response
from gateway.tests.infer_bodies import BINARY_HOSTILE, HOSTILE, OK, j, with_input
from tests.processes import until
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person


def test_hostile_requests_are_refused_before_triton_sees_them(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    settings.GATEWAY_MAX_BODY_BYTES = 2 * 1024 * 1024
    cases = [(case, body, {}, status, phrase) for case, body, status, phrase in HOSTILE] + BINARY_HOSTILE

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            wrong = []
            for case, body, headers, status, phrase in cases:
                if case in ("binary size not the shape's", "huge shape with a binary size",
                            "BYTES too small for its count"):
                    headers = {"Inference-Header-Content-Length": str(body.index(b"}]}") + 3), **headers}
                reply = await call(app, "POST", "/serve/digits-prod/v2/models/digits/infer", body=body,
                                   headers=headers, token=people["alice"].token)
                if reply.status != status or phrase not in reply.json()["error"]:
                    wrong.append((case, reply.status, reply.body[:200]))
            assert wrong == []
            assert upstream.requests == []

    run(scenario)


def binary_request(array: np.ndarray, extra_json: dict[str, Any] | None = None) -> tuple[bytes, dict[str, str]]:
    header = j({"inputs": [{"name": "input", "shape": list(array.shape), "datatype": "FP32",
                            "parameters": {"binary_data_size": array.nbytes}}], **(extra_json or {})})
    return header + array.tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                      "Content-Type": "application/octet-stream"}


def test_good_requests_reach_triton_byte_for_byte(people: dict[str, Person], gateway_app: Any, settings: Any) -> None:
    settings.GATEWAY_MAX_BODY_BYTES = 8 * 1024 * 1024
    settings.GATEWAY_TRANSCODE_JSON = False  # JSON as sent (gateway/tests/test_json_body.py: as binary)
    rows = np.random.default_rng(0).standard_normal((16_000, 64)).astype(np.float32)  # 4 MB: streamed
    big, big_headers = binary_request(rows)
    small, small_headers = binary_request(rows[:2])
    nested = j({"inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32", "data": rows[:2].tolist()}],
                "outputs": [{"name": "label", "parameters": {"binary_data": True}}], "id": "r1",
                "parameters": {"binary_data_output": True}})
    strings = j({"inputs": [{"name": "s", "shape": [2, 1], "datatype": "BYTES", "data": ["a", "b"]}]})
    raw_binary = rows[:1].tobytes()

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            url = "/serve/digits-prod/v2/models/digits/infer"
            sent = [
                (j(OK), {}), (nested, {}), (strings, {}), (small, small_headers), (big, big_headers),
                (raw_binary, {"Inference-Header-Content-Length": "0"}),
                (gzip.compress(j(OK)), {"Content-Encoding": "gzip"}),
                (zlib.compress(small), {**small_headers, "Content-Encoding": "deflate"}),
            ]
            for body, headers in sent:
                chunks = [body[i:i + 65536] for i in range(0, len(body), 65536)]
                reply = await call(app, "POST", url, body=chunks, token=people["alice"].token,
                                   headers={**headers, "Content-Length": str(len(body))})
                assert reply.status == 200, reply.body[:300]
            got = [r.body for r in upstream.requests]
            assert got == [j(OK), nested, strings, small, big, raw_binary, j(OK), small]
            assert upstream.requests[4].headers[b"content-length"] == str(len(big)).encode()
            assert b"content-encoding" not in upstream.requests[6].headers  # sent plain, as checked

    run(scenario)


def test_a_chunked_request_body_is_read_checked_and_forwarded(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    settings.GATEWAY_TRANSCODE_JSON = False
    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            body = j(OK)
            reply = await call(gateway_app(), "POST", "/serve/digits-prod/v2/models/digits/infer",
                               body=[body[:10], body[10:100], body[100:]], token=people["alice"].token)
            assert reply.status == 200 and upstream.requests[0].body == body

    run(scenario)


def test_a_client_that_disconnects_while_sending_a_large_body_aborts_the_upstream_request(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    settings.GATEWAY_MAX_BODY_BYTES = 8 * 1024 * 1024
    rows = np.zeros((8000, 64), dtype=np.float32)
    body, headers = binary_request(rows)

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            # Two of the body's messages arrive, then the client is gone (call() answers http.disconnect).
            reply = await call(
                app, "POST", "/serve/digits-prod/v2/models/digits/infer", body=[body[:70000], body[70000:140000]],
                token=people["alice"].token, headers={**headers, "Content-Length": str(len(body))},
                disconnect="after_body")
            assert reply.status == 0  # nobody to answer
            await until(lambda: upstream.open_connections == 0, 10, what="the upstream connection to close")
            # The upstream saw half a request on a connection that was then closed: nothing came of it.
            assert upstream.requests == [] and upstream.connections == 1 and upstream.open_connections == 0
            assert app.pool.idle_count() == 0

    run(scenario)


def test_the_depth_check_is_cheap_on_a_million_brackets() -> None:
    started = time.process_time()  # CPU time: the check's own cost, not the waits of a loaded machine
    assert json_too_deep(b"[" * 1_000_000, 64)
    assert json_too_deep(b"[" * 500_000 + b"]" * 500_000, 64)
    assert json_too_deep(b'"' + b'\\"' * 500_000 + b"[" * 100, 64) is False  # all inside one unterminated string
    assert time.process_time() - started < 0.5
    assert not json_too_deep(b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}', 64)
    assert not json_too_deep(b"[" * 64 + b"]" * 64, 64)
    with pytest.raises(Refusal, match="not valid JSON"):
        parse_json_header(b'"' + b'\\"' * 500_000 + b"[" * 100, 64)


def test_the_depth_check_counts_brackets_alike_in_short_and_long_bodies() -> None:
    # Long bodies are counted by numpy ('[' | 0x20 == '{'): no other byte value may count, none may be missed.
    others = bytes(b for b in range(256) if b not in b"[]{}")
    for filler in (others, others * 40):  # under and over the length where numpy takes over
        assert _openers(filler + b"[{" * 7) == 14
        assert json_too_deep(filler[:1] + b"[" * 65 + filler + b"]" * 65, 64)
        assert json_too_deep(b'{"a":' * 65 + filler.replace(b'"', b"") + b"1" + b"}" * 65, 64)
        assert not json_too_deep(b"[" * 64 + filler.replace(b'"', b"") + b"]" * 64, 64)
    assert _openers(bytes(range(256)) * 100) == 200


def test_the_bounded_bracket_count_decides_as_the_full_count_does() -> None:
    # _few_openers jumps from bracket to bracket and stops past the limit; past _FIND_OPENERS_MAX it counts them all.
    rng = random.Random(0)
    alphabet = b'[]{}"a1,: \\'
    for limit in (4, 5, 63, 64, 65, _FIND_OPENERS_MAX, _FIND_OPENERS_MAX + 1, 1000):
        for size in (0, 1, 10, 200, 5000):
            for _ in range(20):
                data = bytes(rng.choices(alphabet, k=size))
                assert _few_openers(data, limit) == (_openers(data) <= limit), (limit, data)
        for count in (limit - 1, limit, limit + 1):
            for data in (b"[" * count, b"{" * count, b"[{" * (count // 2) + b"[" * (count % 2),
                         b"x" * 5000 + b"[" * count + b"x" * 5000):
                assert _few_openers(data, limit) == (count <= limit), (limit, count)


def test_a_body_with_no_backslash_gets_the_depth_steps_the_regex_gives() -> None:
    # Nested tensor data ([[[...]]], as tolist() writes it) has more brackets than the limit, so the depth check
    # walks them: without a backslash every quote opens or closes a string, and numpy finds the same steps.
    rng = random.Random(3)
    for alphabet in (b'[]{}"a1,: ', b'[[[]]]{}"', b'[]"', b'[{]}"Y_y\x7f ', b"[]{}Yy_ ", b'[["""]'):
        for size in (4096, 5000, 16000, 40000):  # the larger ones past the bracket positions' bound
            for _ in range(30):
                data = bytes(rng.choices(alphabet, k=size))
                assert _depth_steps(data).tobytes() == reference.depth_steps(data), data[:200]
                for limit in (0, 3, 64):
                    assert json_too_deep(data, limit) == reference.too_deep(data, limit)
    nested = json.dumps({"inputs": [{"name": "x[", "shape": [1, 3, 64, 64], "datatype": "FP32",
                                     "data": np.zeros((1, 3, 64, 64)).tolist()}]}).encode()
    assert not json_too_deep(nested, 64) and json_too_deep(nested, 4)
    assert json_too_deep(b"[" * 65 + nested + b"]" * 65, 64)
    # Past the bounds the bytes outside strings, or the quotes' running parity, stand in for positions.
    crowded = b"y" * (_MAX_BRACKET_POSITIONS + 1)
    for data in (b"[" * 65 + crowded + b"]" * 65, b"[" * 64 + crowded + b"]" * 64,
                 b'"[' * (_MAX_BRACKET_POSITIONS + 1) + b"[" * 65 + b'"' + b"]" * 65):
        assert _depth_steps(data).tobytes() == reference.depth_steps(data)
        assert json_too_deep(data, 64) == reference.too_deep(data, 64)
    for quotes in (_MAX_QUOTE_POSITIONS, _MAX_QUOTE_POSITIONS + 1, _MAX_QUOTE_POSITIONS + 2):
        strings = b'"a' * quotes + b"[" * 65 + b'"' + b"]" * 65
        for data in (strings, b"[" * 65 + strings + b"]" * 65, b"[" * 64 + b'""' * quotes + b"]" * 64):
            assert _depth_steps(data).tobytes() == reference.depth_steps(data)
            assert json_too_deep(data, 64) == reference.too_deep(data, 64)


def _random_json(rng: random.Random, depth: int) -> Any:
    """A JSON value nested `depth` deep somewhere, with strings full of what escapes and brackets can be."""
    def text() -> str:
        return "".join(rng.choice('ab[]{}"\\\n\t/') for _ in range(rng.randint(0, 12)))
    value: Any = [text(), rng.random()]
    for level in range(depth - 1):
        siblings = [text() for _ in range(rng.randint(0, 3))]
        value = {text(): value, "k": siblings} if level % 2 else [*siblings, value, text()]
    return value


def test_json_with_escapes_gets_the_depth_the_regex_gives() -> None:
    # In JSON a backslash stands only inside a string: with escaped backslashes and quotes taken out, every quote
    # left delimits a string, and the answer is the regex's.
    rng = random.Random(5)
    for _ in range(300):
        depth = rng.randint(55, 75)
        document = json.dumps(_random_json(rng, depth)).encode()
        for data in (document + b" " * 4096, b" " * 4096 + document):
            assert json_too_deep(data, 64) == reference.too_deep(data, 64) == (depth > 64), depth
            assert _depth_steps(_without_escapes(data)).tobytes() == reference.depth_steps(data)


def test_a_body_in_utf16_or_utf32_is_not_read_past_the_depth_check() -> None:
    # json.loads guesses UTF-16 and UTF-32 from bytes; the depth check reads bytes as UTF-8, where U+0122 in
    # UTF-16 (22 01) is a quote, so the brackets after it looked like a string's.
    text = ('{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}],"id":"\u0122","z":'
            + "[" * 500 + "]" * 500 + ',"id2":"\u0122"}')
    for encoding in ("utf-16-le", "utf-16", "utf-32-le", "utf-32"):
        with pytest.raises(Refusal, match="not valid JSON"):
            parse_json_header(text.encode(encoding), 64)
        with pytest.raises(Refusal):
            check_json(text.encode(encoding), None, 64, 2**30, True)
    with pytest.raises(Refusal, match="nests deeper than 64"):
        parse_json_header(text.encode(), 64)
    # UTF-8 with a byte-order mark (simdjson refuses it, Python's json reads it) still reads as before.
    assert parse_json_header(b"\xef\xbb\xbf" + j(OK), 64) == OK


def test_the_depth_check_is_cheap_on_millions_of_strings() -> None:
    # The regex took a step per string (about 2 us each): a few MB of them held the event loop for seconds.
    started = time.process_time()  # CPU time (0.15-0.2 s here): wall time was 0.44-0.74 s on a loaded machine
    for body in (b"[" * 65 + b'"",' * 2_000_000 + b'"\\"', b"[" * 65 + b'"\\"' * 2_000_000,
                 b'"[' * 2_000_000, b'"\\' * 2_000_000 + b"[" * 100):
        json_too_deep(body, 64)
    assert time.process_time() - started < 1.0


def test_the_binary_sizes_must_add_up_and_match_each_shape() -> None:
    two = {"inputs": [
        {"name": "a", "shape": [2], "datatype": "INT64", "parameters": {"binary_data_size": 16}},
        {"name": "b", "shape": [3], "datatype": "UINT8", "parameters": {"binary_data_size": 3}},
        {"name": "c", "shape": [1], "datatype": "BOOL", "data": [True]},
    ]}
    check_infer_request(two, 19, 1024)
    with pytest.raises(Refusal, match="add up to 19 bytes, but 20"):
        check_infer_request(two, 20, 1024)
    with pytest.raises(Refusal) as refused:
        check_infer_request(two, 19, 15)
    assert refused.value.status == 413 and "input 'a'" in refused.value.message
    strings = {"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES",
                           "parameters": {"binary_data_size": 4 + 3 + 4 + 5}}]}
    check_infer_request(strings, 16, 1024)
    check_infer_request({"inputs": [{"name": "x", "shape": [0, 64], "datatype": "FP32", "data": []}]}, None, 10)


# Triton 2.51's real answers (measured with the digits deployment; tests/test_gateway_e2e.py checks them live).
TRITON_ANSWERS = [
    (500, "failed to parse the request JSON buffer: Invalid value. at 12", 400),
    (500, "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'", 400),
    (500, "Unable to parse 'data': Shape does not match true shape of 'data' field", 400),
    (500, "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer", 400),
    (500, "failed to get request params.: attempt to get members for non-object", 400),
    # Found by tests/test_nasty_inputs.py: an output's "classification": -1.
    (500, "Unable to set 'classification': attempt to access JSON non-unsigned-integer as unsigned-integer", 400),
    (500, "Internal: the model crashed", 500),  # a real fault stays a 5xx
    (400, "unexpected inference input 'nope' for model 'digits'", 400),
]


@pytest.mark.parametrize(("status", "message", "expected"), TRITON_ANSWERS)
def test_tritons_parse_failures_become_400_with_its_message(status: int, message: str, expected: int) -> None:
    better = client_error(status, j({"error": message}))
    got_status, got_body = better if better is not None else (status, j({"error": message}))
    assert got_status == expected and json.loads(got_body) == {"error": message}


def test_the_internal_raw_input_name_is_reworded() -> None:
    message = ("[request id: <id_unknown>] input byte size mismatch for input 'raw_input' for model 'digits'. "
               "Expected 256, got 10")
    better = client_error(400, j({"error": message}))
    assert better is not None and better[0] == 400
    text = json.loads(better[1])["error"]
    assert "raw_input" not in text
    assert "the raw binary request body (Inference-Header-Content-Length: 0)" in text and "Expected 256" in text


def test_tritons_500_for_a_client_mistake_reaches_the_client_as_400(people: dict[str, Person],
                                                                    gateway_app: Any) -> None:
    """Here the upstream answers as Triton did to requests the gateway's own checks let through."""
    def answer(request: Request) -> bytes:
        if b"parse" in request.body:
            return json_response({"error": "Unable to parse 'data': attempt to access JSON non-number as double"}, 500)
        if b"raw" in request.body:
            return json_response({"error": "input byte size mismatch for input 'raw_input' for model 'digits'"}, 400)
        if b"crash" in request.body:
            return json_response({"error": "Internal: model crashed"}, 500)
        return echo(request)

    async def scenario() -> None:
        async with FakeUpstream(answer) as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            url = "/serve/digits-prod/v2/models/digits/infer"
            parse = await call(app, "POST", url, body=j({**OK, "id": "parse"}), token=people["alice"].token)
            assert parse.status == 400 and "Unable to parse 'data'" in parse.json()["error"]
            # Strings for FP32, which Triton answered so, are the gateway's own 400 now, and never reach it.
            strings = await call(app, "POST", url, body=with_input(data=["0.5"] * 64), token=people["alice"].token)
            assert strings.status == 400 and strings.json() == {"error": (
                "Input 'input' is FP32: its 'data' must be JSON numbers, but data[0] is the string \"0.5\" (send 0.5 "
                "as a number, without quotes).")}
            raw = await call(app, "POST", url, body=b"raw bytes", token=people["alice"].token,
                             headers={"Inference-Header-Content-Length": "0"})
            assert raw.status == 400 and "raw_input" not in raw.json()["error"]
            crash = await call(app, "POST", url, body=j({**OK, "id": "crash"}), token=people["alice"].token)
            # A model's fault stays a 500, in words that show nothing of the model's internals.
            assert crash.status == 500 and "model crashed" not in crash.json()["error"]
            assert "the fault is in the model" in crash.json()["error"]
            assert len(upstream.requests) == 3

    run(scenario)


def test_a_big_json_request_is_parsed_off_the_event_loop_and_still_checked(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    settings.GATEWAY_MAX_BODY_BYTES = 8 * 1024 * 1024
    good = with_input(shape=[2_000, 64], data=[0.5] * (2_000 * 64))
    bad = with_input(shape=[2_000, 64], data=[0.5] * (2_000 * 64 - 1))
    assert len(good) > 256 * 1024

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            url = "/serve/digits-prod/v2/models/digits/infer"
            ok = await call(app, "POST", url, body=good, token=people["alice"].token)
            refused = await call(app, "POST", url, body=bad, token=people["alice"].token)
            assert (ok.status, refused.status) == (200, 400) and len(upstream.requests) == 1

    run(scenario)


def test_struct_is_what_tritonclient_sends_for_bytes() -> None:
    # A BYTES element in binary form is a 4-byte little-endian length and its bytes: the minimum is 4 per element.
    element = struct.pack("<I", 3) + b"abc"
    check_infer_request({"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(element)}}]}, len(element), 1024)
