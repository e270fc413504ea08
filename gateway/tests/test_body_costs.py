"""What an inference request's body may cost the gateway (issue 30, gateway/bodies.py): a compressed bomb is refused
after inflating about what its ratio allows, never the whole of it; JSON has its own cap, refused before reading
where the headers give the size, with a 413 that says how to send large tensors; JSON for a shared pool's Triton
arrives as binary or small; a NUL in a tensor name is a 400; element counts past simdjson's 24-bit array length are
counted right. The real gateway against a scripted upstream; the running web process under bombs is
tests/test_body_bombs.py."""

from __future__ import annotations

import asyncio
import json
import os
import zlib
from typing import Any

import numpy as np
import pytest
from asgiref.sync import sync_to_async

from gateway import bodies
from gateway.fastpath.json_body import check_json
from gateway.protocol import Refusal
from gateway.tests.fake_upstream import FakeUpstream
from gateway.tests.infer_bodies import OK, j
from gateway.tests.pool_support import shared_deployment
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person

URL = "/serve/digits-prod/v2/models/digits/infer"


def int8_zeros(count: int) -> bytes:
    """The attacker's body: `count` INT8 zeros in JSON, `0,0,0,...` (2 bytes a number, ~14 bytes each to parse)."""
    return (b'{"inputs": [{"name": "input", "shape": [%d], "datatype": "INT8", "data": [' % count
            + b"0," * (count - 1) + b"0]}]}")


def deflate(body: bytes) -> bytes:
    return zlib.compress(body, 9)


class Inflating(bodies.Inflater):
    """An Inflater that records how much it was fed before it refused, and the most it could have inflated."""

    fed_when_refused = 0
    most = 0

    def feed(self, chunk: bytes) -> None:
        Inflating.most = max(Inflating.most, self.size + self.room() + 1)  # zlib's max_length
        try:
            super().feed(chunk)
        except Refusal:
            Inflating.fed_when_refused = self.fed
            raise


