"""The JSON fast path (gateway/fastpath/json_body.py): the checks and messages of gateway/protocol.py on simdjson's
tape (the same as its plain reference's, gateway/fastpath/reference.py), and FP32 tensors sent on in the binary
tensor extension with the values Triton would have read from the text (on a real Triton:
tests/test_json_answer_identity.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from gateway.fastpath import json_body, reference
from gateway.fastpath.json_body import Checked, check_json
from gateway.protocol import Refusal
from gateway.tests.fake_upstream import FakeUpstream
from gateway.tests.infer_bodies import HOSTILE, OK, j
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person

LIMIT = 256 * 1024**2


def check(body: bytes, binary: int | None = None) -> Checked:
    return check_json(body, binary, 64, LIMIT, transcode=True)


def split(checked: Checked) -> tuple[dict[str, Any], bytes]:
    assert checked.body is not None
    return json.loads(checked.body[:checked.header_length]), checked.body[checked.header_length:]


def old_refusal(body: bytes) -> tuple[int, str]:
    """The refusal of the plain path (gateway/fastpath/reference.py: json.loads, nothing transcoded)."""
    with pytest.raises(Refusal) as raised:
        reference.check_json(body, None, 64, LIMIT)
    return raised.value.status, raised.value.message


@pytest.mark.parametrize(("case", "body"), [(case, body) for case, body, _, _ in HOSTILE if body])
def test_every_hostile_json_gets_the_same_refusal_as_before(case: str, body: bytes) -> None:
    expected = old_refusal(body)
    with pytest.raises(Refusal) as raised:
        check(body)
    assert (raised.value.status, raised.value.message) == expected


def test_an_fp32_request_goes_on_as_binary_with_the_values_triton_reads() -> None:
    values = [0.1, -2.5, 1e-45, 3.4028235e38, 1e300, -1e300, 7, -0.0, 2**60, 18446744073709551615]
    body = j({"id": "r1", "parameters": {"priority": 1},
              "inputs": [{"name": "input", "shape": [2, 5], "datatype": "FP32", "data": [values[:5], values[5:]],
                          "parameters": {"x": "y"}}],
              "outputs": [{"name": "label"}]})
    header, tensors = split(check(body))
    assert header == {"id": "r1", "parameters": {"priority": 1},
                      "inputs": [{"name": "input", "shape": [2, 5], "datatype": "FP32",
                                  "parameters": {"x": "y", "binary_data_size": 40}}],
                      "outputs": [{"name": "label"}]}
    # Triton reads each number as a double and casts it to float: numpy's cast of Python's float is that.
    with np.errstate(over="ignore"):
        expected = np.array([float(v) for v in values], dtype=np.float64).astype("<f4")
    assert tensors == expected.tobytes()
    assert np.isinf(np.frombuffer(tensors, "<f4")[4])


def test_fp32_and_integers_are_sent_as_binary_and_fp64_and_the_other_inputs_stay_json() -> None:
    """Triton's JSON parser is not correctly rounded (0.99999999999999994 is 1.0 to it): doubles parsed here would
    not be the ones it reads, so FP64 is Triton's to read from the text. Integers it reads exactly."""
    body = j({"inputs": [
        {"name": "d", "shape": [3], "datatype": "FP64", "data": [0.1, 1, -3.25]},
        {"name": "s", "shape": [2], "datatype": "BYTES", "data": ["a", "β"]},
        {"name": "i", "shape": [2], "datatype": "INT64", "data": [1, 2]},
        {"name": "h", "shape": [1], "datatype": "FP16", "data": [0.5]},
        {"name": "f", "shape": [2], "datatype": "FP32", "data": [0.5, 2]},
        {"name": "t", "shape": [1], "datatype": "BOOL", "data": [True]},
    ]})
    header, tensors = split(check(body))
    # (Booleans as FP32, once left here as JSON for Triton, are the gateway's 400 now: the test of no-number data.)
    assert [t.get("data") for t in header["inputs"]] == [[0.1, 1, -3.25], ["a", "β"], None, [0.5], None, [True]]
    assert header["inputs"][2]["parameters"] == {"binary_data_size": 16}
    assert header["inputs"][4]["parameters"] == {"binary_data_size": 8}
    assert tensors == np.array([1, 2], dtype="<i8").tobytes() + np.array([0.5, 2], dtype="<f4").tobytes()
    assert check(j({"inputs": [{"name": "d", "shape": [1], "datatype": "FP64", "data": [0.5]}]})) == Checked()


