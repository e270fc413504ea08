"""The tests' streaming pipeline (tests/test_pipeline_stream_e2e.py, tests/test_tracing_e2e.py): a python step that
turns a name into a speaker's prompt, then the sample text generator (decoupled), as an ensemble named "story"."""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

from django.core.files.uploadedfile import SimpleUploadedFile

from models_registry.samples import TEXTGEN_EXAMPLE_REQUEST, TEXTGEN_SIGNATURE, build_textgen_zip
from tests.processes import wait_for
from tests.support.people import Person

SPEAKER_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            names = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            prompts = np.array([[bytes(n).decode().upper().encode() + b":\\n" for n in row] for row in names],
                               dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("prompt", prompts)]))
        return responses
'''
BYTES = {"datatype": "BYTES", "dims": [-1, 1]}
SPEAKER_SIGNATURE = {"inputs": [{"name": "text_input", **BYTES}], "outputs": [{"name": "prompt", **BYTES}]}
STORY = {
    "inputs": [{"name": "text_input", **BYTES}, {"name": "max_tokens", "datatype": "INT32", "dims": [-1, 1]},
               {"name": "seed", "datatype": "INT64", "dims": [-1, 1]}],
    "outputs": [{"name": "text_output", "datatype": "BYTES", "dims": [-1, -1]}],  # [1, pieces], as textgen's
    "steps": [
        {"model": "speaker", "input_map": {"text_input": "text_input"}, "output_map": {"prompt": "prompt"}},
        # temperature, top_p, stop and stream are left out: the generator's defaults.
        {"model": "textgen", "input_map": {"text_input": "prompt", "max_tokens": "max_tokens", "seed": "seed"},
         "output_map": {"text_output": "text_output"}},
    ],
}


def zipped(source: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model.py", source)
    return buffer.getvalue()


def upload(person: Person, name: str, archive: bytes, signature: dict[str, Any], **fields: Any) -> None:
    client = person.client()
    created = client.post(f"/api/v1/models/{name}/versions/", {
        "file": SimpleUploadedFile(f"{name}.zip", archive), "signature": json.dumps(signature), "format": "python",
        "create_model": "true", **fields}, format="multipart")
    assert created.status_code == 201, created.json()
    path = f"/api/v1/models/{name}/versions/{created.json()['number']}/"
    version = wait_for(lambda: (v := client.get(path).json())["status"] != "validating" and v, 120,
                       what=f"the worker to inspect {name}")
    assert version["status"] == "ready", version["error"]


def upload_story_models(person: Person) -> None:
    """The pipeline's two steps, uploaded through the API (the pipeline itself is left to the test)."""
    upload(person, "speaker", zipped(SPEAKER_MODEL), SPEAKER_SIGNATURE)
    upload(person, "textgen", build_textgen_zip(), TEXTGEN_SIGNATURE.to_json(), decoupled="true",
           example_request=json.dumps(TEXTGEN_EXAMPLE_REQUEST))