def test_a_deflate_bomb_is_refused_early_with_a_413_that_says_how_to_send_large_tensors(
        people: dict[str, Person], gateway_app: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """64 MB of INT8 zeros in 64 KB: refused once its output outgrows 32 times what arrived, after inflating at
    most 1 MB, not 64 (before: inflated whole, on the event loop, then parsed)."""
    bomb = deflate(int8_zeros(32 * 1024**2))
    assert len(bomb) < 100_000
    monkeypatch.setattr(bodies, "Inflater", Inflating)

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            chunks = [bomb[i:i + 16384] for i in range(0, len(bomb), 16384)]
            reply = await call(app, "POST", URL, body=chunks, token=people["alice"].token,
                               headers={"Content-Encoding": "deflate", "Content-Length": str(len(bomb))})
            assert reply.status == 413, reply.body[:300]
            message = reply.json()["error"]
            assert "inflates to over 32 times" in message and "binary tensor extension" in message
            assert "Inference-Header-Content-Length" in message
            assert upstream.requests == []
            await app.close()

    run(scenario)
    # Refused at its first 16 KB (inflated past 1 MB), having inflated at most 1 MB of its 64.
    assert Inflating.fed_when_refused == 16384 and Inflating.most <= bodies.FREE_INFLATE_BYTES + 1


def test_json_over_its_cap_is_refused_before_it_is_read_and_binary_requests_still_pass(
        people: dict[str, Person], gateway_app: Any, settings: Any) -> None:
    settings.GATEWAY_MAX_JSON_BYTES = 64 * 1024
    settings.GATEWAY_MAX_BODY_BYTES = 8 * 1024**2
    big_json = j({"inputs": [{"name": "input", "shape": [1, 20_000], "datatype": "FP32", "data": [0.5] * 20_000}]})
    rows = np.ones((4096, 64), dtype=np.float32)  # 1 MB of binary data: over the JSON cap, not the body's
    header = j({"inputs": [{"name": "input", "shape": [4096, 64], "datatype": "FP32",
                            "parameters": {"binary_data_size": rows.nbytes}}]})
    binary = header + rows.tobytes()

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            token = people["alice"].token
            declared = await call(app, "POST", URL, body=[big_json[:1000], big_json[1000:]], token=token,
                                  headers={"Content-Length": str(len(big_json))}, disconnect="after_body")
            chunked = await call(app, "POST", URL, body=[big_json[:40_000], big_json[40_000:]], token=token,
                                 headers={"Transfer-Encoding": "chunked"})
            compressed = await call(app, "POST", URL, body=zlib.compress(big_json), token=token,
                                    headers={"Content-Encoding": "deflate"})
            long_header = await call(app, "POST", URL, body=big_json + b"\0" * 8, token=token,
                                     headers={"Inference-Header-Content-Length": str(len(big_json))})
            for reply, size in ((declared, f"is {len(big_json)} bytes"), (chunked, "is over the limit"),
                                (compressed, "is over the limit"), (long_header, f"is {len(big_json)} bytes")):
                assert reply.status == 413, reply.body[:300]
                message = reply.json()["error"]
                assert f"The request's JSON {size}; JSON is limited to 65536 bytes" in message
                assert "GATEWAY_MAX_JSON_BYTES" in message and "binary tensor extension" in message
            ok = await call(app, "POST", URL, body=binary, token=token,
                            headers={"Inference-Header-Content-Length": str(len(header))})
            small = await call(app, "POST", URL, body=j(OK), token=token)
            assert (ok.status, small.status) == (200, 200), ok.body[:300]
            assert [len(r.body) for r in upstream.requests][0] == len(binary)
            await app.close()

    run(scenario)


def test_a_nul_in_an_input_or_output_name_is_a_400_before_triton_cuts_the_name_there(
        people: dict[str, Person], gateway_app: Any) -> None:
    """Triton reads a name up to its first NUL: `input\\u0000anything` was answered as `input` with a 200."""
    named = j({"inputs": [{**OK["inputs"][0], "name": "input\u0000anything"}]})
    output = j({**OK, "outputs": [{"name": "label\u0000x"}]})
    header = j({"inputs": [{"name": "in\u0000put", "shape": [1, 64], "datatype": "FP32",
                            "parameters": {"binary_data_size": 256}}]})

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            for body, headers, phrase in (
                    (named, {}, "The name of inputs[0], 'input\\x00anything', holds a NUL character"),
                    (output, {}, "The name of outputs[0], 'label\\x00x', holds a NUL character"),
                    (header + b"\0" * 256, {"Inference-Header-Content-Length": str(len(header))}, "inputs[0]")):
                reply = await call(app, "POST", URL, body=body, headers=headers, token=people["alice"].token)
                assert reply.status == 400 and phrase in reply.json()["error"], reply.body[:300]
            assert upstream.requests == []
            await app.close()

    run(scenario)


def test_element_counts_past_simdjsons_24_bit_array_length_are_counted_right() -> None:
    """simdjson's len() of an array of 2**24 items or more says 16,777,215: a message named that wrong count, and
    a shape of 16,777,215 passed data of more."""
    count = 2**24 + 1
    body = int8_zeros(count).replace(b'"shape": [%d]' % count, b'"shape": [16777215]')
    with pytest.raises(Refusal) as refused:
        check_json(body, None, 64, 256 * 1024**2, True)
    assert refused.value.status == 400
    assert f"has {count} elements, but its shape [16777215] needs 16777215" in refused.value.message


def test_json_for_a_shared_pool_arrives_as_binary_or_small(
        people: dict[str, Person], gateway_app: Any, settings: Any) -> None:
    """The pool's Triton parses JSON data into a DOM of ~16 bytes a number, for every team of the pool: FP32 and
    integer data goes as binary; what stays text (FP64 here) is capped by GATEWAY_MAX_POOL_JSON_BYTES. A
    dedicated deployment's Triton is its own team's: the same FP64 request goes through to it."""
    settings.GATEWAY_MAX_POOL_JSON_BYTES = 64 * 1024
    fp64 = j({"inputs": [{"name": "x", "shape": [20_000], "datatype": "FP64", "data": [0.1] * 20_000}]})
    int32 = j({"inputs": [{"name": "x", "shape": [20_000], "datatype": "INT32", "data": list(range(20_000))}]})
    assert len(fp64) > 64 * 1024 and len(int32) > 64 * 1024

    async def scenario() -> None:
        async with FakeUpstream() as pool_triton:
            await sync_to_async(shared_deployment)(people["alice"], "mine", pool_triton.url)
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", pool_triton.url)
            app = gateway_app()
            token = people["alice"].token
            url = "/serve/mine/v2/models/digits/infer"
            refused = await call(app, "POST", url, body=fp64, token=token)
            assert refused.status == 413, refused.body[:300]
            message = refused.json()["error"]
            assert f"sends {len(fp64)} bytes of JSON for Triton to parse" in message
            assert "GATEWAY_MAX_POOL_JSON_BYTES" in message and "binary tensor extension" in message
            assert pool_triton.requests == []
            converted = await call(app, "POST", url, body=int32, token=token)
            assert converted.status == 200, converted.body[:300]
            sent = pool_triton.requests[0]
            length = int(sent.headers[b"inference-header-content-length"])
            assert length < 1024 and sent.body[length:] == np.arange(20_000, dtype="<i4").tobytes()
            dedicated = await call(app, "POST", URL, body=fp64, token=token)
            assert dedicated.status == 200 and pool_triton.requests[-1].body == fp64
            await app.close()

    run(scenario)


def test_the_byte_budget_serves_in_order_within_its_capacity() -> None:
    async def scenario() -> list[str]:
        budget = bodies.ByteBudget(10)
        events: list[str] = []

        async def hold(name: str, size: int, seconds: float) -> None:
            async with budget.hold(size):
                events.append(f"{name}+")
                assert budget.used <= budget.capacity
                await asyncio.sleep(seconds)
                events.append(f"{name}-")

        first = asyncio.ensure_future(hold("a", 6, 0.05))
        await asyncio.sleep(0)
        waiting = [asyncio.ensure_future(hold("b", 6, 0.01)), asyncio.ensure_future(hold("c", 2, 0.01)),
                   asyncio.ensure_future(hold("huge", 100, 0.01))]
        cancelled = asyncio.ensure_future(hold("gone", 4, 0.01))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(first, *waiting)
        assert budget.used == 0 and not budget._waiting
        return events

    events = asyncio.run(scenario())
    # c (2 bytes) would fit beside a, but waits its turn behind b: first come, first served.
    assert events[:2] == ["a+", "a-"] and events.index("b+") < events.index("c+") < events.index("huge+")
    assert "gone+" not in events


def test_a_small_compressed_request_still_goes_through_plain(
        people: dict[str, Person], gateway_app: Any) -> None:
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                   "data": [0.0] * 64}]}).encode()

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            reply = await call(app, "POST", URL, body=zlib.compress(body), token=people["alice"].token,
                               headers={"Content-Encoding": "deflate"})
            assert reply.status == 200, reply.body[:300]
            assert b"content-encoding" not in upstream.requests[0].headers
            await app.close()

    run(scenario)


