"""Inputs that must reach Triton unchanged, shared by the end-to-end tests of hostile bodies (a fixture module: nothing
here is collected)."""

from __future__ import annotations

import gzip
import json
from typing import Any

from gateway.tests.infer_bodies import OK, with_input


def j(value: Any) -> bytes:
    return json.dumps(value).encode()


# (name, method, path under /serve/digits-prod, body, extra headers): requests that are well-formed enough to pass
# the gateway's checks, so that only Triton can judge them, and requests aimed at the path.
PASSED_TO_TRITON: list[tuple[str, str, str, bytes, dict[str, str]]] = [
    ("an empty batch", "POST", "/v2/models/digits/infer", with_input(shape=[0, 64], data=[]), {}),
    ("a batch over max_batch_size", "POST", "/v2/models/digits/infer",
     with_input(shape=[1025, 64], data=[0.0] * (1025 * 64)), {}),
    ("the shape without its batch dimension", "POST", "/v2/models/digits/infer", with_input(shape=[64]), {}),
    ("a rank too many", "POST", "/v2/models/digits/infer", with_input(shape=[1, 1, 64]), {}),
    ("INT64 for an FP32 input", "POST", "/v2/models/digits/infer", with_input(datatype="INT64", data=[0] * 64), {}),
    ("BYTES for an FP32 input", "POST", "/v2/models/digits/infer", with_input(datatype="BYTES", data=["a"] * 64), {}),
    ("BOOL for an FP32 input", "POST", "/v2/models/digits/infer", with_input(datatype="BOOL", data=[True] * 64), {}),
    ("FP16 for an FP32 input", "POST", "/v2/models/digits/infer", with_input(datatype="FP16"), {}),
    ("numbers too big for FP32", "POST", "/v2/models/digits/infer", with_input(data=[1e300] * 64), {}),
    ("integers too big for anything", "POST", "/v2/models/digits/infer", with_input(data=[10**40] * 64), {}),
    ("NaN and Infinity", "POST", "/v2/models/digits/infer",
     b'{"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [NaN, Infinity]}]}', {}),
    ("the input twice", "POST", "/v2/models/digits/infer",
     j({"inputs": [OK["inputs"][0], OK["inputs"][0]]}), {}),
    ("an unknown input beside the real one", "POST", "/v2/models/digits/infer",
     j({"inputs": [OK["inputs"][0], {**OK["inputs"][0], "name": "extra"}]}), {}),
    ("an unknown output asked for", "POST", "/v2/models/digits/infer", j({**OK, "outputs": [{"name": "nope"}]}), {}),
    ("classification of a label", "POST", "/v2/models/digits/infer",
     j({**OK, "outputs": [{"name": "label", "parameters": {"classification": 3}}]}), {}),
    ("classification of -1 classes", "POST", "/v2/models/digits/infer",
     j({**OK, "outputs": [{"name": "probabilities", "parameters": {"classification": -1}}]}), {}),
    ("binary output asked for", "POST", "/v2/models/digits/infer",
     j({**OK, "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}]}), {}),
    ("sequence parameters for a model without sequences", "POST", "/v2/models/digits/infer",
     j({**OK, "parameters": {"sequence_id": 5, "sequence_start": True}}), {}),
    ("an absurd priority and a negative timeout", "POST", "/v2/models/digits/infer",
     j({**OK, "parameters": {"priority": 2**63, "timeout": -1}}), {}),
    ("a request id of 100 KB", "POST", "/v2/models/digits/infer", j({**OK, "id": "x" * 100_000}), {}),
    ("a unicode input name", "POST", "/v2/models/digits/infer", with_input(name="входные данные\u202e"), {}),
    ("a gzip body", "POST", "/v2/models/digits/infer", gzip.compress(j(OK)), {"Content-Encoding": "gzip"}),
    ("version 0", "POST", "/v2/models/digits/versions/0/infer", j(OK), {}),
    ("version -1", "POST", "/v2/models/digits/versions/-1/infer", j(OK), {}),
    ("version 2**70", "POST", f"/v2/models/digits/versions/{2**70}/infer", j(OK), {}),
    ("a version that is not a number", "GET", "/v2/models/digits/versions/latest", b"", {}),
    ("a model that is not there", "POST", "/v2/models/nope/infer", j(OK), {}),
    ("a model name of 10,000 characters", "GET", "/v2/models/" + "m" * 10_000, b"", {}),
    ("dot segments towards the admin API", "GET", "/v2/models/../logging", b"", {}),
    ("encoded dot segments", "GET", "/v2/models/%2e%2e/%2e%2e/v2/logging", b"", {}),
    ("an encoded slash in the model name", "POST", "/v2/models/digits%2Finfer/infer", j(OK), {}),
    ("a query string", "POST", "/v2/models/digits/infer?a=1&a=2&%00=x", j(OK), {}),
    ("stats of every model", "GET", "/v2/models/stats", b"", {}),
    ("a header length on a JSON request", "POST", "/v2/models/digits/infer", j(OK),
     {"Inference-Header-Content-Length": str(len(j(OK)))}),
]
