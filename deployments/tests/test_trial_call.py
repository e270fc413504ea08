"""The python trial call with and without an example request (issue 31), on a real sandboxed Triton: a model that
decodes images (PIL.Image.open on its BYTES input, written as users write it) raises on the zeros' empty bytes and is
accepted with a note naming the exception; with an example request carrying a real PNG it is checked and passes;
what the call proves wrong (a misnamed output) is refused either way."""

from __future__ import annotations

import base64
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from deployments.runtimes.local.trial_call import verdict
from modelport.core.example_request import parse_example_request
from modelport.core.signature import signature_from_json
from models_registry.inspection import inspect_here
from models_registry.models import ModelVersion
from tests.support.people import Person

SIGNATURE = {"inputs": [{"name": "image", "datatype": "BYTES", "dims": [-1, 1]}],
             "outputs": [{"name": "size", "datatype": "INT64", "dims": [-1, 2]}]}
# As a newcomer writes a decoding step: no guard for empty bytes, no INVALID_ARG.
DECODER_PY = '''
import io

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "image").as_numpy()
            sizes = [Image.open(io.BytesIO(bytes(item))).size for item in images.reshape(-1)]
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("{name}", np.array(sizes, dtype=np.int64))]))
        return answers
'''


def png(width: int, height: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (width, height), 255).save(buffer, format="PNG")
    return buffer.getvalue()


def example(*images: bytes) -> dict[str, Any]:
    return {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [len(images), 1],
                        "data": [{"b64": base64.b64encode(i).decode()} for i in images]}]}


def decoder_zip(output_name: str = "size") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model.py", DECODER_PY.replace("{name}", output_name))
    return buffer.getvalue()


def push(person: Person, data: bytes, example_request: dict[str, Any] | None = None) -> ModelVersion:
    client = person.client()
    client.post("/api/v1/models/", {"name": "decoder"}, format="json")
    body: dict[str, Any] = {"file": SimpleUploadedFile("decoder.zip", data), "format": "python",
                            "signature": json.dumps(SIGNATURE)}
    if example_request is not None:
        body["example_request"] = json.dumps(example_request)
    response = client.post("/api/v1/models/decoder/versions/", body, format="multipart")
    assert response.status_code == 201, response.json()
    return inspect_here(ModelVersion.objects.get(number=response.json()["number"], model__name="decoder").pk,
                        wait_seconds=180)


def test_a_model_that_raises_on_zeros_without_an_example_is_answered_with_a_note_not_a_refusal() -> None:
    # The verdict alone (no Triton): Triton's answer when execute() raised on the empty bytes.
    error = ("Failed to process the request(s) for model 'model_0_0', message: UnidentifiedImageError: cannot "
             "identify image file <_io.BytesIO object at 0x7f>\n\nAt:\n"
             "  /srv/var/runtime-env/PIL/Image.py(3730): open\n")
    outcome = verdict(signature_from_json(SIGNATURE), 2, 500, json.dumps({"error": error}).encode(), False)
    assert outcome.problems == []
    assert outcome.note.startswith("not checked: the model raised UnidentifiedImageError on inputs of zeros")
    assert "/srv/var" not in outcome.note  # the traceback's paths of this machine are not echoed
    on_example = verdict(signature_from_json(SIGNATURE), 1, 500, json.dumps({"error": error}).encode(), True)
    assert on_example.problems == ["the trial call on the example request failed with HTTP 500: "
                                   "UnidentifiedImageError: cannot identify image file <_io.BytesIO object at 0x7f>"]


@pytest.mark.triton
@pytest.mark.django_db
def test_a_decoding_step_without_an_example_is_valid_with_a_note_naming_the_exception(
    alice: Person, settings: Any
) -> None:
    settings.PYTHON_TRIAL_CALL = True
    version = push(alice, decoder_zip())
    assert version.status == "ready", version.error
    shown = alice.client().get("/api/v1/models/decoder/versions/1/").json()
    assert shown["has_example_request"] is False
    assert len(shown["notes"]) == 1
    assert shown["notes"][0].startswith("not checked: the model raised UnidentifiedImageError on inputs of zeros")
    browser = Client()
    browser.force_login(alice.user)
    page = browser.get("/models/decoder/").content.decode()
    assert 'id="version-1-note"' in page and "UnidentifiedImageError" in page


@pytest.mark.triton
@pytest.mark.django_db
def test_a_decoding_step_with_an_example_png_is_checked_and_has_no_note(alice: Person, settings: Any) -> None:
    settings.PYTHON_TRIAL_CALL = True
    version = push(alice, decoder_zip(), example(png(5, 3), png(2, 7)))
    assert version.status == "ready", version.error
    shown = alice.client().get("/api/v1/models/decoder/versions/1/").json()
    assert shown["has_example_request"] is True
    assert shown["notes"] == []
    assert version.definition["trial_call"] == "passed: one call on the example request matched the declared signature"


@pytest.mark.triton
@pytest.mark.django_db
def test_a_misnamed_output_is_still_refused_with_or_without_an_example(alice: Person, settings: Any) -> None:
    settings.PYTHON_TRIAL_CALL = True
    refused = push(alice, decoder_zip("sizes"), example(png(4, 4)))
    assert refused.status == "invalid"
    assert refused.error.startswith("The python model does not answer as its declared signature says (one call on "
                                    "the example request): output 'size' was not returned (the answer held none;")
    # Without an example the call on zeros raises before any output: accepted, unchecked, with the note (the
    # gateway still refuses at serve time an answer missing an output).
    unchecked = push(alice, decoder_zip("sizes"))
    assert unchecked.status == "ready" and "UnidentifiedImageError" in unchecked.notes[0]


@pytest.mark.triton
def test_an_example_the_model_fails_on_is_refused_naming_the_exception(tmp_path: Path, settings: Any) -> None:
    from models_registry.python_trial import python_findings
    from models_registry.validation import ArtifactRejected

    settings.PYTHON_TRIAL_CALL = True
    archive = tmp_path / "decoder.zip"
    archive.write_bytes(decoder_zip())
    signature = signature_from_json(SIGNATURE)
    not_an_image = parse_example_request(example(b"not a png"), signature, 1 << 20)
    with pytest.raises(ArtifactRejected) as refused:
        python_findings(archive, signature, has_requirements=False, example=not_an_image)
    assert ("(one call on the example request): the trial call on the example request failed with HTTP 500: "
            "UnidentifiedImageError: cannot identify image file") in str(refused.value)
