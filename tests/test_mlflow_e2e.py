"""MLflow pyfunc models served (issue 35): a version fetched from a real tracking server (tests/support/
mlflow_server.py) is imported through the API by the worker, its environment (mlflow-skinny, cloudpickle, pandas)
is built at deploy time over the runtime env, and the sandboxed Triton's answer equals the MLflow model's own
prediction. A pickle that reads the portal's secret when unpickled is unpickled only there, and finds nothing.
Real mlflow server, uvicorn, Celery worker and beat, pip and Triton."""

from __future__ import annotations

import os
import urllib.error
from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pytest

from models_registry.models import ModelVersion
from tests.deploying import deploy, serving, wait_status
from tests.sandbox_helpers import infer, output
from tests.support import mlflow_server as support
from tests.support.mlflow_server import MlflowServer, import_from_mlflow
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SECRET = "mlflow-e2e-planted-secret"


@pytest.fixture
def secret_in_the_portals_environment(monkeypatch: pytest.MonkeyPatch) -> str:
    """SECRET_KEY in the environment of the worker (which starts Triton) and the web server: requested before
    portal_url, so that they start with it."""
    monkeypatch.setenv("SECRET_KEY", SECRET)
    return SECRET


def imported(person: Person, name: str, uri: str) -> ModelVersion:
    """Imported through the API by the worker (tests/support/mlflow_server.py), as a team asks for it."""
    version = import_from_mlflow(person, name, uri)
    assert version.status == "ready", version.error
    assert version.format == "python"
    return version


def _call(deployment: str, model: str, x: np.ndarray) -> np.ndarray:
    try:
        answer = infer(serving(deployment), model, [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                                                     "data": x.flatten().tolist()}])
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"Triton answered {exc.code}: {exc.read()[:2000]!r}") from None
    return np.array(output(answer, "output"), dtype=np.float32).reshape(x.shape)


def test_a_pyfunc_model_answers_in_triton_as_mlflow_predicts(mlflow_for_the_workers: str, alice_tx: Person,
                                                              portal_url: str, mlflow_server: MlflowServer) -> None:
    version = support.log_pyfunc(mlflow_server, "digits-e2e-triple", support.Tripler())
    imported(alice_tx, "triple", f"models:/digits-e2e-triple/{version}")
    deploy(alice_tx, "triple", [{"model": "triple"}])
    wait_status(alice_tx, "triple", "ready", timeout=300)
    x = np.array([[1.5, -2.0, 3.25], [0.0, 10.0, -7.5]], dtype=np.float32)
    expected = mlflow.pyfunc.load_model(f"models:/digits-e2e-triple/{version}").predict(x)
    np.testing.assert_allclose(_call("triple", "triple", x), np.asarray(expected, dtype=np.float32))


def test_a_pyfunc_logged_with_mlflows_default_pins_deploys_on_the_runtimes_numpy(
    mlflow_for_the_workers: str, alice_tx: Person, portal_url: str, mlflow_server: MlflowServer,
) -> None:
    """MLflow pins what the logging machine had, numpy 2.x among it; the runtime env serves numpy 1.26, which no
    environment replaces. The import leaves numpy to it (the environment is the one the pyfunc above built), and
    the weights numpy 2 pickled load in Triton on numpy 1."""
    version = support.log_pyfunc_with_defaults(mlflow_server, "digits-e2e-weighted", support.Weighted())
    uri = f"models:/digits-e2e-weighted/{version}"
    logged = Path(mlflow.pyfunc.get_model_dependencies(uri)).read_text().split()
    assert f"numpy=={np.__version__}" in logged and np.__version__.startswith("2.")
    pushed = imported(alice_tx, "weighted", uri)
    assert "numpy" in pushed.requirements and not any(line.startswith("numpy=") for line in pushed.requirements)
    deploy(alice_tx, "weighted", [{"model": "weighted"}])
    wait_status(alice_tx, "weighted", "ready", timeout=300)
    x = np.array([[1.5, -2.0, 3.25], [0.0, 10.0, -7.5]], dtype=np.float32)
    expected = mlflow.pyfunc.load_model(uri).predict(x)
    np.testing.assert_allclose(_call("weighted", "weighted", x), np.asarray(expected, dtype=np.float32))


def test_a_pyfunc_model_on_columns_takes_one_tensor_a_column(mlflow_for_the_workers: str, alice_tx: Person,
                                                             portal_url: str, mlflow_server: MlflowServer) -> None:
    import pandas as pd

    version = support.log_columns_pyfunc(mlflow_server, "digits-e2e-rowsum")
    pushed = imported(alice_tx, "rowsum", f"models:/digits-e2e-rowsum/{version}")
    assert [(t["name"], t["datatype"], t["dims"]) for t in pushed.signature["inputs"]] == [
        ("a", "FP64", [-1, 1]), ("b", "FP64", [-1, 1])]
    deploy(alice_tx, "rowsum", [{"model": "rowsum"}])
    wait_status(alice_tx, "rowsum", "ready", timeout=300)
    a, b = [1.0, 2.5, -3.0], [10.0, 0.25, 3.0]
    try:
        answer = infer(serving("rowsum"), "rowsum", [{"name": "a", "datatype": "FP64", "shape": [3, 1], "data": a},
                                                     {"name": "b", "datatype": "FP64", "shape": [3, 1], "data": b}])
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"Triton answered {exc.code}: {exc.read()[:2000]!r}") from None
    expected = mlflow.pyfunc.load_model(f"models:/digits-e2e-rowsum/{version}").predict(pd.DataFrame({"a": a, "b": b}))
    assert output(answer, "output") == list(np.asarray(expected, dtype=np.float64))


def test_a_pickle_reading_the_secret_is_unpickled_only_in_the_sandbox_and_finds_nothing(
    secret_in_the_portals_environment: str, mlflow_for_the_workers: str, alice_tx: Person, portal_url: str,
    mlflow_server: MlflowServer, tmp_path: Path,
) -> None:
    marker = tmp_path / "unpickled"
    secret_file = tmp_path / "secret_key"  # as var/secret_key holds a development portal's key
    secret_file.write_text(SECRET)
    # The attempt is real: unpickled here, in a process holding the secret, it finds it (environment and file).
    assert support._snoop(str(tmp_path / "control"), str(secret_file)).found >= 2
    assert os.environ["SECRET_KEY"] == SECRET
    version = support.log_pyfunc(mlflow_server, "digits-e2e-snoop", support.HostilePickle(marker, secret_file))
    marker.unlink(missing_ok=True)  # logging may have loaded it in this process; from here on, nothing may
    imported(alice_tx, "snoop", f"models:/digits-e2e-snoop/{version}")
    assert not marker.exists()  # neither the fetch nor the worker's inspection unpickled it
    deploy(alice_tx, "snoop", [{"model": "snoop"}])
    wait_status(alice_tx, "snoop", "ready", timeout=300)
    server = serving("snoop")
    assert server.sandboxed, server.sandbox_note
    found = _call("snoop", "snoop", np.ones((1, 3), dtype=np.float32))
    assert found.tolist() == [[0.0, 0.0, 0.0]]  # unpickled in Triton's sandbox: no SECRET_KEY anywhere it looked
    assert not marker.exists()  # and the test's folder, where the worker's files are, was out of its reach
