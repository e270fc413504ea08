"""Nothing silent at serve time (issue 25): Triton's errors reach the caller in words about the deployment's own
signature (no request ids, no operator advice, no model internals), and an answer missing an output is an error
naming it, never a 200 with nothing. The messages are Triton 2.51's own (tests/test_serving_errors_e2e.py checks
them on the real server); the upstream here is scripted."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from typing import Any

import pytest

from deployments.revision_spec import ModelEntry
from gateway.contract import contract_for, missing_outputs, requested_outputs, reword
from gateway.tests.digits_contract import SHAPE_ERROR, SIGNATURE, digits_deployment, digits_request
from gateway.tests.fake_upstream import FakeUpstream, Request, chunked, json_response, response
from tests.support.gateway_calls import call, run
from tests.support.people import Person

DIGITS = contract_for(ModelEntry(name="digits", version=1, format="onnx", signature=SIGNATURE, max_batch_size=8))


def test_a_shape_error_names_the_shape_the_deployment_takes_and_keeps_the_400() -> None:
    status, message = reword(400, SHAPE_ERROR, DIGITS)
    assert status == 400
    assert message == ("Input 'input' of model 'digits' takes shape [-1, 64] (FP32; the first dimension is the batch, "
                       "1 to 8 rows per request; -1 is any size); you sent [2, 63].")


def test_a_batch_too_large_says_how_many_rows_fit() -> None:
    status, message = reword(400, "[request id: <id_unknown>] inference request batch-size must be <= 8 for "
                                  "'digits'", DIGITS)
    assert status == 400 and "at most 8 rows per request" in message and "'input' (FP32 [-1, 64])" in message
    assert "request id" not in message


@pytest.mark.parametrize(("triton", "words"), [
    ("[request id: <id_unknown>] unexpected inference input 'pixels' for model 'digits'",
     "Model 'digits' has no input 'pixels': it takes 'input' (FP32 [-1, 64])"),
    ("[request id: 7] unexpected inference output 'scores' for model 'digits'",
     "Model 'digits' has no output 'scores': it gives 'probabilities' (FP32 [-1, 10]), 'label' (INT64 [-1, 1])"),
    ("[request id: <id_unknown>] expected 1 inputs but got 2 inputs for model 'digits'. Got input(s) ['a', 'input'], "
     "but missing required input(s) []. Please provide all required input(s).",
     "Model 'digits' takes the inputs 'input' (FP32 [-1, 64])"),
    ("[request id: <id_unknown>] inference input 'input' data-type is 'INT32', but model 'digits' expects 'FP32'",
     "Input 'input' of model 'digits' takes FP32 [-1, 64]; you sent INT32."),
])
def test_other_caller_mistakes_are_told_from_the_signature(triton: str, words: str) -> None:
    status, message = reword(400, triton, DIGITS)
    assert status == 400 and message.startswith(words) and "request id" not in message


def test_a_message_of_the_models_own_keeps_its_words_without_the_request_id() -> None:
    status, message = reword(400, "[request id: <id_unknown>] in ensemble 'digits-pipeline', the request is not an "
                                  "image (PNG, JPEG, ...): send the encoded file's bytes", None)
    assert (status, message) == (400, "in ensemble 'digits-pipeline', the request is not an image (PNG, JPEG, ...): "
                                      "send the encoded file's bytes")
    assert reword(400, SHAPE_ERROR, None)[1] == ("unexpected shape for input 'input' for model 'digits'. Expected "
                                                 "[-1,64], got [2,63].")


def test_a_models_fault_is_a_500_that_shows_nothing_of_its_internals() -> None:
    status, message = reword(500, "cannot identify image file <_io.BytesIO object at 0x7ff1109df2e0>", DIGITS)
    assert status == 500 and "0x7ff" not in message and "BytesIO" not in message
    assert message.startswith("Model 'digits' failed on this request: the fault is in the model")
    assert reword(503, "[request id: 3] model 'digits' is not ready", DIGITS) == (503, "model 'digits' is not ready")


def test_missing_outputs_are_found_without_parsing_the_tensors() -> None:
    answer = json.dumps({"model_name": "digits", "model_version": "1", "outputs": [
        {"name": "label", "datatype": "BYTES", "shape": [1], "data": ['{"name":"probabilities"']}]},
        separators=(",", ":")).encode()
    # The BYTES data mentions the other output, but quoted inside a string its quotes are escaped.
    assert missing_outputs(answer, ["probabilities", "label"]) == ["probabilities"]
    assert missing_outputs(b'{"model_name":"digits","outputs":[]}', ["label"]) == ["label"]
    assert missing_outputs(b'{"outputs":[{"name":"\xc3\xa9t\xc3\xa9","datatype":"FP32"}]}', ["été"]) == []
    assert requested_outputs({"outputs": [{"name": "label"}, {"nope": 1}]}) == ("label",)
    assert requested_outputs({"inputs": []}) is None and requested_outputs(["not", "a", "dict"]) is None


def test_the_gateway_refuses_an_answer_missing_an_output_and_rewords_tritons_errors(
    people: dict[str, Person], gateway_app: Any
) -> None:
    full = {"model_name": "digits", "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [1, 10],
                                                 "data": [0.1] * 10},
                                                {"name": "label", "datatype": "INT64", "shape": [1, 1], "data": [3]}]}

    def answer(request: Request) -> bytes:
        # The gateway may send a JSON request on as the binary tensor extension: read the id from its JSON header.
        found = re.search(rb'"id":\s*"([^"]*)"', request.body)
        which = found.group(1).decode() if found else ""
        if which == "empty":  # what Triton answered for a python model returning outputs under other names
            return response(200, b'{"model_name":"digits","model_version":"1","outputs":[]}',
                            {"Content-Type": "application/json"})
        if which == "chunked":  # Triton's HTTP server sends small answers chunked too
            return chunked(200, [b'{"model_name":"digits",', b'"outputs":[]}'])
        if which == "gzip":  # what Triton answers a client that accepts gzip (requests does, by default)
            return response(200, gzip.compress(b'{"model_name":"digits","outputs":[]}'), {"Content-Encoding": "gzip"})
        if which == "gzip-ok":
            return response(200, gzip.compress(json.dumps(full, separators=(",", ":")).encode()),
                            {"Content-Encoding": "gzip"})
        if which == "shape":
            return json_response({"error": SHAPE_ERROR}, 400)
        if which == "binary":  # a binary answer: only its JSON header is looked at
            header = b'{"model_name":"digits","outputs":[{"name":"label","datatype":"INT64","shape":[1,1],' \
                     b'"parameters":{"binary_data_size":8}}]}'
            return response(200, header + b"\x03" + b"\x00" * 7, {"Inference-Header-Content-Length": str(len(header)),
                                                                   "Content-Type": "application/octet-stream"})
        return response(200, json.dumps(full, separators=(",", ":")).encode(), {"Content-Type": "application/json"})

    async def scenario() -> None:
        async with FakeUpstream(answer) as upstream:
            await asyncio.to_thread(digits_deployment, people["alice"], upstream.url)
            app = gateway_app()
            url = "/serve/digits-prod/v2/models/digits/infer"
            token = people["alice"].token

            empty = await call(app, "POST", url, body=digits_request(id="empty"), token=token)
            assert empty.status == 500
            error = empty.json()["error"]
            assert "'probabilities', 'label'" in error and "declared in its signature" in error

            in_chunks = await call(app, "POST", url, body=digits_request(id="chunked"), token=token)
            assert in_chunks.status == 500
            assert "without its output 'probabilities', 'label'" in in_chunks.json()["error"]

            zipped = await call(app, "POST", url, body=digits_request(id="gzip"), token=token)
            assert zipped.status == 500 and b"content-encoding" not in zipped.headers
            assert "without its output 'probabilities', 'label'" in zipped.json()["error"]
            zipped_ok = await call(app, "POST", url, body=digits_request(id="gzip-ok"), token=token)
            assert zipped_ok.status == 200 and zipped_ok.headers[b"content-encoding"] == b"gzip"  # passed on as it came
            assert len(json.loads(gzip.decompress(zipped_ok.body))["outputs"]) == 2

            ok = await call(app, "POST", url, body=digits_request(id="ok"), token=token)
            assert ok.status == 200 and len(ok.json()["outputs"]) == 2

            binary = await call(app, "POST", url, token=token, body=digits_request(
                id="binary", outputs=[{"name": "label", "parameters": {"binary_data": True}}]))
            assert binary.status == 200 and binary.body.endswith(b"\x03" + b"\x00" * 7)
            asked = await call(app, "POST", url, token=token, body=digits_request(
                id="binary", outputs=[{"name": "probabilities"}]))
            assert asked.status == 500 and "'probabilities' (asked for in the request)" in asked.json()["error"]
            assert asked.headers[b"content-type"] == b"application/json"
            assert b"inference-header-content-length" not in asked.headers

            shape = await call(app, "POST", url, body=digits_request(id="shape"), token=token)
            assert shape.status == 400
            assert shape.json()["error"].startswith("Input 'input' of model 'digits' takes shape [-1, 64]")

    run(scenario)
