"""A version's example request (issue 31): checked against the signature at upload, a 400 naming what is wrong;
stored with the version for its trial call. The calls themselves, on a real Triton:
deployments/tests/test_trial_call.py."""

from __future__ import annotations

import base64
import io
import json
import struct
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from modelport.core.example_request import ExampleRequestError, parse_example_request
from modelport.core.signature import Signature, Tensor
from models_registry.models import ModelVersion
from tests.support.people import Person

IMAGES = Signature(inputs=(Tensor("image", "BYTES", (-1, 1)),), outputs=(Tensor("size", "INT64", (-1, 2)),))
SIGNATURE_JSON = json.dumps(IMAGES.to_json())
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256))).decode()
GOOD = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1, 1], "data": [{"b64": PNG}]}]}


def python_zip() -> bytes:
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model.py", "class TritonPythonModel:\n    pass\n")
    return buffer.getvalue()


def upload(person: Person, example: Any, signature: str = SIGNATURE_JSON) -> Any:
    client = person.client()
    client.post("/api/v1/models/", {"name": "decoder"}, format="json")
    body = {"file": SimpleUploadedFile("decoder.zip", python_zip()), "format": "python", "signature": signature}
    if example is not None:
        body["example_request"] = example if isinstance(example, str) else json.dumps(example)
    return client.post("/api/v1/models/decoder/versions/", body, format="multipart")


def test_a_good_example_request_is_parsed_with_its_batch_and_bytes() -> None:
    example = parse_example_request(GOOD, IMAGES, 1 << 20)
    assert example.batch == 1
    assert example.inputs[0].data == [base64.b64decode(PNG)]
    body, header_length = example.triton_body()
    assert header_length is not None
    header = json.loads(body[:header_length])
    assert header["inputs"][0]["parameters"] == {"binary_data_size": 4 + 264}
    assert body[header_length:] == struct.pack("<I", 264) + base64.b64decode(PNG)


@pytest.mark.parametrize(("example", "message"), [
    ({"inputs": [{"name": "img", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]}]},
     "inputs[0].name: 'img' is not an input of the signature (its inputs: 'image')."),
    ({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1], "data": [0.5]}]},
     "inputs[0] ('image').datatype is 'FP32'; the signature declares BYTES."),
    ({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]}]},
     "inputs[0] ('image').shape [1, 2] does not fit the declared dims [-1, 1]"),
    ({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [2, 1], "data": ["a"]}]},
     "inputs[0] ('image').data has 1 elements; shape [2, 1] holds 2."),
    ({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1, 1], "data": [{"b64": "***"}]}]},
     "inputs[0] ('image').data[0].b64 is not base64."),
    ({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1, 1], "data": [7]}]},
     'inputs[0] (\'image\').data[0] must be a string or {"b64": "..."} (BYTES).'),
    ({"inputs": []}, 'The example request needs "inputs"'),
    ({"inputs": GOOD["inputs"], "extra": 1}, "The example request has unknown fields ['extra']"),
])
def test_an_example_request_that_does_not_fit_the_signature_is_named(example: Any, message: str) -> None:
    with pytest.raises(ExampleRequestError) as refused:
        parse_example_request(example, IMAGES, 1 << 20)
    assert message in str(refused.value)


def test_numbers_are_checked_against_their_datatype() -> None:
    signature = Signature(inputs=(Tensor("x", "UINT8", (-1, 2)), Tensor("f", "FP32", (-1,))),
                          outputs=(Tensor("y", "FP32", (-1,)),))
    with pytest.raises(ExampleRequestError, match=r"inputs\[0\] \('x'\).data\[1\] must be an integer from 0 to 255"):
        parse_example_request({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1, 2], "data": [[1, 256]]}],
                               }, signature, 1 << 20)
    with pytest.raises(ExampleRequestError, match="lacks input"):
        parse_example_request({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1, 2], "data": [1, 2]}]},
                              signature, 1 << 20)
    with pytest.raises(ExampleRequestError, match="different batch sizes"):
        parse_example_request({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1, 2], "data": [1, 2]},
                                          {"name": "f", "datatype": "FP32", "shape": [2], "data": [1.0, 2]}]},
                              signature, 1 << 20)


