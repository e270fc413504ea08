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
            # Requirements stated, as a model meant for Triton states what it needs of the serving env; MLflow's
            # default pins (this process' numpy 2.x among them) are log_pyfunc_with_defaults'.
            info = mlflow.pyfunc.log_model(name="model", python_model=python_model, registered_model_name=name,
                                           signature=infer_signature(EXAMPLE, EXAMPLE * 3),
                                           pip_requirements=[f"mlflow=={mlflow.__version__}",
                                                             f"cloudpickle=={cloudpickle.__version__}", "numpy"])
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    return str(info.registered_model_version)


def register_artifacts(server: MlflowServer, name: str, files: dict[str, bytes], folder: Path,
                       experiment_id: str | None = None) -> str:
    """A version registered from a run's artifact path (the pre-MLflow-3 way), its files laid out by hand in
    `folder` and logged with mlflow.log_artifacts; the version. For layouts logging needs a framework for (torch,
    TensorFlow), which the test environment lacks."""
    for relative, data in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(data)
    mlflow = _mlflow(server)
    client = mlflow.MlflowClient(tracking_uri=server.url)
    with mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.log_artifacts(str(folder), "model")
    client.create_registered_model(name)
    return str(client.create_model_version(name, f"{run.info.artifact_uri}/model", run.info.run_id).version)


class _WritesMarker:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return exec, (f"open({self.marker!r}, 'a').write('unpickled\\n')",)


def marker_pickle(marker: Path) -> bytes:
    """A pickle that, unpickled, appends a line to `marker`: the stand-in for the data.pkl of a torch.save(), whose
    unpickling runs whatever it names."""
    import pickle

    return pickle.dumps(_WritesMarker(str(marker)), protocol=2)


