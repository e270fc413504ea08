"""Nothing silent, on the real Triton (issue 25): a python model that answers under other names than its signature's
is refused at inspection by its sandboxed trial call; served anyway (the trial switched off), its answer missing an
output is an error naming it, not a 200 with nothing; a wrong shape is a 400 that tells the caller the shape the
deployment takes, without Triton's request id or its advice to operators. (The sample pipeline's bad image: in
tests/test_pipeline_e2e.py.)"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import requests
from django.core.files.uploadedfile import SimpleUploadedFile

from modelport.core.signature import signature_from_json
from models_registry.models import ModelVersion
from tests.deploying import deploy, wait_status
from tests.processes import wait_for
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SIGNATURE = {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}],
             "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 4]}]}
MODEL_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("{name}", x * 2)]))
        return answers
'''


def model_zip(path: Path, output_name: str) -> Path:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model.py", MODEL_PY.replace("{name}", output_name))
    path.write_bytes(buffer.getvalue())
    return path


@pytest.fixture
def no_trial_in_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker inspects without the trial call, so that the wrong model can be served and the gateway's own
    check seen (requested before portal_url, so that the worker starts with it)."""
    monkeypatch.setenv("PYTHON_TRIAL_CALL", "false")


def test_the_trial_call_refuses_a_python_model_answering_under_another_name(tmp_path: Path, settings: Any) -> None:
    from models_registry.python_trial import python_findings
    from models_registry.validation import ArtifactRejected

    settings.PYTHON_TRIAL_CALL = True
    signature = signature_from_json(SIGNATURE)
    with pytest.raises(ArtifactRejected) as refused:
        python_findings(model_zip(tmp_path / "wrong.zip", "z"), signature, has_requirements=False)
    # Triton drops the output named 'z' (undeclared): the answer holds none.
    assert "output 'y' was not returned (the answer held none; Triton drops outputs named otherwise" in str(
        refused.value)
    assert python_findings(model_zip(tmp_path / "right.zip", "y"), signature, has_requirements=False) == {
        "trial_call": "passed: one call on zeros matched the declared signature"}


def test_an_answer_missing_an_output_is_an_error_naming_it_and_a_wrong_shape_says_the_shape(
    no_trial_in_the_worker: None, alice_tx: Person, portal_url: str, tmp_path: Path
) -> None:
    client = alice_tx.client()
    client.post("/api/v1/models/", {"name": "doubler"}, format="json")
    response = client.post("/api/v1/models/doubler/versions/", {
        "file": SimpleUploadedFile("doubler.zip", model_zip(tmp_path / "doubler.zip", "z").read_bytes()),
        "format": "python", "signature": json.dumps(SIGNATURE)}, format="multipart")
    assert response.status_code == 201, response.json()
    wait_for(lambda: client.get("/api/v1/models/doubler/versions/1/").json()["status"] != "validating", 60,
             what="the worker to inspect the model")
    assert ModelVersion.objects.get(model__name="doubler").status == "ready"  # the trial call is off in the worker
    deploy(alice_tx, "doubler", [{"model": "doubler", "max_batch_size": 8}])
    wait_status(alice_tx, "doubler", "ready", timeout=120)
    url = f"{portal_url}/serve/doubler/v2/models/doubler/infer"
    auth = {"Authorization": f"Bearer {alice_tx.token}"}

    def infer(shape: list[int]) -> requests.Response:
        count = shape[0] * shape[1]
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": [1.0] * count}]}
        return requests.post(url, json=body, headers=auth, timeout=30)

    missing = infer([2, 4])
    assert missing.status_code == 500, missing.text
    assert missing.json()["error"].startswith("Model 'doubler' answered without its output 'y' (declared in its "
                                              "signature)")

    shape = infer([2, 3])
    assert shape.status_code == 400, shape.text
    error = shape.json()["error"]
    assert error == ("Input 'x' of model 'doubler' takes shape [-1, 4] (FP32; the first dimension is the batch, 1 to 8 "
                     "rows per request; -1 is any size); you sent [2, 3].")
    too_many = infer([9, 4])
    assert too_many.status_code == 400, too_many.text
    assert "at most 8 rows per request" in too_many.json()["error"]
    for answer in (shape, too_many):
        assert "request id" not in answer.text and "max_batch_size to zero" not in answer.text
