"""Inference bodies, friendly and hostile, that the gateway's tests and the end-to-end tests send (a fixture module:
nothing here is collected)."""

from __future__ import annotations

import gzip
import json
from typing import Any

OK = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}


def j(value: Any) -> bytes:
    return json.dumps(value).encode()


def with_input(**changes: Any) -> bytes:
    tensor = {**OK["inputs"][0], **changes}
    return j({"inputs": [{k: v for k, v in tensor.items() if v is not ...}]})


# (name, body, status, a phrase of the message): what the fuzzing run and a careless client sent.
HOSTILE: list[tuple[str, bytes, int, str]] = [
    ("malformed JSON", b'{"inputs": [', 400, "not valid JSON"),
    ("trailing garbage", j(OK) + b"xyz", 400, "not valid JSON"),
    ("null body", b"null", 400, "not null"),
    ("array body", b"[]", 400, "not an array"),
    ("number body", b"3", 400, "not a number"),
    ("string body", b'"x"', 400, "not a string"),
    ("empty body", b"", 400, "empty"),
    ("no inputs", b"{}", 400, "'inputs' must be a non-empty list"),
    ("inputs null", j({"inputs": None}), 400, "'inputs' must be a non-empty list"),
    ("inputs object", j({"inputs": {}}), 400, "'inputs' must be a non-empty list"),
    ("input not an object", j({"inputs": [3]}), 400, "inputs[0] must be an object"),
    ("no name", with_input(name=...), 400, "needs a string 'name'"),
    ("no shape", with_input(shape=...), 400, "'shape' of input 'input'"),
    ("shape a string", with_input(shape="1,64"), 400, "'shape' of input 'input'"),
    ("shape of floats", with_input(shape=[1.5, 64]), 400, "whole numbers"),
    ("negative shape", with_input(shape=[-1, 64]), 400, "whole numbers >= 0"),
    ("shape of booleans", with_input(shape=[True, 64]), 400, "whole numbers"),
    ("shape beyond int64", with_input(shape=[1, 2**64]), 400, "whole numbers"),
    ("no datatype", with_input(datatype=...), 400, "'datatype' of input 'input' must be one of"),
    ("unknown datatype", with_input(datatype="FLOAT"), 400, "must be one of BOOL"),
    ("data missing", with_input(data=...), 400, "needs 'data'"),
    ("data null", with_input(data=None), 400, "must be a list"),
    ("data a string", with_input(data="0"), 400, "must be a list"),
    ("fewer elements than the shape", with_input(data=[0.0] * 63), 400,
     "has 63 elements, but its shape [1, 64] needs 64"),
    ("more elements than the shape", with_input(data=[0.0] * 65), 400, "has 65 elements"),
    ("unevenly nested data", with_input(data=[[0.0] * 32, 5]), 400, "nested evenly"),
    ("huge declared shape", with_input(shape=[2**40, 64]), 413, "the limit is"),
    ("huge shape, tiny data", with_input(shape=[2**20, 2**20]), 413, "the limit is"),
    ("binary size in a JSON request", with_input(data=..., parameters={"binary_data_size": 256}), 400,
     "no Inference-Header-Content-Length"),
    ("negative binary size", with_input(data=..., parameters={"binary_data_size": -1}), 400, "whole number of bytes"),
    ("string binary size", with_input(data=..., parameters={"binary_data_size": "x"}), 400, "whole number of bytes"),
    ("data and binary size", with_input(parameters={"binary_data_size": 256}), 400, "both 'data' and a binary"),
    ("parameters not an object", with_input(parameters=3), 400, "'parameters' of input 'input' must be an object"),
    ("a nested parameter", with_input(parameters={"x": {"y": 1}}), 400, "string, number or boolean"),
    ("shared memory", with_input(data=..., parameters={"shared_memory_region": "r", "shared_memory_byte_size": 4}),
     400, "shared memory"),
    ("request parameters not an object", j({**OK, "parameters": 3}), 400, "'parameters' of the request"),
    ("id not a string", j({**OK, "id": 3}), 400, "'id' must be a string"),
    ("outputs not a list", j({**OK, "outputs": 3}), 400, "'outputs' must be a list"),
    ("output without a name", j({**OK, "outputs": [{}]}), 400, "outputs[0] must be an object with a string 'name'"),
    ("a million [", b"[" * 1_000_000, 400, "nests deeper than 64"),
    ("deep but balanced", b"[" * 100 + b"]" * 100, 400, "nests deeper than 64"),
    ("deep inside an input", with_input(data=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
        0.0]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]), 400, "nests deeper"),
]


BINARY_HEADER = j({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                               "parameters": {"binary_data_size": 256}}]})


BINARY_HOSTILE: list[tuple[str, bytes, dict[str, str], int, str]] = [
    ("binary part too short", BINARY_HEADER + b"\0" * 200, {"Inference-Header-Content-Length": str(len(BINARY_HEADER))},
     400, "add up to 256 bytes, but 200 bytes"),
    ("binary part too long", BINARY_HEADER + b"\0" * 300, {"Inference-Header-Content-Length": str(len(BINARY_HEADER))},
     400, "add up to 256 bytes, but 300 bytes"),
    ("header length past the body", BINARY_HEADER + b"\0" * 256, {"Inference-Header-Content-Length": "5000"},
     400, "more than the"),
    ("header length cuts the JSON", BINARY_HEADER + b"\0" * 256, {"Inference-Header-Content-Length": "5"},
     400, "not valid JSON"),
    ("header length negative", BINARY_HEADER + b"\0" * 256, {"Inference-Header-Content-Length": "-5"},
     400, "byte length of the JSON header"),
    ("header length not a number", BINARY_HEADER + b"\0" * 256, {"Inference-Header-Content-Length": "x"},
     400, "byte length of the JSON header"),
    ("binary size not the shape's", j({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                                   "parameters": {"binary_data_size": 8}}]}) + b"\0" * 8, {}, 400,
     "takes 256 bytes"),
    ("huge shape with a binary size", j({"inputs": [{"name": "input", "shape": [2**40, 64], "datatype": "FP32",
                                                     "parameters": {"binary_data_size": 4}}]}) + b"\0" * 4, {}, 413,
     "the limit is"),
    ("BYTES too small for its count", j({"inputs": [{"name": "s", "shape": [100], "datatype": "BYTES",
                                                     "parameters": {"binary_data_size": 8}}]}) + b"\0" * 8, {}, 400,
     "too small for 100 BYTES elements"),
    ("unsupported encoding", j(OK), {"Content-Encoding": "br"}, 415, "gzip, deflate or none"),
    ("corrupt gzip", b"\x1f\x8b\x08\x00garbage", {"Content-Encoding": "gzip"}, 400, "corrupt"),
    ("gzip bomb", gzip.compress(b"[" * 5_000_000), {"Content-Encoding": "gzip"}, 413, "inflates to over"),
]
