"""A registered model becomes a running Triton with the chosen serving settings, through the API, a real Celery
worker and beat, and the real Triton from nvidia-pytriton; then the faults a user would hit."""

from __future__ import annotations

import concurrent.futures
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from django.conf import settings

from deployments.models import Deployment, Event, TritonServer
from deployments.runtimes.local.triton import is_alive
from models_registry.models import Blob
from models_registry.samples import digits_holdout, train_digits_classifier
from tests.deploying import deploy, push, serving, status_of, wait_status
from tests.processes import start_worker, wait_for
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_digits_deploy_serves_exactly_what_onnxruntime_computes_with_real_batches(
    alice_tx: Person, celery_processes: Any, digits_onnx: Path
) -> None:
    version = push(alice_tx, digits_onnx)
    assert version.status == "ready", version.error
    deploy(alice_tx, "digits-prod", [{"model": "digits", "max_batch_size": 64,
                                      "dynamic_batching": {"max_queue_delay_microseconds": 2000},
                                      "instance_group": {"count": 2, "kind": "cpu"}}])
    body = wait_status(alice_tx, "digits-prod", "ready")
    assert body["models"][0]["instance_group"]["count"] == 2
    server = serving("digits-prod")
    assert server.sandboxed, server.sandbox_note  # the worker process built the sandbox (docs/security.md)
    repository = Path(settings.DEPLOYMENTS_DIR) / str(server.deployment_id) / "r1" / "repository"
    config = (repository / "digits" / "config.pbtxt").read_text()
    assert "max_queue_delay_microseconds: 2000" in config
    assert "count: 2" in config

    X, y = digits_holdout()
    X = X.astype(np.float32)
    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.http_port}")
    labels, probabilities = [], []
    for start in range(0, len(X), 64):  # max_batch_size rows per request
        chunk = X[start : start + 64]
        inputs = [httpclient.InferInput("input", list(chunk.shape), "FP32")]
        inputs[0].set_data_from_numpy(chunk, binary_data=True)
        result = client.infer("digits", inputs)
        # Triton gives a batched vector output (ONNX shape [N]) as [N, 1]: config dims must not be empty.
        labels.append(result.as_numpy("label").reshape(-1))
        probabilities.append(result.as_numpy("probabilities"))
    session = ort.InferenceSession(str(digits_onnx), providers=["CPUExecutionProvider"])
    expected_labels, expected_probabilities = session.run(["label", "probabilities"], {"input": X})
    assert np.array_equal(np.concatenate(labels), expected_labels)
    assert np.allclose(np.concatenate(probabilities), expected_probabilities, atol=1e-6)
    assert np.array_equal(np.concatenate(labels), train_digits_classifier().predict(X))
    assert (np.concatenate(labels) == y).mean() > 0.9

    def one(row: int) -> int:
        single = httpclient.InferInput("input", [1, 64], "FP32")
        single.set_data_from_numpy(X[row : row + 1], binary_data=True)
        local = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.http_port}")
        return int(local.infer("digits", [single]).as_numpy("label").reshape(-1)[0])

    with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
        predicted = list(pool.map(one, range(len(X))))
    assert predicted == list(expected_labels)
    stats = client.get_inference_statistics("digits")["model_stats"][0]
    assert max(int(b["batch_size"]) for b in stats["batch_stats"]) > 1


def test_a_killed_triton_is_back_within_15_seconds_with_an_event(alice_tx: Person, celery_processes: Any,
                                                                 digits_onnx: Path) -> None:
    push(alice_tx, digits_onnx)
    deploy(alice_tx, "digits-prod", [{"model": "digits"}])
    wait_status(alice_tx, "digits-prod", "ready")
    old = serving("digits-prod")
    os.kill(old.pid, signal.SIGKILL)

    def restarted() -> TritonServer | None:
        server = TritonServer.objects.filter(state=TritonServer.State.READY).exclude(pk=old.pk).first()
        deployment = Deployment.objects.get(name="digits-prod")
        return server if server and deployment.status == "ready" and deployment.upstream_url == server.url else None

    new = wait_for(restarted, 15, what="Triton to be restarted")
    assert new.pid != old.pid and is_alive(new.pid)
    died = Event.objects.filter(kind="error", message__contains="died").first()
    assert died is not None and "Revision 1 stopped serving: the Triton process" in died.message


