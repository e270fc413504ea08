"""Optional inputs (issue 33: Triton's OpenAI frontend sends `max_tokens`, `temperature`, ... only when the caller gave
them): an input declared `"optional": true` is shown on the version, rendered `optional: true`, may be left out of
the example request and is left out of the trial call's zeros. Python models only; a pipeline's inputs never. The
real tritonserver taking a request without them: models_registry/tests/test_textgen_triton.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from deployments.model_entry import ModelEntry
from deployments.render import render_config
from deployments.spec import ServedModel
from modelport.core.example_request import ExampleRequestError, parse_example_request
from modelport.core.signature import Signature, SignatureError, Tensor, parse_signature
from models_registry import inspection
from models_registry.models import Model, ModelVersion
from models_registry.pipelines import PipelineError, _parse_structure
from models_registry.python_trial import trial_request
from tests.artifacts import streaming_python_model_zip, tiny_onnx
from tests.support.people import Person

SIGNATURE: dict[str, Any] = {"inputs": [{"name": "text_input", "datatype": "BYTES", "dims": [-1, 1]},
                        {"name": "max_tokens", "datatype": "INT32", "dims": [-1, 1], "optional": True}],
             "outputs": [{"name": "text_output", "datatype": "BYTES", "dims": [-1, 1]}]}


def upload(person: Person, data: bytes, filename: str, **fields: Any) -> Any:
    from django.core.files.uploadedfile import SimpleUploadedFile

    return person.client().post("/api/v1/models/digits/versions/", {"file": SimpleUploadedFile(filename, data),
                                                                     **fields}, format="multipart")


def test_an_optional_input_reads_back_and_writes_the_same_json() -> None:
    signature = parse_signature(SIGNATURE)
    assert signature.inputs[1] == Tensor("max_tokens", "INT32", (-1, 1), optional=True)
    assert signature.optional_inputs == ("max_tokens",)
    assert signature.to_json() == SIGNATURE
    # A signature without one keeps the JSON it always had.
    assert "optional" not in json.dumps(parse_signature({**SIGNATURE, "inputs": SIGNATURE["inputs"][:1]}).to_json())


@pytest.mark.parametrize(("change", "message"), [
    ({"outputs": [{**SIGNATURE["outputs"][0], "optional": True}]}, "only an input can be optional"),
    ({"inputs": [{**SIGNATURE["inputs"][0], "optional": "yes"}]}, "optional must be true or false, got 'yes'"),
    ({"inputs": [{**SIGNATURE["inputs"][0], "optional": 1}]}, "optional must be true or false"),
    ({"inputs": [{**SIGNATURE["inputs"][1]}]}, "every input is optional"),
    ({"inputs": [{**SIGNATURE["inputs"][0], "optionl": True}]}, "unknown keys ['optionl']"),
])
def test_a_bad_optional_is_refused_saying_what_to_fix(change: dict[str, Any], message: str) -> None:
    with pytest.raises(SignatureError) as caught:
        parse_signature({**SIGNATURE, **change})
    assert message in str(caught.value)


def test_an_optional_input_renders_optional_true_and_a_required_one_does_not() -> None:
    entry = ModelEntry(name="chat", version=1, format="python", signature=parse_signature(SIGNATURE),
                       max_batch_size=8, decoupled=True)
    config = render_config(ServedModel.of(entry, None), "local")
    text_input, max_tokens = config.split("input {")[1:3]
    assert "optional" not in text_input and "optional: true" in max_tokens
    assert ModelEntry.from_json(entry.to_json()).signature == entry.signature


def test_the_example_request_may_leave_an_optional_input_out_but_not_a_required_one() -> None:
    signature = parse_signature(SIGNATURE)
    only_text = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["hi"]}]}
    assert [i.tensor.name for i in parse_example_request(only_text, signature, 10_000).inputs] == ["text_input"]
    only_optional = {"inputs": [{"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "data": [3]}]}
    with pytest.raises(ExampleRequestError) as caught:
        parse_example_request(only_optional, signature, 10_000)
    assert "lacks input(s) 'text_input'" in str(caught.value) and "not optional" in str(caught.value)


def test_the_trial_calls_zeros_leave_optional_inputs_out() -> None:
    request, batch = trial_request(parse_signature(SIGNATURE))
    assert [i["name"] for i in request["inputs"]] == ["text_input"] and batch == 2


def test_a_pipelines_inputs_cannot_be_optional() -> None:
    definition = {**SIGNATURE, "steps": [{"model": "chat", "input_map": {"text_input": "text_input"},
                                          "output_map": {"text_output": "text_output"}}]}
    with pytest.raises(PipelineError) as caught:
        _parse_structure(definition)
    assert "cannot be optional (max_tokens)" in str(caught.value.errors)


def test_a_python_version_shows_its_optional_inputs(alice: Person, digits_model: Model, settings: Any) -> None:
    settings.PYTHON_TRIAL_CALL = False
    created = upload(alice, streaming_python_model_zip(), "chat.zip", decoupled="true",
                     signature=json.dumps(SIGNATURE))
    assert created.status_code == 201, created.json()
    version = inspection.inspect_here(ModelVersion.objects.get(number=created.json()["number"]).pk)
    assert version.status == ModelVersion.Status.READY, version.error
    shown = alice.client().get(f"/api/v1/models/digits/versions/{version.number}/").json()
    assert shown["signature"] == SIGNATURE
    assert version.parsed_signature.optional_inputs == ("max_tokens",)


def test_an_onnx_model_cannot_declare_an_optional_input(alice: Person, digits_model: Model) -> None:
    onnx_signature = {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]},
                                 {"name": "mask", "datatype": "FP32", "dims": [-1, 4], "optional": True}],
                      "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 2]}]}
    created = upload(alice, tiny_onnx(), "model.onnx", signature=json.dumps(onnx_signature))
    assert created.status_code == 201, created.json()  # the format is known at inspection
    version = inspection.inspect_here(ModelVersion.objects.get(number=created.json()["number"]).pk)
    assert version.status == ModelVersion.Status.INVALID
    assert version.error.startswith("Only a python model's inputs can be optional; this ONNX model's mask must be sent")


def test_the_sample_text_generator_declares_every_input_but_text_input_optional() -> None:
    from models_registry.samples import TEXTGEN_OPTIONAL_INPUTS, TEXTGEN_SIGNATURE

    assert TEXTGEN_SIGNATURE.optional_inputs == TEXTGEN_OPTIONAL_INPUTS
    assert parse_signature(TEXTGEN_SIGNATURE.to_json()) == TEXTGEN_SIGNATURE
    assert isinstance(TEXTGEN_SIGNATURE, Signature)
