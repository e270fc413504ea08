"""A real MLflow tracking server for the import tests (issue 35): `mlflow server` (mlflow 3, from requirements-dev)
with a SQLite backend store and artifacts served through it (--serve-artifacts, `mlflow-artifacts:` locations),
started as a subprocess on a free port, polled until /health answers, and killed at teardown. Models are logged and
registered with MLflow's own API, so the layouts the fetcher reads are MLflow's, not ours.

An experiment created with `local_experiment` keeps its artifacts in a plain folder (`file:`), as a server run
with --default-artifact-root file:... does: the worker reads that folder itself, which is where a link planted in
an artifact tree would bite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
from mlflow.pyfunc import PythonModel

START_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class MlflowServer:
    url: str
    root: Path  # holds the store, the served artifacts and the local experiments' folders


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_mlflow_server(root: Path) -> Iterator[MlflowServer]:
    root.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
               "--backend-store-uri", f"sqlite:///{root / 'store.sqlite'}", "--serve-artifacts",
               "--artifacts-destination", (root / "served").as_uri(), "--workers", "1"]
    log = open(root / "server.log", "ab")  # noqa: SIM115 - kept open for the process' lifetime
    # No job runner: it is MLflow's GenAI evaluation queue (seven huey consumers, a store left in /dev/shm), which
    # the registry does not use, and it doubles the server's start and stop.
    env = {**os.environ, "MLFLOW_TRACKING_URI": "", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    process = subprocess.Popen(command, cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            if process.poll() is not None:
                raise AssertionError(f"mlflow server exited {process.returncode}: "
                                     f"{(root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"mlflow server did not answer /health in {START_TIMEOUT_SECONDS} s")
            time.sleep(0.2)
        yield MlflowServer(url=url, root=root)
    finally:
        # Its own session: the gunicorn/uvicorn workers it spawned go with it.
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def _mlflow(server: MlflowServer) -> Any:
    mlflow.set_tracking_uri(server.url)
    return mlflow


def local_experiment(server: MlflowServer, name: str) -> str:
    """An experiment whose artifacts lie in a plain folder under server.root; its id."""
    mlflow = _mlflow(server)
    existing = mlflow.get_experiment_by_name(name)
    if existing is not None:
        return str(existing.experiment_id)
    return str(mlflow.create_experiment(name, artifact_location=(server.root / "local" / name).as_uri()))


def scaling_onnx(factor: float = 2.0) -> Any:
    """A tiny ONNX model: y = factor * x, x FP32 [-1, 3]."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [1], [factor])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "scale"], ["y"])], "scale", [x], [y], [scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def doubling_onnx() -> Any:
    """y = 2 * x, x FP32 [-1, 3]."""
    return scaling_onnx(2.0)


EXAMPLE = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32)


def log_onnx(server: MlflowServer, name: str, experiment_id: str | None = None, factor: float = 2.0) -> str:
    """Registers the scaling ONNX model (y = factor * x; doubling by default) as a new version of `name`; the
    version."""
    mlflow = _mlflow(server)
    from mlflow.models import infer_signature

    with mlflow.start_run(experiment_id=experiment_id):
        # Requirements given: inferring them loads the model in a child process, 2 s a model.
        info = mlflow.onnx.log_model(scaling_onnx(factor), name="model", registered_model_name=name,
                                     signature=infer_signature(EXAMPLE, EXAMPLE * factor),
                                     pip_requirements=["onnx", "onnxruntime"])
    return str(info.registered_model_version)


class Tripler(PythonModel):
    """A pyfunc model: its answer is three times its input (pickled by value, see log_pyfunc)."""

    def predict(self, context, model_input, params=None):  # untyped: MLflow reads hints as a schema
        return np.asarray(model_input, dtype=np.float32) * 3


class RowSum(PythonModel):
    """A pyfunc model on columns: a DataFrame of `a` and `b` in, their sum per row out (a column signature)."""

    def predict(self, context, model_input, params=None):  # untyped: MLflow reads hints as a schema
        return model_input["a"] + model_input["b"]


