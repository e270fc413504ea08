"""Declaring a streaming (decoupled) model at upload (issue 33): python models only, shown on the version, carried
into the revision's spec and rendered with Triton's decoupled transaction policy. The streams themselves run on a
real Triton in tests/test_streaming_e2e.py."""

from __future__ import annotations

import json
from typing import Any

from deployments.model_entry import ModelEntry
from deployments.render import render_config
from deployments.spec import ServedModel
from modelport.core.signature import Signature, Tensor
from models_registry.models import Model, ModelVersion
from models_registry.tests.storage_checks import assert_nothing_stored
from tests.artifacts import STREAMING_SIGNATURE, streaming_python_model_zip, tiny_onnx
from tests.support.people import Person


def upload(person: Person, data: bytes, filename: str, **fields: Any) -> Any:
    from django.core.files.uploadedfile import SimpleUploadedFile

    return person.client().post("/api/v1/models/digits/versions/", {"file": SimpleUploadedFile(filename, data),
                                                                     **fields}, format="multipart")


def test_a_python_model_uploaded_with_decoupled_true_is_a_streaming_version(alice: Person,
                                                                            digits_model: Model) -> None:
    streaming = upload(alice, streaming_python_model_zip(), "chat.zip", decoupled="true",
                       signature=json.dumps(STREAMING_SIGNATURE))
    plain = upload(alice, streaming_python_model_zip(), "chat.zip", signature=json.dumps(STREAMING_SIGNATURE))

    assert streaming.status_code == 201, streaming.json()
    assert streaming.json()["decoupled"] is True and plain.json()["decoupled"] is False
    assert list(ModelVersion.objects.order_by("number").values_list("decoupled", flat=True)) == [True, False]
    listed = alice.client().get("/api/v1/models/digits/versions/").json()
    assert [v["decoupled"] for v in listed] == [False, True]


def test_decoupled_true_on_a_model_that_is_not_python_is_a_400_naming_the_format(alice: Person,
                                                                               digits_model: Model) -> None:
    detected = upload(alice, tiny_onnx(), "model.onnx", decoupled="true")
    declared = upload(alice, tiny_onnx(), "model.onnx", decoupled="true", format="onnx")

    for response in (detected, declared):
        assert response.status_code == 400
        (message,) = response.json()["error"]["fields"]["decoupled"]
        assert message.startswith("decoupled=true is for python models only") and "ONNX" in message
    assert not ModelVersion.objects.exists()
    assert_nothing_stored()


def test_a_streaming_entry_renders_with_the_decoupled_policy_and_keeps_it_through_the_spec() -> None:
    signature = Signature(inputs=(Tensor("text_input", "BYTES", (1,)),),
                          outputs=(Tensor("text_output", "BYTES", (-1,)),))
    entry = ModelEntry(name="chat", version=1, format="python", signature=signature, decoupled=True)
    plain = ModelEntry(name="chat", version=1, format="python", signature=signature)

    assert "model_transaction_policy {\n  decoupled: true\n}" in render_config(ServedModel.of(entry, None), "local")
    assert "model_transaction_policy" not in render_config(ServedModel.of(plain, None), "local")
    assert ModelEntry.from_json(entry.to_json()).decoupled is True
    # A model that does not stream keeps the spec JSON it always had.
    assert "decoupled" not in plain.to_json() and ModelEntry.from_json(plain.to_json()).decoupled is False
