"""Deploy from MLflow (issue 35), end to end, in the framework flavors: y = x @ W + b as a TorchScript model (the
`pytorch` flavor) and as a tf.Module SavedModel (the `tensorflow` flavor), registered in a real `mlflow server`
(tests/support/mlflow_server.py) through MLflow's own client API, imported through the portal's API by its
`models:/` URI on a real Celery worker, deployed on the real local Triton, and answering what the model answered in
the process that made it.

Each model is made, and its answer to a fixed input computed, by the runtime env's python (it has torch and
TensorFlow; tests/support/mlflow_framework_models.py). mlflow.pytorch.log_model and mlflow.tensorflow.log_model
themselves need the framework in the same environment as mlflow, which the test environment (where mlflow is)
lacks: the files are laid out as those calls lay them out, the MLmodel file written by MLflow's own Model and
pyfunc.add_to_model with the signature MLflow infers, then logged with mlflow.log_artifacts and registered with
MlflowClient.create_registered_model / create_model_version (support.register_artifacts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from django.conf import settings

from modelport.core.signature import parse_signature
from tests.deploying import deploy, serving, wait_status
from tests.support import mlflow_server as support
from tests.support.mlflow_server import FrameworkModel, MlflowServer, import_from_mlflow
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def made_and_registered(server: MlflowServer, flavor: str, registered_name: str,
                        tmp_path: Path) -> tuple[FrameworkModel, str]:
    runtime_python = Path(settings.MODELPORT_RUNTIME_ENV) / "bin" / "python"
    model = support.framework_model_as_logged(flavor, runtime_python, tmp_path / "made")
    return model, support.register_artifacts(server, registered_name, model.files, tmp_path / "logged")


def deployed_answer(person: Person, deployment: str, model: str, input_name: str, value: np.ndarray,
                    output_name: str) -> np.ndarray:
    """`model` deployed alone as `deployment` on the local Triton, and its answer to `value`, asked of it directly."""
    deploy(person, deployment, [{"model": model}])
    wait_status(person, deployment, "ready", timeout=300)
    server = serving(deployment)
    assert server.sandboxed, server.sandbox_note
    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.http_port}")
    tensor = httpclient.InferInput(input_name, list(value.shape), "FP32")
    tensor.set_data_from_numpy(value, binary_data=True)
    answer = client.infer(model, [tensor]).as_numpy(output_name)
    assert answer is not None
    return answer


def fetched_record(person: Person, model: str) -> dict[str, Any]:
    source: dict[str, Any] = person.client().get(f"/api/v1/models/{model}/versions/1/").json()["source"]
    return source["fetched"]


@pytest.mark.frameworks("torch")
def test_a_torchscript_model_registered_in_mlflow_is_imported_deployed_and_answers_as_the_original(
    mlflow_for_the_workers: str, alice_tx: Person, celery_processes: Any, mlflow_server: MlflowServer,
    tmp_path: Path,
) -> None:
    model, registered = made_and_registered(mlflow_server, "pytorch", "digits-affine-torch", tmp_path)
    version = import_from_mlflow(alice_tx, "affine-torch", f"models:/digits-affine-torch/{registered}")
    assert version.status == "ready", version.error
    assert version.format == "torchscript"
    # MLflow's unnamed tensor specs as `input` and `output`; forward(x) takes them by position.
    assert version.parsed_signature == parse_signature({
        "inputs": [{"name": "input", "datatype": "FP32", "dims": [-1, 3]}],
        "outputs": [{"name": "output", "datatype": "FP32", "dims": [-1, 2]}]})
    assert version.definition["trial_run"].startswith("passed"), version.definition
    fetched = fetched_record(alice_tx, "affine-torch")
    assert fetched["flavor"] == "pytorch" and fetched["registry_version"] == registered
    assert set(fetched["files"]) >= {"MLmodel", "data/model.pth", "requirements.txt"}

    answer = deployed_answer(alice_tx, "affine-torch-from-mlflow", "affine-torch", "input", model.input, "output")
    assert answer.shape == model.expected.shape
    assert np.allclose(answer, model.expected, atol=1e-6), (answer, model.expected)


@pytest.mark.frameworks("tensorflow")
def test_a_tf_module_savedmodel_registered_in_mlflow_is_imported_deployed_and_answers_as_the_original(
    mlflow_for_the_workers: str, alice_tx: Person, celery_processes: Any, mlflow_server: MlflowServer,
    tmp_path: Path,
) -> None:
    model, registered = made_and_registered(mlflow_server, "tensorflow", "digits-affine-tf", tmp_path)
    version = import_from_mlflow(alice_tx, "affine-tf", f"models:/digits-affine-tf/{registered}")
    assert version.status == "ready", version.error
    assert version.format == "tensorflow_savedmodel"
    # The SavedModel's own serving signature (its __call__'s argument, TensorFlow's output_0), read from its file.
    assert version.parsed_signature == parse_signature({
        "inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 3]}],
        "outputs": [{"name": "output_0", "datatype": "FP32", "dims": [-1, 2]}]})
    fetched = fetched_record(alice_tx, "affine-tf")
    assert fetched["flavor"] == "tensorflow" and fetched["registry_version"] == registered
    assert set(fetched["files"]) >= {"MLmodel", "tf2model/saved_model.pb", "tf2model/variables/variables.index"}

    answer = deployed_answer(alice_tx, "affine-tf-from-mlflow", "affine-tf", "x", model.input, "output_0")
    assert answer.shape == model.expected.shape
    assert np.allclose(answer, model.expected, atol=1e-6), (answer, model.expected)