def test_a_task_of_a_killed_worker_still_brings_the_deployment_up(alice_tx: Person, celery_processes: Any,
                                                                  digits_onnx: Path) -> None:
    push(alice_tx, digits_onnx)
    deploy(alice_tx, "digits-prod", [{"model": "digits"}])
    wait_for(lambda: Deployment.objects.filter(status__in=["starting", "ready"]).exists(), 60, interval=0.05,
             what="the deployment to start")
    celery_processes["worker"].send_signal(signal.SIGKILL)
    celery_processes["worker"].wait(timeout=10)
    celery_processes["worker"] = start_worker(Path(settings.VAR_DIR) / "worker-restarted.log")
    wait_status(alice_tx, "digits-prod", "ready", timeout=120)
    assert TritonServer.objects.filter(state=TritonServer.State.READY).count() == 1
    live = [s for s in TritonServer.objects.all() if is_alive(s.pid)]
    assert len(live) == 1  # adopted, not started twice


def test_a_corrupt_model_fails_with_tritons_message_and_disturbs_nothing_else(
    alice_tx: Person, celery_processes: Any, digits_onnx: Path, tmp_path: Path
) -> None:
    push(alice_tx, digits_onnx)
    deploy(alice_tx, "healthy", [{"model": "digits"}])
    wait_status(alice_tx, "healthy", "ready")
    healthy = serving("healthy")
    from tests.artifacts import tiny_onnx

    broken = tmp_path / "broken.onnx"
    broken.write_bytes(tiny_onnx())
    version = push(alice_tx, broken, name="broken")
    blob = Blob.objects.get(pk=version.sha256)
    (Path(settings.ARTIFACT_ROOT) / blob.key).write_bytes(tiny_onnx()[:60])  # the stored bytes rot
    deploy(alice_tx, "broken", [{"model": "broken"}])
    body = wait_status(alice_tx, "broken", "failed")
    assert "failed to start" in body["status_message"]
    assert "broken" in body["status_message"]
    assert Event.objects.filter(deployment__name="broken", kind="error").exists()
    assert status_of(alice_tx, "healthy")["status"] == "ready"
    assert is_alive(healthy.pid)


def test_stop_start_and_delete_leave_no_process_or_file_behind(alice_tx: Person, celery_processes: Any,
                                                               digits_onnx: Path) -> None:
    push(alice_tx, digits_onnx)
    deploy(alice_tx, "digits-prod", [{"model": "digits"}])
    wait_status(alice_tx, "digits-prod", "ready")
    first = serving("digits-prod")
    client = alice_tx.client()
    assert client.post("/api/v1/deployments/digits-prod/stop").status_code == 202
    wait_status(alice_tx, "digits-prod", "stopped")
    assert not is_alive(first.pid)
    assert client.post("/api/v1/deployments/digits-prod/start").status_code == 202
    wait_status(alice_tx, "digits-prod", "ready")
    second = serving("digits-prod")
    assert is_alive(second.pid)
    logs = client.get("/api/v1/deployments/digits-prod/logs/").json()["log"]
    assert "Started HTTPService" in logs or "HTTP" in logs
    deployment_dir = Path(settings.DEPLOYMENTS_DIR) / str(second.deployment_id)
    assert deployment_dir.exists()
    assert client.delete("/api/v1/deployments/digits-prod/").status_code == 202
    assert client.get("/api/v1/deployments/digits-prod/").status_code == 404  # at once, for the user
    wait_for(lambda: not Deployment.objects.exists(), 30, what="the worker to tear the deployment down")
    assert not is_alive(second.pid)
    assert not deployment_dir.exists()
    assert client.get("/api/v1/deployments/digits-prod/").status_code == 404
