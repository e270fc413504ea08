"""One network in three formats, end to end: uploaded through the API, inspected by a real Celery worker (the
SavedModel's signature read from its file, the TorchScript run once on zeros in the runtime env), deployed on the
local runtime and queried through the gateway over real HTTP. The CNN as ONNX, TorchScript and SavedModel gives
the same scores, and Triton's statistics show dynamic batching of each under concurrent load.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import tritonclient.http as httpclient
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile

from deployments.runtimes.local import readiness
from deployments.runtimes.local import triton as local_triton
from models_registry.models import ModelVersion
from models_registry.samples import (
    RESNET_ATOL,
    RESNET_RTOL,
    RESNET_SIGNATURE,
    make_resnet_framework_models,
    make_resnet_onnx,
    resnet_inputs,
    resnet_onnx_scores,
)
from tests.deploying import deploy, serving, wait_status
from tests.processes import wait_for
from tests.support.people import Person, make_person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.frameworks,
              pytest.mark.django_db(transaction=True)]

FORMATS = {"resnet-onnx": "resnet.onnx", "resnet-pt": "resnet.pt", "resnet-tf": "resnet.savedmodel.zip"}


@pytest.fixture(scope="module")
def cnn_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cnn")
    make_resnet_onnx(folder / "resnet.onnx")
    make_resnet_framework_models(folder, Path(settings.MODELPORT_RUNTIME_ENV) / "bin" / "python",
                                 {"torch", "tensorflow"})
    return folder


def upload(person: Person, name: str, path: Path, **fields: str) -> ModelVersion:
    client = person.client()
    client.post("/api/v1/models/", {"name": name}, format="json")
    response = client.post(f"/api/v1/models/{name}/versions/",
                           {"file": SimpleUploadedFile(path.name, path.read_bytes()), **fields}, format="multipart")
    assert response.status_code == 201, response.json()
    number = response.json()["number"]
    # The TorchScript trial run imports torch in a subprocess: seconds, more on a busy machine.
    wait_for(lambda: client.get(f"/api/v1/models/{name}/versions/{number}/").json()["status"] != "validating",
             120, what=f"the worker to inspect {name}")
    return ModelVersion.objects.get(model__name=name, number=number)


def test_the_cnn_as_onnx_torchscript_and_savedmodel_scores_the_same_through_the_gateway_and_batches(
    transactional_db: Any, celery_processes: Any, portal_url: str, cnn_files: Path
) -> None:
    alice = make_person("alice", "acme", role="admin")
    signature = json.dumps(RESNET_SIGNATURE.to_json())
    versions = {
        "resnet-onnx": upload(alice, "resnet-onnx", cnn_files / "resnet.onnx"),
        "resnet-pt": upload(alice, "resnet-pt", cnn_files / "resnet.pt", signature=signature),
        "resnet-tf": upload(alice, "resnet-tf", cnn_files / "resnet.savedmodel.zip"),
    }
    for name, version in versions.items():
        assert version.status == "ready", (name, version.error)
        assert version.parsed_signature == RESNET_SIGNATURE, name  # the SavedModel's read from its own file
    assert versions["resnet-pt"].definition == {"trial_run": "passed: one call on zeros matched the declared signature"}
    assert versions["resnet-tf"].definition["signature_def"] == "serving_default"

    # A declaration the TorchScript contradicts is caught by the trial run, not at deploy time.
    wrong = json.dumps({"inputs": RESNET_SIGNATURE.to_json()["inputs"],
                        "outputs": [{"name": "logits", "datatype": "FP32", "dims": [-1, 1000]}]})
    refused = upload(alice, "resnet-pt", cnn_files / "resnet.pt", signature=wrong)
    assert refused.status == "invalid"
    assert "output 'logits' has shape [2, 10], declared dims [-1, 1000]" in refused.error

    batching = {"max_queue_delay_microseconds": 20_000}
    deploy(alice, "cnn", [{"model": name, "version": 1, "dynamic_batching": batching} for name in FORMATS])
    wait_status(alice, "cnn", "ready", timeout=300)

    auth = {"Authorization": f"Bearer {alice.token}"}
    gateway = httpclient.InferenceServerClient(url=f"{portal_url.removeprefix('http://')}/serve/cnn")
    images = resnet_inputs(4, seed=5)
    expected = resnet_onnx_scores(images)
    scores = {}
    for name in FORMATS:
        tensor = httpclient.InferInput("input", list(images.shape), "FP32")
        tensor.set_data_from_numpy(images, binary_data=True)
        scores[name] = gateway.infer(name, [tensor], headers=dict(auth)).as_numpy("logits")
        assert np.allclose(scores[name], expected, rtol=RESNET_RTOL, atol=RESNET_ATOL), name
    assert np.allclose(scores["resnet-pt"], scores["resnet-tf"], rtol=RESNET_RTOL, atol=RESNET_ATOL)

    # Concurrent single-image requests through the gateway: each answer right, and Triton ran them in batches.
    server = serving("cnn")
    process = local_triton.ServerProcess(pid=server.pid, http_port=server.http_port, grpc_port=server.grpc_port,
                                         metrics_port=server.metrics_port, started_at=server.started_at,
                                         log_path=Path(server.log_path))
    many = resnet_inputs(32, seed=9)
    many_expected = resnet_onnx_scores(many)

    async def load(model: str) -> list[tuple[int, Any]]:
        url = f"{portal_url}/serve/cnn/v2/models/{model}/infer"
        queue = list(range(len(many)))
        answers: list[tuple[int, Any]] = [(0, None)] * len(many)

        async def client(session: aiohttp.ClientSession) -> None:
            while queue:
                i = queue.pop(0)
                payload = {"inputs": [{"name": "input", "shape": [1, 3, 64, 64], "datatype": "FP32",
                                       "data": many[i].ravel().tolist()}]}
                async with session.post(url, json=payload) as response:
                    answers[i] = (response.status, await response.json())

        async with aiohttp.ClientSession(headers=auth) as session:
            await asyncio.gather(*(client(session) for _ in range(12)))
        return answers

    for name in FORMATS:
        for i, (status, answer) in enumerate(asyncio.run(load(name))):
            assert status == 200, (name, answer)
            logits = np.array(answer["outputs"][0]["data"], dtype=np.float32).reshape(1, 10)
            assert np.allclose(logits, many_expected[i : i + 1], rtol=RESNET_RTOL, atol=RESNET_ATOL), name
        stats = readiness.model_stats(process, name)
        sizes = {int(s["batch_size"]): int(s["compute_infer"]["count"]) for s in stats["batch_stats"]}  # type: ignore[attr-defined]
        print(f"{name}: executions per batch size {sizes}")
        assert max(sizes) > 1, (name, sizes)