def zip_of(entries: dict[str, bytes]) -> bytes:
    """A zip archive of `entries` (name: bytes), as torch.save and torch.jit.save write theirs."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _pytorch_mlmodel(pyfunc: bool) -> bytes:
    """MLmodel as mlflow.pytorch.log_model writes it (mlflow 3.17): the pytorch flavor, and python_function through
    mlflow.pytorch beside it (a pt2 export of several inputs has none)."""
    import yaml

    flavors: dict[str, Any] = {"pytorch": {"model_data": "data", "pytorch_version": "2.13.0+cpu", "code": None}}
    if pyfunc:
        flavors["python_function"] = {"loader_module": "mlflow.pytorch", "data": "data",
                                      "pickle_module_name": "mlflow.pytorch.pickle_module",
                                      "model_config": {"device": None}, "python_version": "3.11.7",
                                      "env": {"conda": "conda.yaml", "virtualenv": "python_env.yaml"}}
    spec = '[{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, 3]}}]'
    return yaml.safe_dump({"flavors": flavors, "mlflow_version": mlflow.__version__,
                           "signature": {"inputs": spec, "outputs": spec}}).encode()


def pickled_pytorch_files(marker: Path) -> dict[str, bytes]:
    """The files of mlflow.pytorch.log_model(nn.Module) (serialization_format "pickle", MLflow's default outside
    Databricks): data/model.pth is torch.save's zip, whose data.pkl is the pickled module; here one that leaves
    `marker` when unpickled."""
    return {
        "MLmodel": _pytorch_mlmodel(pyfunc=True),
        "data/model.pth": zip_of({"model/data.pkl": marker_pickle(marker), "model/byteorder": b"little",
                                "model/data/0": b"\0" * 12, "model/version": b"3\n",
                                "model/.data/serialization_id": b"1234567890"}),
        "data/pickle_module_info.txt": b"mlflow.pytorch.pickle_module",
        "requirements.txt": b"mlflow==3.17.2\ntorch==2.13.0\ncloudpickle==3.1.3\n",
    }


def pt2_pytorch_files(marker: Path) -> dict[str, bytes]:
    """The files of mlflow.pytorch.log_model(nn.Module, serialization_format="pt2"): data/model.pt2 is
    torch.export.save's zip, whose weights and sample inputs are pickles (torch.save of tensors); here one that
    leaves `marker` when unpickled."""
    return {
        "MLmodel": _pytorch_mlmodel(pyfunc=True),
        "data/model.pt2": zip_of({"model/archive_format": b"pt2", "model/archive_version": b"0",
                                "model/models/model.json": b"{}",
                                "model/data/weights/model_weights_config.json": b"{}",
                                "model/data/sample_inputs/model.pt": marker_pickle(marker)}),
        "requirements.txt": b"mlflow==3.17.2\ntorch==2.13.0\n",
    }


class Weighted(PythonModel):
    """A pyfunc holding an array, as most models do: pickled under this process' numpy 2, loaded by Triton's numpy 1."""

    def __init__(self) -> None:
        self.weights = np.array([0.5, -2.0, 4.0], dtype=np.float32)

    def predict(self, context, model_input, params=None):  # untyped: MLflow reads hints as a schema
        return np.asarray(model_input, dtype=np.float32) * self.weights


def log_pyfunc_with_defaults(server: MlflowServer, name: str, python_model: Any) -> str:
    """Registers a pyfunc as a notebook would, requirements left to MLflow (it pins this machine's mlflow,
    cloudpickle and numpy 2.x); the version."""
    import cloudpickle

    mlflow = _mlflow(server)
    from mlflow.models import infer_signature

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        with mlflow.start_run():
            info = mlflow.pyfunc.log_model(name="model", python_model=python_model, registered_model_name=name,
                                           signature=infer_signature(EXAMPLE, EXAMPLE))
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


FRAMEWORK_MODELS_SCRIPT = Path(__file__).with_name("mlflow_framework_models.py")


@dataclass(frozen=True)
class FrameworkModel:
    """A framework model's files laid out as its flavor's log_model lays them out, a fixed input, and what the model
    answered to it in the process that made it."""

    files: dict[str, bytes]
    input: np.ndarray
    expected: np.ndarray


def framework_model_as_logged(flavor: str, runtime_python: Path, folder: Path) -> FrameworkModel:
    """y = x @ W + b (mlflow_framework_models.py) as mlflow.pytorch.log_model(torch.jit.script(module)) (`flavor`
    "pytorch") or mlflow.tensorflow.log_model(tf_module) ("tensorflow") lay it out: the model made, and its answer
    computed, by `runtime_python` (the runtime env's: logging itself needs the framework in mlflow's environment,
    which the test environment lacks); the MLmodel file written here by MLflow's own Model, add_flavor and
    pyfunc.add_to_model, as save_model calls them, with the signature MLflow infers from the input and the answer;
    the requirements, conda.yaml and python_env.yaml beside it as save_model writes them."""
    import subprocess

    import yaml
    from mlflow.models import Model, infer_signature

    framework = {"pytorch": "torch", "tensorflow": "tensorflow"}[flavor]
    # The runtime env's python with its own bin/ first, none of this process's Python settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    env["PATH"] = os.pathsep.join([str(runtime_python.parent), env.get("PATH", "/usr/bin:/bin")])
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run([str(runtime_python), str(FRAMEWORK_MODELS_SCRIPT), framework, str(folder)],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    example, expected = np.load(folder / "input.npy"), np.load(folder / "expected.npy")
    framework_version = (folder / "version.txt").read_text().strip()
    for made in ("input.npy", "expected.npy", "version.txt"):
        (folder / made).unlink()

    model = Model()
    model.signature = infer_signature(example, expected)
    requirements = [f"mlflow=={mlflow.__version__}", f"{framework}=={framework_version.split('+')[0]}"]
    if flavor == "pytorch":
        model.add_flavor("pytorch", model_data="data", pytorch_version=framework_version, code=None)
        mlflow.pyfunc.add_to_model(model, loader_module="mlflow.pytorch", data="data",
                                   pickle_module_name="mlflow.pytorch.pickle_module", code=None,
                                   conda_env="conda.yaml", python_env="python_env.yaml", model_config={"device": None})
        (folder / "data" / "pickle_module_info.txt").write_text("mlflow.pytorch.pickle_module")
        requirements.append("cloudpickle")
    else:
        model.add_flavor("tensorflow", code=None, saved_model_dir="tf2model", model_type="tf2-module")
        mlflow.pyfunc.add_to_model(model, loader_module="mlflow.tensorflow", code=None, conda_env="conda.yaml",
                                   python_env="python_env.yaml")
    model.model_size_bytes = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    model.save(str(folder / "MLmodel"))
    (folder / "requirements.txt").write_text("\n".join(requirements))
    python = "3.11"
    (folder / "conda.yaml").write_text(yaml.safe_dump({
        "name": "mlflow-env", "channels": ["conda-forge"],
        "dependencies": [f"python={python}", "pip<=25.0", {"pip": requirements}]}))
    (folder / "python_env.yaml").write_text(yaml.safe_dump({
        "python": python, "build_dependencies": ["pip", "setuptools", "wheel"], "dependencies":
        ["-r requirements.txt"]}))
    files = {path.relative_to(folder).as_posix(): path.read_bytes()
             for path in sorted(folder.rglob("*")) if path.is_file()}
    return FrameworkModel(files=files, input=example, expected=expected)
