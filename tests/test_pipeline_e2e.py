"""The reference pipeline end to end on the local runtime: PNG images of held-out digits go through the gateway into
a Triton ensemble (preprocess: python + Pillow -> digits: ONNX with dynamic batching -> postprocess: python top 3)
and come back classified. Real uvicorn, Celery worker and beat, Triton; the stock tritonclient as the client."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile

from models_registry.models import ModelVersion
from models_registry.samples import (
    digits_holdout,
    digits_png,
    make_digits_onnx,
    make_digits_pipeline_json,
    make_postprocess_zip,
    make_preprocess_zip,
    train_digits_classifier,
)
from tests.deploying import deploy, push, serving, wait_status
from tests.processes import wait_for
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

THREADS = 16


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `manage.py make_sample_models` writes for the pipeline."""
    directory = tmp_path_factory.mktemp("samples")
    make_digits_onnx(directory / "digits.onnx")
    make_preprocess_zip(directory / "preprocess.zip")
    make_postprocess_zip(directory / "postprocess.zip")
    make_digits_pipeline_json(directory / "digits-pipeline.json")
    return directory


def push_python(person: Person, samples: Path, name: str) -> ModelVersion:
    client = person.client()
    client.post("/api/v1/models/", {"name": name}, format="json")
    response = client.post(f"/api/v1/models/{name}/versions/", {
        "file": SimpleUploadedFile(f"{name}.zip", (samples / f"{name}.zip").read_bytes()),
        "format": "python",
        "signature": (samples / f"{name}.signature.json").read_text(),
    }, format="multipart")
    assert response.status_code == 201, response.json()
    wait_for(lambda: client.get(f"/api/v1/models/{name}/versions/1/").json()["status"] != "validating", 30,
             what=f"the worker to inspect {name}")
    version = ModelVersion.objects.get(model__name=name, number=1)
    assert version.status == "ready", version.error
    return version


def test_png_digits_are_classified_through_the_pipeline_with_batches_on_the_classifier(
    alice_tx: Person, portal_url: str, samples: Path
) -> None:
    alice = alice_tx
    assert push(alice, samples / "digits.onnx").status == "ready"
    preprocess = push_python(alice, samples, "preprocess")
    push_python(alice, samples, "postprocess")
    assert preprocess.definition == {"requirements": ["numpy", "pillow"]}

    client = alice.client()
    client.post("/api/v1/models/", {"name": "digits-pipeline"}, format="json")
    definition = json.loads((samples / "digits-pipeline.json").read_text())
    created = client.post("/api/v1/models/digits-pipeline/versions/", {"format": "ensemble", "definition": definition},
                          format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["status"] == "ready" and created.json()["max_batch_size"] == 64

    deploy(alice, "digits-pipeline", [
        {"model": "digits-pipeline"},
        {"model": "digits", "dynamic_batching": {"max_queue_delay_microseconds": 5000}},
    ])
    body = wait_status(alice, "digits-pipeline", "ready", timeout=120)
    assert {m["model"] for m in body["models"]} == {"digits-pipeline", "preprocess", "digits", "postprocess"}
    server = serving("digits-pipeline")
    assert server.sandboxed, server.sandbox_note  # Pillow and numpy steps run confined, with the same answers
    repository = Path(settings.DEPLOYMENTS_DIR) / str(server.deployment_id) / "r1" / "repository"
    assert "max_queue_delay_microseconds: 5000" in (repository / "digits" / "config.pbtxt").read_text()
    for step in ("preprocess", "postprocess", "digits-pipeline"):
        assert "dynamic_batching" not in (repository / step / "config.pbtxt").read_text(), step

    X, y = digits_holdout()
    images = digits_png(X)
    assert len(images) >= 200
    expected = train_digits_classifier().predict(X)
    auth = {"Authorization": f"Bearer {alice.token}"}
    local = threading.local()

    def gateway() -> httpclient.InferenceServerClient:
        if not hasattr(local, "client"):
            local.client = httpclient.InferenceServerClient(
                url=f"{portal_url.removeprefix('http://')}/serve/digits-pipeline")
        return local.client  # type: ignore[no-any-return]

    def classify(batch: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        tensor = httpclient.InferInput("image", [len(batch), 1], "BYTES")
        tensor.set_data_from_numpy(np.array(batch, dtype=np.object_).reshape(-1, 1), binary_data=True)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("labels", "scores")]
        result = gateway().infer("digits-pipeline", [tensor], outputs=outputs, headers=dict(auth))
        return result.as_numpy("labels"), result.as_numpy("scores")

    # One request with several images: the batch dimension works through every step.
    labels, scores = classify(images[:8])
    assert labels.shape == (8, 3) and scores.shape == (8, 3) and scores.dtype == np.float32
    assert [int(row[0]) for row in labels] == list(expected[:8])

    direct = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.http_port}")

    def classifier_batches() -> dict[int, int]:
        stats = direct.get_inference_statistics("digits")["model_stats"][0]
        return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}

    # One image per request from 16 threads: concurrent load the classifier can batch.
    before = classifier_batches()
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=THREADS) as pool:
        results = list(pool.map(lambda image: classify([image]), images))
    elapsed = time.monotonic() - started
    top = np.array([int(labels[0][0]) for labels, _ in results])
    top_scores = np.stack([scores[0] for _, scores in results])
    accuracy = float((top == y).mean())
    agreement = float((top == expected).mean())
    assert all(len({label for label in labels[0]}) == 3 for labels, _ in results)  # three different labels
    assert (np.diff(top_scores, axis=1) <= 1e-6).all() and (top_scores >= 0).all() and (top_scores <= 1).all()
    assert accuracy >= 0.9, accuracy
    assert agreement >= 0.9, agreement

    # Triton's statistics for the classifier alone (through its own port): the batches it ran under that load.
    batch_sizes = {size: count - before.get(size, 0) for size, count in classifier_batches().items()
                   if count > before.get(size, 0)}
    print(f"\n{len(images)} PNG images through the gateway, {THREADS} threads: accuracy {accuracy:.4f}, agreement with "
          f"the classifier on raw features {agreement:.4f}, {len(images) / elapsed:.0f} images/s; "
          f"classifier batches (size: count) {dict(sorted(batch_sizes.items()))}")
    assert max(batch_sizes) > 1, batch_sizes

    # Bytes that are no image are the caller's error (issue 25): a 400 in words about the input, through the
    # ensemble and the gateway, not a 500 carrying Pillow's repr of a BytesIO.
    bad = requests.post(f"{portal_url}/serve/digits-pipeline/v2/models/digits-pipeline/infer", headers=auth, json={
        "inputs": [{"name": "image", "datatype": "BYTES", "shape": [1, 1], "data": ["not an image"]}]}, timeout=30)
    assert bad.status_code == 400, bad.text
    assert "the input 'image' is not an image file (PNG, JPEG, ...)" in bad.json()["error"]
    assert "BytesIO" not in bad.text and "0x" not in bad.text and "request id" not in bad.text
