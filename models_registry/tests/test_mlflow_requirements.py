"""A pyfunc logged with MLflow's defaults (issue 35): MLflow pins what the logging machine had (mlflow, cloudpickle,
numpy 2.x), and the runtime env serves numpy 1.26, which a python model's environment never replaces. Kept, the
numpy pin could only fail the environment's build; the import makes it `numpy`, and model.py lets what numpy 2
pickled load on numpy 1. The model's own pins stay in its folder. No tracking server: the model is saved with
MLflow's own save_model, which writes the same files log_model does."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import mlflow
import numpy as np
import pytest
import yaml
from django.conf import settings
from mlflow.pyfunc import PythonModel

from deployments import pyenvs
from modelport.core import requirements as requirement_lines
from modelport.core.runtime_env import RuntimeEnvError, find_runtime_env
from models_registry.sources.mlflow import _NUMPY_ALIAS, _model_py, _requirements, convert_signature

# The runtime env's numpy as requirements-runtime.txt pins it: what every python environment is built over.
RUNTIME = pyenvs.RuntimeIdentity("3.11.7", ("numpy==1.26.4", "onnxruntime==1.32.0", "protobuf==6.33.6"))


class Weighted(PythonModel):
    """A pyfunc holding an array, as most models do (weights, a scaler's means): pickled under numpy 2."""

    def __init__(self) -> None:
        self.weights = np.array([1.0, 2.0, 3.0], dtype=np.float32)

    def predict(self, context, model_input, params=None):  # untyped: MLflow reads hints as a schema
        return np.asarray(model_input, dtype=np.float32) * self.weights


@pytest.fixture(scope="module")
def saved_with_defaults(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlflow.models import infer_signature

    folder = tmp_path_factory.mktemp("mlflow") / "model"
    x = np.ones((2, 3), dtype=np.float32)
    # By value, as a notebook's class is: MLflow infers the requirements by loading the model in a process of its
    # own, which could not import this test module.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        mlflow.pyfunc.save_model(str(folder), python_model=Weighted(), signature=infer_signature(x, x))
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    return folder


def _pyfunc(folder: Path) -> dict[str, Any]:
    return dict(yaml.safe_load((folder / "MLmodel").read_text())["flavors"]["python_function"])


def test_mlflows_default_pins_become_an_environment_the_runtime_env_can_hold(saved_with_defaults: Path) -> None:
    logged = (saved_with_defaults / "requirements.txt").read_text().split()
    # The premise: MLflow pins this machine's versions, numpy 2 among them.
    assert logged == [f"mlflow=={mlflow.__version__}", f"cloudpickle=={cloudpickle.__version__}",
                      f"numpy=={np.__version__}"]
    assert np.__version__.startswith("2.")
    [conflict] = pyenvs.runtime_conflicts(requirement_lines.parse_requirements(logged), RUNTIME)
    assert conflict.startswith(f"numpy=={np.__version__} asks for another numpy than the runtime env's 1.26.4")

    kept = _requirements(saved_with_defaults, _pyfunc(saved_with_defaults))
    assert kept == [f"mlflow-skinny>={mlflow.__version__}", f"cloudpickle=={cloudpickle.__version__}", "numpy",
                    "pandas"]
    assert pyenvs.runtime_conflicts(requirement_lines.parse_requirements(kept), RUNTIME) == []
    # The pins as logged are the model's own: its folder, shipped whole, still holds them.
    assert (saved_with_defaults / "requirements.txt").read_text().split() == logged


def test_conda_yamls_pip_list_is_read_the_same_way(saved_with_defaults: Path, tmp_path: Path) -> None:
    (tmp_path / "MLmodel").write_text((saved_with_defaults / "MLmodel").read_text())
    (tmp_path / "conda.yaml").write_text((saved_with_defaults / "conda.yaml").read_text())
    assert _requirements(tmp_path, _pyfunc(saved_with_defaults))[1:3] == [f"cloudpickle=={cloudpickle.__version__}",
                                                                          "numpy"]


@pytest.mark.parametrize(("line", "becomes"), [
    ("numpy==2.4.6", "numpy"), ("numpy == 1.26.4", "numpy"), ('numpy==2.1.0; python_version >= "3.10"', "numpy"),
    ("NumPy==2.0", "numpy"),
    # A range is the model's statement of what it needs: kept, and refused at deploy if the runtime env contradicts it.
    ("numpy>=2.1", "numpy>=2.1"), ("numpy<2", "numpy<2"),
    ("numpydoc==1.8.0", "numpydoc==1.8.0"), ("numpy-financial==1.0.0", "numpy-financial==1.0.0"),
    ("scikit-learn==1.7.2", "scikit-learn==1.7.2"), ("pandas==2.3.3", "pandas==2.3.3"),
])
def test_only_an_exact_numpy_pin_gives_way_to_the_serving_numpy(tmp_path: Path, line: str, becomes: str) -> None:
    (tmp_path / "requirements.txt").write_text(f"mlflow==3.17.2\n{line}\n")
    assert _requirements(tmp_path, {})[1] == becomes


def test_model_py_sets_up_the_numpy_names_before_it_unpickles_the_model(saved_with_defaults: Path) -> None:
    mlmodel = yaml.safe_load((saved_with_defaults / "MLmodel").read_text())
    source = _model_py(convert_signature(mlmodel))
    tree = ast.parse(source)
    [initialize] = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "initialize"]
    calls = [ast.unparse(node.func) for node in ast.walk(initialize) if isinstance(node, ast.Call)]
    assert calls.index("_numpy_2_names_on_numpy_1") < calls.index("mlflow.pyfunc.load_model")


def _runtime_python() -> Path:
    try:
        env = find_runtime_env(settings.MODELPORT_RUNTIME_ENV)
    except RuntimeEnvError as exc:
        pytest.skip(f"no runtime env: {exc}")
    python = env.bin_dir / "python"
    major = subprocess.run([str(python), "-I", "-c", "import numpy; print(numpy.__version__.split('.')[0])"],
                           capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    if int(major) >= 2:
        pytest.skip("the runtime env's numpy is 2.x: numpy 2 pickles load as they are")
    return python


LOAD = """
import pickle, sys
{alias}
if sys.argv[2] == "aliased":
    _numpy_2_names_on_numpy_1()
    _numpy_2_names_on_numpy_1()  # twice: one finder
import numpy
with open(sys.argv[1], "rb") as stream:
    loaded = pickle.load(stream)
print(numpy.__version__, loaded["weights"].tolist(), loaded["weights"].dtype, loaded["kind"])
print(sum(type(f).__name__ == "NumpyCoreAlias" for f in sys.meta_path), numpy.core.numeric.__spec__.name)
"""


def test_what_numpy_2_pickled_loads_on_the_runtime_envs_numpy_1_with_the_alias(tmp_path: Path) -> None:
    python = _runtime_python()
    pickled = tmp_path / "weights.pkl"
    # As MLflow pickles a PythonModel: cloudpickle, protocol 5, where numpy 2 writes numpy._core.numeric._frombuffer.
    pickled.write_bytes(cloudpickle.dumps({"weights": np.array([[0.5, -1.0, 2.0]], dtype=np.float32),
                                           "kind": np.dtype("int64")}))
    script = tmp_path / "load.py"
    script.write_text(LOAD.format(alias=_NUMPY_ALIAS))
    plain = subprocess.run([str(python), "-I", str(script), str(pickled), "plain"], capture_output=True, text=True,
                           timeout=120, check=False)
    assert plain.returncode != 0 and "No module named 'numpy._core.numeric'" in plain.stderr
    aliased = subprocess.run([str(python), "-I", str(script), str(pickled), "aliased"], capture_output=True,
                             text=True, timeout=120, check=False)
    assert aliased.returncode == 0, aliased.stderr[-2000:]
    version, rest = aliased.stdout.split(" ", 1)
    assert version.startswith("1.") and rest.splitlines() == ["[[0.5, -1.0, 2.0]] float32 int64",
                                                               "1 numpy.core.numeric"]
