"""MLflow's own `mlflow deployments` command finding the plugin through its entry point and driving it, in child
processes as a user runs it, against the fake portal (fake_portal.py): the command line, the entry point and the
plugin module meet here, where test_mlflow_plugin.py calls the client class directly.

The entry point comes from a dist-info of this checkout's pyproject.toml (tests/support/mlflow_deployments.py);
test_the_entry_point_is_the_one_pyproject_declares keeps the two the same. Against a live portal, a real tracking
server and Triton: tests/test_mlflow_deployments_e2e.py."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from modelport_cli.tests.fake_portal import TOKEN, FakePortal, Reply, deployment
from tests.support.mlflow_deployments import ROOT, declared_entry_points, mlflow_deployments, plugin_env


def test_the_entry_point_is_the_one_pyproject_declares() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "modelport", 'pip install "modelport[mlflow]" names the distribution'
    assert project["optional-dependencies"]["mlflow"] == ["mlflow-skinny>=2.10"]
    assert declared_entry_points() == {"modelport": "modelport_cli.mlflow_plugin"}


@pytest.fixture
def mlflow_env(tmp_path: Path, portal: FakePortal) -> dict[str, str]:
    return plugin_env(tmp_path / "site", portal.url, TOKEN)


def mlflow(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return mlflow_deployments(env, *args)


FRAUD = {"model": "fraud", "version": 3, "format": "onnx"}
SERVING = deployment(name="fraud-prod", endpoint="/serve/fraud-prod", models=[FRAUD], status="ready",
                     serving_revision=1)


def test_mlflow_deployments_creates_gets_predicts_and_deletes_through_the_plugin(
    portal: FakePortal, mlflow_env: dict[str, str], tmp_path: Path
) -> None:
    portal.on("POST", "/api/v1/models/fraud/versions/", Reply(201, {"number": 3, "status": "importing"}))
    portal.on("GET", "/api/v1/models/fraud/versions/3/", Reply(200, {"number": 3, "status": "ready"}))
    portal.on("POST", "/api/v1/deployments/", Reply(201, {**SERVING, "status": "pending", "serving_revision": None}))
    portal.on("GET", "/api/v1/deployments/fraud-prod/", Reply(200, SERVING))
    portal.on("GET", "/serve/fraud-prod/v2/models/fraud",
              Reply(200, {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}]}))
    portal.on("POST", "/serve/fraud-prod/v2/models/fraud/infer",
              Reply(200, {"outputs": [{"name": "p", "datatype": "FP32", "shape": [1, 1], "data": [0.75]}]}))
    portal.on("DELETE", "/api/v1/deployments/fraud-prod/", Reply(204))

    helped = mlflow(mlflow_env, "help", "-t", "modelport")
    assert helped.returncode == 0 and "modelport:/https://" in helped.stdout, helped.stderr

    created = mlflow(mlflow_env, "create", "-t", "modelport", "-m", "models:/fraud/3", "--name", "fraud-prod")
    assert created.returncode == 0, created.stderr
    assert "triton deployment fraud-prod is created" in created.stdout
    assert portal.seen("POST", "/api/v1/models/fraud/versions/")[0].json() == {
        "source": {"kind": "mlflow", "uri": "models:/fraud/3"}, "create_model": True}
    assert portal.seen("POST", "/api/v1/deployments/")[0].json() == {
        "name": "fraud-prod", "models": [{"model": "fraud", "version": 3}]}

    got = mlflow(mlflow_env, "get", "-t", "modelport", "--name", "fraud-prod")
    assert got.returncode == 0 and "/serve/fraud-prod" in got.stdout, got.stderr

    request, answer = tmp_path / "request.json", tmp_path / "answer.json"
    request.write_text(json.dumps([{"amount": 12.5, "age": 3}]))
    predicted = mlflow(mlflow_env, "predict", "-t", "modelport", "--name", "fraud-prod", "--input-path",
                       str(request), "--output-path", str(answer))
    assert predicted.returncode == 0, predicted.stderr
    assert json.loads(answer.read_text()) == {"predictions": [[0.75]]}
    assert portal.seen("POST", "/serve/fraud-prod/v2/models/fraud/infer")[0].json() == {
        "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [12.5, 3.0]}]}

    deleted = mlflow(mlflow_env, "delete", "-t", "modelport", "--name", "fraud-prod")
    assert deleted.returncode == 0 and "Deployment fraud-prod is deleted" in deleted.stdout, deleted.stderr
