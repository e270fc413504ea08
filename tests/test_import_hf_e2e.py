"""Deploy from Hugging Face (issue 35), end to end: an ONNX export on a local hub-compatible endpoint
(tests/support/hf_hub_server.py) imported through the API by a real Celery worker, inspected, deployed on the real
local Triton, and answering exactly what onnxruntime computes from the same bytes; and a model.py with safetensors
weights, deployed on Triton's python backend, answering with those weights."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from tests.deploying import deploy, serving, wait_status
from tests.processes import wait_for
from tests.support.hf_hub_server import ONNX_COMMIT, PYTHON_COMMIT, HubServer, running_hub, standard_repos, tiny_onnx
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def hf_hub_for_workers(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """The local hub, with HF_ENDPOINT in the environment the worker processes inherit: requested before
    celery_processes, so that the worker starts pointing at it."""
    with running_hub(standard_repos()) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("IMPORT_HUGGINGFACE_REPOS", "acme/*")
        yield hub


def test_an_onnx_export_from_the_hub_deploys_and_answers_like_onnxruntime(
    alice_tx: Person, hf_hub_for_workers: HubServer, celery_processes: Any
) -> None:
    client = alice_tx.client()
    created = client.post("/api/v1/models/tiny/versions/", {
        "source": {"kind": "huggingface", "repo": "acme/tiny-onnx", "revision": "v1"}, "create_model": True},
        format="json")
    assert created.status_code == 201, created.json()
    number = created.json()["number"]

    def settled() -> dict[str, Any] | None:
        body: dict[str, Any] = client.get(f"/api/v1/models/tiny/versions/{number}/").json()
        return body if body["status"] not in ("importing", "validating") else None

    version = wait_for(settled, 60, what="the worker to import and inspect the version")
    assert version["status"] == "ready", version["error"]
    assert version["source"]["fetched"]["commit"] == ONNX_COMMIT
    assert any(item.path.startswith("/cdn/") for item in hf_hub_for_workers.received)

    deploy(alice_tx, "tiny-prod", [{"model": "tiny", "max_batch_size": 8}])
    wait_status(alice_tx, "tiny-prod", "ready")
    server = serving("tiny-prod")
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    inputs = [httpclient.InferInput("x", list(x.shape), "FP32")]
    inputs[0].set_data_from_numpy(x, binary_data=True)
    answer = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.http_port}").infer("tiny", inputs)
    session = ort.InferenceSession(tiny_onnx(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(["y"], {"x": x})
    assert np.array_equal(answer.as_numpy("y"), expected)
    assert np.allclose(expected, x * 2 + 1)


def test_a_model_py_with_safetensors_from_the_hub_deploys_and_answers_with_its_weights(
    alice_tx: Person, hf_hub_for_workers: HubServer, celery_processes: Any
) -> None:
    client = alice_tx.client()
    created = client.post("/api/v1/models/scaler/versions/", {
        "source": {"kind": "huggingface", "repo": "acme/tiny-python"}, "create_model": True}, format="json")
    assert created.status_code == 201, created.json()
    number = created.json()["number"]

    def settled() -> dict[str, Any] | None:
        body: dict[str, Any] = client.get(f"/api/v1/models/scaler/versions/{number}/").json()
        return body if body["status"] not in ("importing", "validating") else None

    version = wait_for(settled, 90, what="the worker to import and inspect the python model")
    assert version["status"] == "ready", version["error"]
    assert version["format"] == "python"
    assert version["source"]["fetched"]["commit"] == PYTHON_COMMIT

    deploy(alice_tx, "scaler-prod", [{"model": "scaler"}])
    wait_status(alice_tx, "scaler-prod", "ready", timeout=180)
    server = serving("scaler-prod")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inputs = [httpclient.InferInput("x", list(x.shape), "FP32")]
    inputs[0].set_data_from_numpy(x, binary_data=True)
    answer = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.http_port}").infer("scaler", inputs)
    # y = x * scale + bias with the weights of the repository's model.safetensors (python_weights()).
    assert np.allclose(answer.as_numpy("y"), x * np.array([1, 2, 3, 4], dtype=np.float32) + 0.5)