@pytest.mark.parametrize("datatype", ["INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"])
def test_integers_within_their_range_go_as_binary_and_the_rest_is_left_to_triton(datatype: str) -> None:
    """What Triton reads exactly goes as binary: the smallest and largest value of the type, nested evenly. A number
    out of range, a fraction or an exponent stays JSON, for Triton's own checks and messages; what is no number at
    all is refused here (test_data_that_is_no_number_is_refused_naming_the_input_its_datatype_and_what_is_there)."""
    limits = np.iinfo(np.dtype(datatype.lower()))
    data = [[int(limits.min), 0], [1, int(limits.max)]]
    header, tensors = split(check(j({"inputs": [{"name": "x", "shape": [2, 2], "datatype": datatype,
                                                  "data": data}]})))
    assert "data" not in header["inputs"][0]
    assert tensors == np.array(data, dtype=np.dtype(datatype.lower()).newbyteorder("<")).tobytes()
    for bad in (int(limits.max) + 1, int(limits.min) - 1, 1.5):
        body = j({"inputs": [{"name": "x", "shape": [2], "datatype": datatype, "data": [1, bad]}]})
        assert check(body) == Checked(), bad
    for bad in (True, "1"):
        with pytest.raises(Refusal, match=f"Input 'x' is {datatype}: its 'data' must be JSON numbers"):
            check(j({"inputs": [{"name": "x", "shape": [2], "datatype": datatype, "data": [1, bad]}]}))
    assert check(b'{"inputs": [{"name": "x", "shape": [2], "datatype": "%s", "data": [1, 1e1]}]}'
                 % datatype.encode()) == Checked()


def _midpoint(low: float) -> float:
    below = np.float32(low)
    return (float(below) + float(np.nextafter(below, np.float32(np.inf)))) / 2


@pytest.mark.parametrize("value", [
    _midpoint(0.1),  # a tie between two floats
    np.nextafter(_midpoint(0.1), 1.0) + 2.0**-70,  # a hair above one
    -_midpoint(3e5),
    float(np.finfo(np.float32).max) + 2.0**103,  # where rounding goes to inf
    1.5 * 2.0**-149,  # between two float32 subnormals
])
def test_fp32_next_to_a_rounding_boundary_is_left_to_triton(value: float) -> None:
    """Where Triton's inexact reading of the number could fall on the other side of the boundary."""
    body = j({"inputs": [{"name": "f", "shape": [3], "datatype": "FP32", "data": [0.25, value, 1]}]})
    assert check(body) == Checked()


def _fp32_before(doubles: Any) -> bytes | None:
    """json_body._fp32 as it was before its comparisons became min() and max() (the reference for the next test)."""
    bits = doubles.view(np.uint64)
    work = np.add(bits, json_body._NEAR_SHIFT)
    np.bitwise_and(work, json_body._LOW_29_BITS, out=work)
    if (work <= json_body._NEAR_SPAN).any():
        return None
    np.bitwise_and(bits, json_body._MAGNITUDE_BITS, out=work)
    np.subtract(work, json_body._ONE, out=work)
    if (work < json_body._FLT_MIN_NORMAL_BITS - json_body._ONE).any():
        tiny = (np.abs(doubles) < json_body._FLT_MIN_NORMAL) & (doubles != 0)
        if json_body._near_boundary(doubles[tiny]).any():
            return None
    with np.errstate(over="ignore"):
        return doubles.astype(np.float32).tobytes()