def test_an_upload_with_a_good_example_request_stores_it(alice: Person) -> None:
    response = upload(alice, GOOD)
    assert response.status_code == 201, response.json()
    assert response.json()["has_example_request"] is True
    assert response.json()["notes"] == []
    assert ModelVersion.objects.get().example_request == GOOD


@pytest.mark.parametrize(("example", "message"), [
    ({"inputs": [{"name": "img", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]}]},
     "'img' is not an input of the signature (its inputs: 'image')"),
    ({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1], "data": [0.5]}]},
     "datatype is 'FP32'; the signature declares BYTES"),
    ("{not json", "example_request: Value must be valid JSON."),
])
def test_an_upload_with_a_bad_example_request_is_a_400_naming_it(alice: Person, example: Any, message: str) -> None:
    response = upload(alice, example)
    assert response.status_code == 400, response.json()
    assert message in json.dumps(response.json())
    assert "example_request" in response.json()["error"]["fields"]
    assert not ModelVersion.objects.exists()


def test_an_example_request_over_the_limit_is_a_400_saying_the_limit(alice: Person, settings: Any) -> None:
    settings.EXAMPLE_REQUEST_MAX_BYTES = 2048
    big = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1, 1],
                       "data": [{"b64": base64.b64encode(b"x" * 4096).decode()}]}]}
    response = upload(alice, big)
    assert response.status_code == 400, response.json()
    assert "at most 2,048" in json.dumps(response.json())
    assert not ModelVersion.objects.exists()


def test_a_json_upload_takes_the_example_request_as_an_object(alice: Person) -> None:
    client = alice.client()
    client.post("/api/v1/models/", {"name": "decoder"}, format="json")
    response = client.post("/api/v1/models/decoder/versions/", {
        "upload_id": "00000000-0000-0000-0000-000000000000", "format": "python", "signature": IMAGES.to_json(),
        "example_request": {"inputs": [{"name": "nope", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]}]},
    }, format="json")
    assert response.status_code == 400, response.json()
    fields = response.json()["error"]["fields"]
    assert "'nope' is not an input of the signature" in json.dumps(fields["example_request"])


def test_an_onnx_upload_checks_its_example_request_against_the_signature_inspection_reads(alice: Person) -> None:
    from models_registry.inspection import inspect_here
    from tests.artifacts import tiny_onnx

    client = alice.client()
    client.post("/api/v1/models/", {"name": "tiny"}, format="json")

    def push(example: dict[str, Any]) -> ModelVersion:
        response = client.post("/api/v1/models/tiny/versions/", {
            "file": SimpleUploadedFile("model.onnx", tiny_onnx()), "example_request": json.dumps(example)},
            format="multipart")
        assert response.status_code == 201, response.json()  # no declared signature: checked at inspection
        return inspect_here(ModelVersion.objects.get(model__name="tiny", number=response.json()["number"]).pk)

    wrong = push({"inputs": [{"name": "nope", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}]})
    assert wrong.status == "invalid"
    assert wrong.error == "example_request: inputs[0].name: 'nope' is not an input of the signature (its inputs: 'x')."
    right = push({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    assert right.status == "ready", right.error
    assert right.example_data() == {"x": [1, 2, 3, 4]}


def test_a_null_character_in_an_example_request_kept_until_inspection_is_a_400(alice: Person) -> None:
    """Without a declared signature the request is stored as sent until inspection: a NUL in it would be a 500 on
    PostgreSQL, which stores none in JSON."""
    from tests.artifacts import tiny_onnx

    client = alice.client()
    client.post("/api/v1/models/", {"name": "tiny"}, format="json")
    example = {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 1], "data": ["a\u0000b"]}]}
    response = client.post("/api/v1/models/tiny/versions/", {
        "file": SimpleUploadedFile("model.onnx", tiny_onnx()), "example_request": json.dumps(example)},
        format="multipart")
    assert response.status_code == 400, response.json()
    assert "Null characters are not allowed" in response.json()["error"]["fields"]["example_request"][0]
