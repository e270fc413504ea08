"""The passed checks of binary requests' JSON headers, kept by their bytes (gateway/fastpath/json_body.py's
HeaderChecks): the same header is checked once, anything else (another binary length, another byte, a refusal) as
before."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from gateway.fastpath import json_body
from gateway.fastpath.json_body import CACHED_HEADER_BYTES, Checked, HeaderChecks
from gateway.protocol import Refusal
from gateway.tests.fake_upstream import FakeUpstream
from gateway.tests.infer_bodies import j
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person

LIMIT = 256 * 1024**2
HEADER = j({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                        "parameters": {"binary_data_size": 256}}],
            "outputs": [{"name": "label"}]})


class Counting:
    """check_json, counting its calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = json_body.check_json

        def counted(*args: Any) -> Checked:
            self.calls += 1
            return real(*args)

        monkeypatch.setattr(json_body, "check_json", counted)


def test_a_header_sent_again_is_not_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = Counting(monkeypatch)
    checks = HeaderChecks(64, LIMIT)
    first = checks.check(HEADER, 256)
    again = checks.check(bytes(bytearray(HEADER)), 256)  # equal bytes, another object, as each request brings
    assert first == again == Checked(outputs=("label",))
    assert counting.calls == 1


def test_the_same_header_with_another_binary_length_is_checked_and_refused() -> None:
    checks = HeaderChecks(64, LIMIT)
    checks.check(HEADER, 256)
    for _ in range(2):
        with pytest.raises(Refusal, match="add up to 256 bytes, but 255 bytes") as raised:
            checks.check(HEADER, 255)
        assert raised.value.status == 400


def test_a_refused_header_is_checked_and_refused_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = Counting(monkeypatch)
    checks = HeaderChecks(64, LIMIT)
    huge = j({"inputs": [{"name": "input", "shape": [2**40, 64], "datatype": "FP32",
                          "parameters": {"binary_data_size": 256}}]})
    messages = set()
    for _ in range(3):
        with pytest.raises(Refusal) as raised:
            checks.check(huge, 256)
        messages.add((raised.value.status, raised.value.message))
    assert counting.calls == 3
    assert len(messages) == 1 and checks.passed == {}


def test_the_limits_are_the_gateways_own() -> None:
    strict = HeaderChecks(64, 255)  # a tensor of 256 bytes is over this gateway's limit
    with pytest.raises(Refusal) as raised:
        strict.check(HEADER, 256)
    assert raised.value.status == 413
    shallow = HeaderChecks(2, LIMIT)
    with pytest.raises(Refusal, match="nests deeper than 2 levels"):
        shallow.check(HEADER, 256)


def test_at_most_so_many_headers_are_kept_the_oldest_going_first(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = HeaderChecks(64, LIMIT, max_entries=3)
    headers = [j({"inputs": [{"name": f"in{i}", "shape": [1, 64], "datatype": "FP32",
                              "parameters": {"binary_data_size": 256}}]}) for i in range(5)]
    for header in headers:
        checks.check(header, 256)
    assert list(checks.passed) == [(h, 256) for h in headers[2:]]
    counting = Counting(monkeypatch)
    checks.check(headers[0], 256)  # pushed out: checked anew
    checks.check(headers[4], 256)
    assert counting.calls == 1


def test_a_header_over_the_bound_is_checked_each_time_and_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = Counting(monkeypatch)
    checks = HeaderChecks(64, LIMIT)
    long = j({"id": "x" * CACHED_HEADER_BYTES, "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                                        "parameters": {"binary_data_size": 256}}]})
    assert len(long) > CACHED_HEADER_BYTES
    checks.check(long, 256)
    checks.check(long, 256)
    assert counting.calls == 2 and checks.passed == {}


def test_the_gateway_refuses_a_kept_header_whose_binary_part_does_not_add_up(
    people: dict[str, Person], gateway_app: Any
) -> None:
    array = np.ones((1, 64), dtype=np.float32)
    headers = {"Inference-Header-Content-Length": str(len(HEADER)), "Content-Type": "application/octet-stream"}

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            app = gateway_app()
            url = "/serve/digits-prod/v2/models/digits/infer"
            for _ in range(2):
                reply = await call(app, "POST", url, body=HEADER + array.tobytes(), headers=headers,
                                   token=people["alice"].token)
                assert reply.status == 200, reply.body[:300]
            short = await call(app, "POST", url, body=HEADER + array.tobytes()[:-4], headers=headers,
                               token=people["alice"].token)
            assert short.status == 400
            assert "add up to 256 bytes, but 252 bytes" in short.json()["error"]
            assert [r.body for r in upstream.requests] == [HEADER + array.tobytes()] * 2

    run(scenario)