def test_json_over_a_megabyte_is_checked_in_a_parser_process_with_the_same_answers(
        people: dict[str, Person], gateway_app: Any, settings: Any) -> None:
    """simdjson holds the GIL while it parses (0.5 s for 16 MB of zeros here): large JSON is checked in the
    gateway's parser processes, and what they answer (a transcoded body, a refusal in words) is what the event loop
    would have answered."""
    settings.GATEWAY_MAX_BODY_BYTES = 8 * 1024**2
    values = np.arange(300_000, dtype=np.int32)
    good = j({"inputs": [{"name": "input", "shape": [300_000], "datatype": "INT32", "data": values.tolist()}]})
    bad = j({"inputs": [{"name": "input", "shape": [300_001], "datatype": "INT32", "data": values.tolist()}]})
    assert len(good) > 1024 * 1024

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            ok = await call(app, "POST", URL, body=good, token=people["alice"].token)
            refused = await call(app, "POST", URL, body=bad, token=people["alice"].token)
            assert ok.status == 200 and refused.status == 400, refused.body[:300]
            assert "has 300000 elements, but its shape [300001] needs 300001" in refused.json()["error"]
            assert app.parsers._pool is not None  # it went to a process
            sent = upstream.requests[0]
            length = int(sent.headers[b"inference-header-content-length"])
            assert sent.body[length:] == values.astype("<i4").tobytes()
            await app.close()

    run(scenario)


def test_a_parser_process_that_dies_costs_its_request_a_503_and_is_replaced() -> None:
    """Killed for its memory, say: that request gets a 503 that says to retry, and the next one a new process."""
    async def scenario() -> None:
        threads = bodies.inflate_threads()
        parsers = bodies.Parsers(1, threads)
        try:
            with pytest.raises(Refusal) as refused:
                await parsers.run(os._exit, 1)
            assert refused.value.status == 503 and "retry" in refused.value.message
            assert refused.value.headers == {"Retry-After": "1"}
            assert await parsers.run(len, b"abc") == 3
        finally:
            parsers.close()
            threads.shutdown()

    asyncio.run(scenario())


def test_a_generate_request_for_a_shared_pool_is_bounded_as_an_inferences_json_is(
        people: dict[str, Person], gateway_app: Any, settings: Any) -> None:
    """A generate request is JSON the pool's Triton parses whole for every team of the pool: the same bound."""
    settings.GATEWAY_MAX_POOL_JSON_BYTES = 64 * 1024
    body = j({"text_input": "x" * (100 * 1024)})

    async def scenario() -> None:
        async with FakeUpstream() as pool_triton:
            await sync_to_async(shared_deployment)(people["alice"], "mine", pool_triton.url)
            app = gateway_app()
            for endpoint in ("generate", "generate_stream"):
                refused = await call(app, "POST", f"/serve/mine/v2/models/digits/{endpoint}", body=body,
                                     token=people["alice"].token)
                assert refused.status == 413, refused.body[:300]
                assert "GATEWAY_MAX_POOL_JSON_BYTES" in refused.json()["error"]
            assert pool_triton.requests == []

    asyncio.run(scenario())