def test_the_fp32_boundary_check_decides_as_before_on_every_kind_of_double() -> None:
    rng = np.random.default_rng(23)
    floats = rng.standard_normal(64).astype(np.float32)
    midpoints = [_midpoint(float(f)) for f in floats]
    pool = np.concatenate([
        rng.standard_normal(2000),  # what clients send, as doubles
        floats.astype(np.float64),  # float32 values written out
        np.ldexp(rng.uniform(-1, 1, 2000), rng.integers(-1074, 1024, 2000)),  # every exponent
        midpoints, np.nextafter(midpoints, np.inf), np.nextafter(midpoints, -np.inf),
        [m + s * 2.0**-40 * abs(m) for m in midpoints for s in (1, -1)],  # further from them
        [0.0, -0.0, 2.0**-149, 1.5 * 2.0**-149, 2.0**-126, -2.0**-130, float(np.finfo(np.float32).max),
         float(np.finfo(np.float32).max) + 2.0**103, 1e300, -1e300],
    ])
    decisions = set()
    for size in (1, 2, 3, 8):
        for _ in range(3000 // size):
            doubles = rng.choice(pool, size)
            expected = _fp32_before(doubles)
            assert json_body._fp32(doubles) == expected, doubles
            decisions.add(expected is None)
    assert decisions == {True, False}  # both kinds were met


def test_fp32_values_written_out_are_never_near_a_boundary() -> None:
    values = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    header, tensors = split(check(j({"inputs": [{"name": "f", "shape": [4096], "datatype": "FP32",
                                                   "data": values.tolist()}]})))
    assert tensors == values.tobytes()


@pytest.mark.parametrize("body", [
    j({"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}),  # nothing to transcode
    j({"inputs": [{"name": "e", "shape": [0, 4], "datatype": "FP32", "data": []}]}),  # no element
    j({"inputs": [{"name": "p", "shape": [1], "datatype": "FP32", "data": [1.0], "parameters": None}]}),
    b'{"inputs": [{"name": "n", "shape": [2], "datatype": "FP32", "data": [NaN, Infinity]}]}',  # not strict JSON
    j({"inputs": [{"name": "big", "shape": [1], "datatype": "FP32", "data": [10**40]}]}),  # over 64 bits
    b"\xef\xbb\xbf" + j(OK),  # a byte-order mark: Python's json refuses it
    # Nested unevenly: counted by first items (2 elements), flattened to 1 or 3 doubles: Triton judges the JSON.
    j({"inputs": [{"name": "u", "shape": [2], "datatype": "FP32", "data": [1.0, []]}]}),
    j({"inputs": [{"name": "u", "shape": [2], "datatype": "FP32", "data": [1.0, [2.0, 3.0]]}]}),
])
def test_what_only_triton_or_pythons_json_can_judge_goes_on_as_sent(body: bytes) -> None:
    try:
        expected: Any = ("passes", None) if reference.check_json(body, None, 64, LIMIT) == Checked() else "outputs"
    except Refusal as exc:
        expected = (exc.status, exc.message)
    try:
        got: Any = ("passes", None) if check(body) == Checked() else "transcoded"
    except Refusal as exc:
        got = (exc.status, exc.message)
    assert got == expected


NOT_A_NUMBER = "Input 'input' is {datatype}: its 'data' must be JSON numbers, but {where} is {found}."


@pytest.mark.parametrize(("data", "where", "found"), [
    (["0.5", 1.0], "data[0]", 'the string "0.5" (send 0.5 as a number, without quotes)'),
    ([1, " -2e3 "], "data[1]", 'the string " -2e3 " (send -2e3 as a number, without quotes)'),
    ([1.0, "abc"], "data[1]", 'the string "abc"'),
    ([1.0, "NaN"], "data[1]", 'the string "NaN"'),  # not a JSON number: no advice to send it as one
    ([None, 1.0], "data[0]", "null"),
    ([1.0, True], "data[1]", "true"),
    ([[1.0, 2.0], [3.0, {"v": 4}]], "data[1][1]", "an object"),
    ([[1.0, "x"], ["y", 4.0]], "data[0][1]", 'the string "x"'),  # the first in row-major order
    ([1.0, "x" * 100], "data[1]", 'the string "' + "x" * 56 + "..."),  # quoted back in part
])
@pytest.mark.parametrize("datatype", ["FP32", "FP64", "FP16", "BF16", "INT64", "UINT8"])
def test_data_that_is_no_number_is_refused_naming_the_input_its_datatype_and_what_is_there(
        datatype: str, data: list[Any], where: str, found: str) -> None:
    """Triton refused these with a 500 in its own words ("Unable to parse 'data': attempt to access JSON non-number
    as double"), naming neither the input nor what it found (issue 31). Whether the gateway transcodes or not, the
    request is JSON-only or carries binary inputs beside, or only Python's json reads it (a NaN elsewhere)."""
    shape = [2] if not isinstance(data[0], list) else [2, 2]
    tensor = {"name": "input", "shape": shape, "datatype": datatype, "data": data}
    binary = {"name": "b", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}
    nan = {"name": "n", "shape": [1], "datatype": "FP64", "data": [float("nan")]}
    expected = NOT_A_NUMBER.format(datatype=datatype, where=where, found=found)
    for body, binary_length, transcode in [
            (j({"inputs": [tensor]}), None, True), (j({"inputs": [tensor]}), None, False),
            (j({"inputs": [binary, tensor]}), 4, True), (json.dumps({"inputs": [nan, tensor]}).encode(), None, True)]:
        with pytest.raises(Refusal) as raised:
            check_json(body, binary_length, 64, LIMIT, transcode=transcode)
        assert (raised.value.status, raised.value.message) == (400, expected), (body, binary_length, transcode)


def test_bytes_and_bool_data_are_left_to_triton_and_numbers_pass_as_before() -> None:
    assert check(j({"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES", "data": [1, "a"]}]})) == Checked()
    assert check(j({"inputs": [{"name": "b", "shape": [2], "datatype": "BOOL", "data": [1, "a"]}]})) == Checked()
    assert check(j({"inputs": [{"name": "d", "shape": [2], "datatype": "FP64", "data": [1, -2.5e-3]}]})) == Checked()
    assert check_json(j(OK), None, 64, LIMIT, transcode=False) == Checked()


def test_a_mixed_request_is_checked_and_sent_as_it_came() -> None:
    header = j({"inputs": [{"name": "a", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
                           {"name": "b", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}]})
    assert check(header, binary=8) == Checked()
    with pytest.raises(Refusal, match="add up to 8 bytes, but 4 bytes"):
        check(header, binary=4)


@pytest.mark.parametrize("body", [
    b'{"inputs": [{"name": "x", "shape": [1099511627776, 64], "datatype": "FP32", "data": [1]}], "inputs": []}',
    b'{"inputs": [{"name": "x", "shape": [1], "shape": [1099511627776], "datatype": "FP32", "data": [1]}]}',
    # Nested objects too: Triton reads the first 'parameters' (a shared-memory output the gateway never saw), and
    # the first binary_data_size where the gateway checked the last.
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], "outputs": [{"name": "y", '
    b'"parameters": {"shared_memory_region": "r"}, "parameters": {}}]}',
    b'{"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", '
    b'"parameters": {"binary_data_size": 1099511627776, "binary_data_size": 16}}]}',
    b'{"parameters": {"a": {"b": [{"c": 1, "c": 2}]}}, '
    b'"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}',
    # The same through the old path (a number simdjson does not hold sends it there).
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1e999999]}], "inputs": []}',
])
def test_a_key_given_twice_is_refused_since_triton_reads_the_first(body: bytes) -> None:
    with pytest.raises(Refusal, match="twice in one object") as raised:
        check(body)
    assert raised.value.status == 400
    repeated = {"binary_data_size", "parameters", "inputs", "shape", "c"}
    assert any(f"the key {key!r} twice" in raised.value.message for key in repeated), raised.value.message


