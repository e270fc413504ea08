"""A version's chat template (issue 33): uploaded beside the model, compiled at upload (a syntax error names the
line), shown on the version and carried into the revision's spec, where the gateway's route cache reads it."""

from __future__ import annotations

import json
from typing import Any

from deployments.model_entry import ModelEntry
from modelport.core.signature import Signature, Tensor
from models_registry.models import Model, ModelVersion
from tests.artifacts import STREAMING_SIGNATURE, streaming_python_model_zip
from tests.support.people import Person


def upload(person: Person, **fields: Any) -> Any:
    from django.core.files.uploadedfile import SimpleUploadedFile

    return person.client().post("/api/v1/models/digits/versions/", {
        "file": SimpleUploadedFile("chat.zip", streaming_python_model_zip()),
        "signature": json.dumps(STREAMING_SIGNATURE), **fields}, format="multipart")


def test_a_version_uploaded_with_a_chat_template_keeps_and_shows_it(alice: Person, digits_model: Model) -> None:
    template = "{% for m in messages %}\n{{ m.content }}\n{% endfor %}"
    created = upload(alice, chat_template=template)
    plain = upload(alice)

    assert created.status_code == 201, created.json()
    assert created.json()["chat_template"] == template and plain.json()["chat_template"] == ""
    assert ModelVersion.objects.get(number=1).chat_template == template


def test_a_template_that_does_not_compile_is_a_400_naming_its_line(alice: Person, digits_model: Model) -> None:
    refused = upload(alice, chat_template="fine\n{% for m in %}")
    huge = upload(alice, chat_template="x" * (64 * 1024 + 1))

    assert refused.status_code == 400
    (message,) = refused.json()["error"]["fields"]["chat_template"]
    assert "line 2" in message
    assert huge.status_code == 400 and "limit" in huge.json()["error"]["fields"]["chat_template"][0]
    assert not ModelVersion.objects.exists()


def test_the_template_goes_through_the_spec_and_a_spec_without_one_keeps_its_json() -> None:
    signature = Signature(inputs=(Tensor("text_input", "BYTES", (1,)),), outputs=(Tensor("text_output", "BYTES",
                                                                                         (-1,)),))
    entry = ModelEntry(name="chat", version=1, format="python", signature=signature, chat_template="{{ x }}")
    plain = ModelEntry(name="chat", version=1, format="python", signature=signature)

    assert ModelEntry.from_json(entry.to_json()).chat_template == "{{ x }}"
    assert "chat_template" not in plain.to_json()
