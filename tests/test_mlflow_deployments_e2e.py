"""The MLflow deployments plugin (issue 35) driven through `mlflow deployments` as an MLflow user runs it: child
processes of MLflow's own command, the plugin found through its entry point (tests/support/mlflow_deployments.py),
against a live portal over real HTTP (uvicorn, Django, the gateway; a Celery worker and beat) that imports from a
real `mlflow server` (tests/support/mlflow_server.py) and deploys on the real local Triton.

A small ONNX model is registered with MLflow's own API; `create` imports and deploys it, `get` and `list` show it,
`predict` answers through the gateway what onnxruntime computes from the same model on the same input; a second
registry version (another model) is rolled out with `update`, and `predict` then answers as that one; `delete`
removes the deployment, and `get` says it is gone. modelport_cli/tests/test_mlflow_plugin_cli.py runs the same
commands against the fake portal, for what the plugin sends."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from tests.processes import wait_for
from tests.support import mlflow_server as support
from tests.support.mlflow_deployments import mlflow_deployments, plugin_env
from tests.support.mlflow_server import MlflowServer
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

REGISTERED = "digits-plugin-e2e"  # mlflow_for_the_workers lets teams import the digits-* models
DEPLOYMENT = "digits-plugin-prod"
# An import, its inspection and a Triton's start, on a loaded machine: the plugin's own waits are 600 s each.
COMMAND_TIMEOUT = 900
ROWS = [[1.5, -2.0, 3.25], [0.0, 10.0, -7.5]]


def succeeded(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"exit {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n" \
                                 f"{done.stderr[-3000:]}"
    return done.stdout


def described(stdout: str) -> dict[str, str]:
    """`mlflow deployments get` prints the deployment one `key: value` line a key."""
    return dict(line.split(": ", 1) for line in stdout.splitlines() if ": " in line)


def served_versions(stdout: str) -> list[tuple[str, int]]:
    """The (model, version) pairs in the `models` line of `mlflow deployments get` (a Python repr of the JSON)."""
    return [(m["model"], m["version"]) for m in ast.literal_eval(described(stdout)["models"])]


def predicted(env: dict[str, str], folder: Path) -> np.ndarray:
    """`mlflow deployments predict` with ROWS as records (MLflow reads --input-path with pandas: a DataFrame, one
    [rows, columns] tensor for a model of one input)."""
    request, answer = folder / "request.json", folder / "answer.json"
    request.write_text(json.dumps([{"a": a, "b": b, "c": c} for a, b, c in ROWS]))
    answer.unlink(missing_ok=True)
    succeeded(mlflow_deployments(env, "predict", "-t", "modelport", "--name", DEPLOYMENT, "--input-path",
                                 str(request), "--output-path", str(answer)))
    return np.array(json.loads(answer.read_text())["predictions"], dtype=np.float32)


def onnxruntime_answer(factor: float) -> np.ndarray:
    session = ort.InferenceSession(support.scaling_onnx(factor).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (y,) = session.run(["y"], {"x": np.array(ROWS, dtype=np.float32)})
    return np.asarray(y)


def test_mlflow_deployments_create_get_list_predict_update_and_delete_against_a_live_portal(
    mlflow_for_the_workers: str, alice_tx: Person, portal_url: str, mlflow_server: MlflowServer, tmp_path: Path,
) -> None:
    first = support.log_onnx(mlflow_server, REGISTERED, factor=2.0)
    env = plugin_env(tmp_path / "site", portal_url, alice_tx.token, tracking_uri=mlflow_server.url)

    created = succeeded(mlflow_deployments(env, "create", "-t", "modelport", "-m", f"models:/{REGISTERED}/{first}",
                                           "--name", DEPLOYMENT, timeout=COMMAND_TIMEOUT))
    assert f"triton deployment {DEPLOYMENT} is created" in created
    # The portal's model is the registered one's name; its version records where it came from.
    source = alice_tx.client().get(f"/api/v1/models/{REGISTERED}/versions/1/").json()["source"]
    assert source["uri"] == f"models:/{REGISTERED}/{first}"
    assert source["fetched"]["registry_version"] == first and source["fetched"]["flavor"] == "onnx"

    got = succeeded(mlflow_deployments(env, "get", "-t", "modelport", "--name", DEPLOYMENT))
    facts = described(got)
    assert facts["name"] == DEPLOYMENT and facts["flavor"] == "triton" and facts["status"] == "ready", got
    assert facts["endpoint"] == f"/serve/{DEPLOYMENT}"
    assert served_versions(got) == [(REGISTERED, 1)]

    listed = succeeded(mlflow_deployments(env, "list", "-t", "modelport"))
    assert f"'name': '{DEPLOYMENT}'" in listed, listed

    x2 = predicted(env, tmp_path)
    expected = onnxruntime_answer(2.0)
    assert np.array_equal(x2, expected), (x2, expected)

    # A second registry version, another model (y = 3x): update imports it as the portal's version 2 and rolls
    # the deployment onto it; predict then answers as that model.
    second = support.log_onnx(mlflow_server, REGISTERED, factor=3.0)
    assert second != first
    updated = succeeded(mlflow_deployments(env, "update", "-t", "modelport", "-m", f"models:/{REGISTERED}/{second}",
                                           "--name", DEPLOYMENT, timeout=COMMAND_TIMEOUT))
    assert f"Deployment {DEPLOYMENT} is updated (with flavor triton)" in updated
    got = succeeded(mlflow_deployments(env, "get", "-t", "modelport", "--name", DEPLOYMENT))
    assert served_versions(got) == [(REGISTERED, 2)]
    assert described(got)["serving_revision"] == described(got)["revision"] != "1", got
    x3 = predicted(env, tmp_path)
    expected = onnxruntime_answer(3.0)
    assert np.array_equal(x3, expected), (x3, expected)

    deleted = succeeded(mlflow_deployments(env, "delete", "-t", "modelport", "--name", DEPLOYMENT))
    assert f"Deployment {DEPLOYMENT} is deleted" in deleted

    # The worker stops its Triton and removes the row: until then the deployment reads "stopping".
    def gone() -> bool:
        return bool(alice_tx.client().get(f"/api/v1/deployments/{DEPLOYMENT}/").status_code == 404)

    wait_for(gone, 120, what=f"the worker to remove {DEPLOYMENT}")
    missing = mlflow_deployments(env, "get", "-t", "modelport", "--name", DEPLOYMENT)
    assert missing.returncode != 0 and "HTTP 404" in missing.stderr + missing.stdout, missing
    listed = succeeded(mlflow_deployments(env, "list", "-t", "modelport"))
    assert DEPLOYMENT not in listed, listed
    # The registry's versions stay: delete removes the deployment only.
    versions: Any = alice_tx.client().get(f"/api/v1/models/{REGISTERED}/versions/").json()
    rows = versions["results"] if isinstance(versions, dict) else versions
    assert sorted(row["number"] for row in rows) == [1, 2]