def test_keys_inside_data_are_left_to_triton_and_a_key_once_per_object_passes() -> None:
    # The same key in two sibling objects is no duplicate.
    check(b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1], "parameters": {"a": 1}}], '
          b'"outputs": [{"name": "y", "parameters": {"a": 1}}, {"name": "z", "parameters": {"a": 1}}]}')
    # An input's data is never walked (its leaves are counted, not read): an object there is Triton's to refuse.
    assert check(b'{"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": [{"a": 1, "a": 2}]}]}') \
        == Checked(outputs=None)


def test_evenly_nested_data_is_counted_without_reading_its_numbers() -> None:
    image = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    _, tensors = split(check(j({"inputs": [{"name": "i", "shape": [2, 3, 4, 5], "datatype": "FP32",
                                            "data": image.tolist()}]})))
    assert tensors == image.tobytes()
    short = image.tolist()
    short[1][2][3].pop()
    with pytest.raises(Refusal, match="has 119 elements"):
        check(j({"inputs": [{"name": "i", "shape": [2, 3, 4, 5], "datatype": "FP32", "data": short}]}))


def test_a_refusal_that_keeps_its_document_alive_does_not_change_the_next_request() -> None:
    # The parser is reused from request to request; a refused request's traceback keeps objects of its document
    # (the input's data on the tape) while the next one is parsed.
    short = j({"inputs": [{"name": "i", "shape": [4], "datatype": "FP32", "data": [1.5, 2.5, 3.5]}]})
    with pytest.raises(Refusal, match="has 3 elements") as kept:
        check(short)
    for values in ([0.25, -4.0], [8.0, 16.5]):
        _, tensors = split(check(j({"inputs": [{"name": "i", "shape": [2], "datatype": "FP32", "data": values}]})))
        assert tensors == np.array(values, "<f4").tobytes()
    documents = [tb.tb_frame.f_locals["document"] for tb in _tracebacks(kept.value.__traceback__)
                 if tb.tb_frame.f_code is check_json.__code__]
    assert documents, "the refusal's traceback no longer holds its document: nothing is tested here"
    # What the refused request's objects read is still its own document, not the next one's.
    assert documents[0]["inputs"][0]["data"].as_list() == [1.5, 2.5, 3.5]
    # Larger than the reused parser's bound: a parser of its own, the same checks.
    big = np.linspace(-1, 1, 200_000, dtype=np.float32)
    _, tensors = split(check(j({"inputs": [{"name": "i", "shape": [200_000], "datatype": "FP32",
                                            "data": big.tolist()}]})))
    assert tensors == big.tobytes()


def _tracebacks(tb: Any) -> list[Any]:
    out = []
    while tb is not None:
        out.append(tb)
        tb = tb.tb_next
    return out


def test_the_gateway_forwards_the_binary_form_with_its_header_length(
    people: dict[str, Person], gateway_app: Any
) -> None:
    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, people["alice"], "digits-prod", upstream.url)
            reply = await call(gateway_app(), "POST", "/serve/digits-prod/v2/models/digits/infer", body=j(OK),
                               token=people["alice"].token, headers={"Content-Type": "application/json"})
            assert reply.status == 200
            sent = upstream.requests[0]
            length = int(sent.headers[b"inference-header-content-length"])
            assert sent.headers[b"content-type"] == b"application/octet-stream"
            assert json.loads(sent.body[:length])["inputs"][0]["parameters"] == {"binary_data_size": 256}
            assert sent.body[length:] == bytes(256)

    run(scenario)
