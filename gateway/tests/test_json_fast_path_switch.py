"""GATEWAY_JSON_FAST_PATH (docs/configuration.md): off, the gateway checks JSON requests with the plain reference
(gateway/fastpath/reference.py: a regex depth check, json.loads, the body forwarded as sent) instead of the fast path
(gateway/fastpath/: numpy depth check, simdjson, transcoding), and every request gets the same answer either way."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import numpy as np

from gateway.tests.fake_upstream import FakeUpstream, Request, json_response
from gateway.tests.infer_bodies import BINARY_HEADER, BINARY_HOSTILE, HOSTILE, OK, j
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person

URL = "/serve/digits-prod/v2/models/digits/infer"
ANSWER = {"model_name": "digits", "model_version": "1",
          "outputs": [{"name": "label", "datatype": "INT64", "shape": [1, 1], "data": [3]},
                      {"name": "probabilities", "datatype": "FP32", "shape": [1, 10], "data": [0.1] * 10}]}
ROWS = np.random.default_rng(7).standard_normal((2, 64)).astype(np.float32)
FP32 = j({"inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32", "data": ROWS.tolist()}],
          "outputs": [{"name": "label"}], "id": "r1"})
PASSING: list[tuple[str, bytes, dict[str, str]]] = [
    ("FP32 data (transcoded by the fast path)", j(OK), {}),
    ("nested FP32 data with an id and outputs", FP32, {}),
    ("INT64 data", j({"inputs": [{"name": "n", "shape": [3], "datatype": "INT64", "data": [1, -2, 2**62]}]}), {}),
    ("FP64 data", j({"inputs": [{"name": "d", "shape": [2], "datatype": "FP64", "data": [0.1, 1e300]}]}), {}),
    ("BYTES data", j({"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES", "data": ["a", "[{"]}]}), {}),
    ("NaN, which only Python's json reads", b'{"inputs": [{"name": "n", "shape": [1], "datatype": "FP32", '
                                            b'"data": [NaN]}]}', {}),
    ("a byte-order mark", b"\xef\xbb\xbf" + j(OK), {}),
    ("gzip", gzip.compress(j(OK)), {"Content-Encoding": "gzip"}),
    ("JSON over 512 KB, checked in a parser process",
     j({"inputs": [{"name": "input", "shape": [1, 40_000], "datatype": "FP32",
                    "data": np.random.default_rng(8).standard_normal(40_000).astype(np.float32).tolist()}]}), {}),
    ("a binary request", BINARY_HEADER + ROWS[:1].tobytes(),
     {"Inference-Header-Content-Length": str(len(BINARY_HEADER)), "Content-Type": "application/octet-stream"}),
]
REFUSED: list[tuple[str, bytes, dict[str, str]]] = [
    ("a key given twice", b'{"inputs": [{"name": "a", "name": "b", "shape": [1], "datatype": "FP32", '
                          b'"data": [1]}]}', {}),
    ("a string in FP32 data", j({"inputs": [{"name": "input", "shape": [2], "datatype": "FP32",
                                             "data": [1.0, "2"]}]}), {}),
    ("UTF-16", j(OK).decode().encode("utf-16"), {}),
    ("deep inside a string, then deep", b'{"a": "' + b"[" * 100 + b'", "b": ' + b"[" * 65 + b"]" * 65 + b"}", {}),
    ("unbalanced", b'{"inputs": [' + b"[" * 70, {}),
]
# The hostile corpus (gateway/tests/infer_bodies.py), with the header lengths test_infer_body.py gives three of them.
HOSTILE_CASES: list[tuple[str, bytes, dict[str, str]]] = [(case, body, {}) for case, body, _, _ in HOSTILE] + [
    (case, body, {"Inference-Header-Content-Length": str(body.index(b"}]}") + 3), **headers}
     if case in ("binary size not the shape's", "huge shape with a binary size", "BYTES too small for its count")
     else headers)
    for case, body, headers, _, _ in BINARY_HOSTILE]
CASES = PASSING + REFUSED + HOSTILE_CASES


def answer(request: Request) -> bytes:
    return json_response(ANSWER)


Reply = tuple[int, bytes, bytes | None]  # status, body, content type


def replies(people: dict[str, Person], gateway_app: Any, settings: Any) -> dict[bool, tuple[list[Reply], list[bytes]]]:
    """For the switch on and off: (status, body, content type) of each of CASES, and the bodies Triton got."""
    settings.GATEWAY_MAX_BODY_BYTES = 2 * 1024 * 1024
    found: dict[bool, tuple[list[Reply], list[bytes]]] = {}

    async def scenario() -> None:
        async with FakeUpstream(answer) as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            for fast in (True, False):
                settings.GATEWAY_JSON_FAST_PATH = fast
                app = gateway_app()  # reads the settings
                got: list[Reply] = []
                for _, body, headers in CASES:
                    reply = await call(app, "POST", URL, body=body, headers=headers, token=people["alice"].token)
                    got.append((reply.status, reply.body, reply.headers.get(b"content-type")))
                found[fast] = got, [r.body for r in upstream.requests]
                upstream.requests.clear()

    run(scenario)
    return found


def test_the_reference_path_gives_the_fast_paths_answers(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    found = replies(people, gateway_app, settings)
    (fast, fast_forwarded), (plain, plain_forwarded) = found[True], found[False]
    assert [(case, *reply) for (case, _, _), reply in zip(CASES, plain, strict=True)] == \
        [(case, *reply) for (case, _, _), reply in zip(CASES, fast, strict=True)]
    statuses = [status for status, _, _ in fast]
    assert statuses[:len(PASSING)] == [200] * len(PASSING)
    assert all(status >= 400 for status in statuses[len(PASSING):])
    assert json.loads(plain[0][1]) == ANSWER
    # Off, every body reaches Triton as it was sent (gzip as inflated); on, FP32 and INT64 JSON went as binary.
    sent = [gzip.decompress(body) if headers.get("Content-Encoding") == "gzip" else body
            for _, body, headers in PASSING]
    assert plain_forwarded == sent
    transcoded = [case for (case, _, _), body, as_sent in zip(PASSING, fast_forwarded, sent, strict=True)
                  if body != as_sent]
    assert transcoded == ["FP32 data (transcoded by the fast path)", "nested FP32 data with an id and outputs",
                          "INT64 data", "gzip", "JSON over 512 KB, checked in a parser process"]
