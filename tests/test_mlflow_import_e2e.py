"""Deploy from MLflow (issue 35), end to end: the digits ONNX model registered in a real `mlflow server`
(tests/support/mlflow_server.py) with MLflow's own API, imported through the portal's API by its `models:/` URI, the
version READY after the worker's fetch and inspection, deployed on the real local Triton, and answering exactly
what onnxruntime computes from the model as it was logged. Real mlflow server, Celery worker and beat, and Triton."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from models_registry.samples import digits_holdout
from tests.deploying import deploy, serving, wait_status
from tests.support import mlflow_server as support
from tests.support.mlflow_server import MlflowServer, import_from_mlflow
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def register_onnx(server: MlflowServer, name: str, path: Path) -> str:
    """`path` logged with mlflow.onnx and registered as a new version of `name`; the version."""
    from mlflow.models import infer_signature

    mlflow.set_tracking_uri(server.url)
    X, _ = digits_holdout()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with mlflow.start_run():
        info = mlflow.onnx.log_model(onnx.load(str(path)), name="model", registered_model_name=name,
                                     signature=infer_signature(X[:2], session.run(["label"], {"input": X[:2]})[0]),
                                     pip_requirements=["onnx", "onnxruntime"])
    return str(info.registered_model_version)


def test_an_onnx_model_registered_in_mlflow_is_imported_deployed_and_answers_as_onnxruntime(
    mlflow_for_the_workers: str, alice_tx: Person, celery_processes: Any, mlflow_server: MlflowServer,
    digits_onnx: Path,
) -> None:
    started = time.monotonic()
    registered = register_onnx(mlflow_server, "digits-mlflow", digits_onnx)
    version = import_from_mlflow(alice_tx, "digits", f"models:/digits-mlflow/{registered}")
    assert version.status == "ready", version.error
    assert version.format == "onnx"
    source = alice_tx.client().get("/api/v1/models/digits/versions/1/").json()["source"]
    assert source["kind"] == "mlflow" and source["uri"] == f"models:/digits-mlflow/{registered}"
    fetched = source["fetched"]
    assert fetched["registry_version"] == registered and fetched["run_id"] and fetched["flavor"] == "onnx"
    assert set(fetched["files"]) >= {"MLmodel", "model.onnx"}
    imported = time.monotonic()

    deploy(alice_tx, "digits-from-mlflow", [{"model": "digits"}])
    wait_status(alice_tx, "digits-from-mlflow", "ready", timeout=120)
    server = serving("digits-from-mlflow")
    assert server.sandboxed, server.sandbox_note

    X, _ = digits_holdout()
    X = X[:64]
    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.http_port}")
    inputs = [httpclient.InferInput("input", list(X.shape), "FP32")]
    inputs[0].set_data_from_numpy(X, binary_data=True)
    result = client.infer("digits", inputs)
    session = ort.InferenceSession(str(digits_onnx), providers=["CPUExecutionProvider"])
    labels, probabilities = session.run(["label", "probabilities"], {"input": X})
    assert np.array_equal(result.as_numpy("label").reshape(-1), labels)
    assert np.allclose(result.as_numpy("probabilities"), probabilities, atol=1e-6)
    print(f"imported in {imported - started:.1f} s, deployed and answered in {time.monotonic() - imported:.1f} s")


def test_a_pickle_imported_through_the_api_is_never_unpickled_by_the_worker(
    mlflow_for_the_workers: str, alice_tx: Person, celery_processes: Any, mlflow_server: MlflowServer,
    tmp_path: Path,
) -> None:
    """The worker's fetch and inspection hold the portal's settings and can write here: had either unpickled
    python_model.pkl, the mark would be in tmp_path (in the sandbox it could not be: tests/test_mlflow_e2e.py)."""
    marker = tmp_path / "unpickled"
    registered = support.log_pyfunc(mlflow_server, "digits-snoop",
                                    support.HostilePickle(marker, tmp_path / "secret_key"))
    marker.unlink(missing_ok=True)  # logging may have loaded it in this process; from here on, nothing may
    version = import_from_mlflow(alice_tx, "snoop", f"models:/digits-snoop/{registered}")
    assert version.status == "ready", version.error
    assert version.format == "python"
    assert not marker.exists()


def test_a_pickled_pytorch_model_is_refused_by_the_worker_without_being_unpickled(
    mlflow_for_the_workers: str, alice_tx: Person, celery_processes: Any, mlflow_server: MlflowServer,
    tmp_path: Path,
) -> None:
    """mlflow.pytorch.log_model(nn.Module)'s layout, its torch.save data.pkl a pickle that leaves a mark in tmp_path
    when unpickled (the worker can write there): the import is invalid, saying to log TorchScript, and no mark."""
    marker = tmp_path / "unpickled"
    files = support.pickled_pytorch_files(marker)
    registered = support.register_artifacts(mlflow_server, "digits-torch-pickled", files, tmp_path / "logged")
    version = import_from_mlflow(alice_tx, "pickled", f"models:/digits-torch-pickled/{registered}")
    assert version.status == "invalid"
    assert "not TorchScript" in version.error and "mlflow.pytorch.log_model(torch.jit.script(model), ...)" in \
        version.error
    assert not marker.exists()


def test_a_link_to_etc_in_the_artifact_tree_makes_the_import_invalid_naming_it(
    mlflow_for_the_workers: str, alice_tx: Person, celery_processes: Any, mlflow_server: MlflowServer,
    tmp_path: Path,
) -> None:
    experiment = support.local_experiment(mlflow_server, "e2e-local-links")
    registered = support.log_onnx(mlflow_server, "digits-linked", experiment_id=experiment)
    (support.artifact_folder(mlflow_server, "digits-linked", registered) / "config").symlink_to("/etc")
    version = import_from_mlflow(alice_tx, "linked", f"models:/digits-linked/{registered}")
    assert version.status == "invalid"
    assert "symbolic link, 'config' -> '/etc'" in version.error