def log_columns_pyfunc(server: MlflowServer, name: str) -> str:
    import cloudpickle
    import pandas as pd
    from mlflow.models import infer_signature

    mlflow = _mlflow(server)
    frame = pd.DataFrame({"a": [1.0, 2.0], "b": [0.5, -4.0]})
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        with mlflow.start_run():
            info = mlflow.pyfunc.log_model(name="model", python_model=RowSum(), registered_model_name=name,
                                           signature=infer_signature(frame, frame["a"] + frame["b"]),
                                           pip_requirements=[f"mlflow=={mlflow.__version__}",
                                                             f"cloudpickle=={cloudpickle.__version__}"])
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    return str(info.registered_model_version)


class Snoop(PythonModel):
    """Answers with how many places held the portal's secret when it was unpickled (0 in the sandbox)."""

    def __init__(self, found: int) -> None:
        self.found = found

    def predict(self, context, model_input, params=None):  # untyped: MLflow reads hints as a schema
        return np.asarray(model_input, dtype=np.float32) * 0 + self.found


def _snoop(marker: str, secret_file: str) -> Snoop:
    """What the hostile pickle runs when it is unpickled: leave a mark, then look for the portal's secret in the
    places a process could read it from (its environment, the portal's through /proc, a secret key file)."""
    import os as _os

    try:  # inside a sandbox the test's folder is out of reach: the mark is only left where it can be
        with open(marker, "a") as stream:
            stream.write(f"unpickled in pid {_os.getpid()}\n")
    except OSError:
        pass
    found = 0
    if _os.environ.get("SECRET_KEY"):
        found += 1
    for path in ("/proc/1/environ", f"/proc/{_os.getppid()}/environ", secret_file):
        try:
            with open(path, "rb") as stream:
                data = stream.read()
                found += b"SECRET_KEY" in data or path == secret_file
        except OSError:
            pass
    return Snoop(found)


class HostilePickle(PythonModel):
    """Unpickled, it calls _snoop(marker): the stand-in for a python_model.pkl that reads SECRET_KEY."""

    def __init__(self, marker: Path, secret_file: Path) -> None:
        self.marker = str(marker)
        self.secret_file = str(secret_file)

    def predict(self, context, model_input, params=None):  # untyped: MLflow reads hints as a schema
        return model_input

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return _snoop, (self.marker, self.secret_file)


def log_pyfunc(server: MlflowServer, name: str, python_model: Any, experiment_id: str | None = None) -> str:
    """Registers a pyfunc model; the version. This module is pickled by value: the sandbox cannot import tests."""
    import cloudpickle

    mlflow = _mlflow(server)
    from mlflow.models import infer_signature

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        with mlflow.start_run(experiment_id=experiment_id):
            # numpy unpinned: MLflow would pin this process's (2.x), and the runtime env serves with its own (1.26),
            # a conflict pip reports at deploy time. A model meant for Triton states what it needs of the serving env.
            info = mlflow.pyfunc.log_model(name="model", python_model=python_model, registered_model_name=name,
                                           signature=infer_signature(EXAMPLE, EXAMPLE * 3),
                                           pip_requirements=[f"mlflow=={mlflow.__version__}",
                                                             f"cloudpickle=={cloudpickle.__version__}", "numpy"])
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    return str(info.registered_model_version)


def set_alias(server: MlflowServer, name: str, alias: str, version: str) -> None:
    from mlflow import MlflowClient

    MlflowClient(tracking_uri=server.url).set_registered_model_alias(name, alias, version)


def artifact_folder(server: MlflowServer, name: str, version: str) -> Path:
    """The local folder of a version logged into a local_experiment."""
    from urllib.parse import urlparse

    from mlflow import MlflowClient

    uri = MlflowClient(tracking_uri=server.url).get_model_version_download_uri(name, version)
    return Path(urlparse(uri).path)


def import_from_mlflow(person: Any, name: str, uri: str) -> Any:
    """The import as a team asks for it: a source instead of a file, the model created with it; then the version
    polled (importing, validating) until the worker is done with it."""
    from models_registry.models import ModelVersion
    from tests.processes import wait_for

    client = person.client()
    response = client.post(f"/api/v1/models/{name}/versions/",
                           {"source": {"kind": "mlflow", "uri": uri}, "create_model": True}, format="json")
    assert response.status_code in (201, 202), response.json()
    number = response.json()["number"]
    wait_for(lambda: client.get(f"/api/v1/models/{name}/versions/{number}/").json()["status"]
             not in ("importing", "validating"), 120, what=f"the worker to import {uri}")
    return ModelVersion.objects.get(model__name=name, number=number)
