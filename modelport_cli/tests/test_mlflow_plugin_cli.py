"""MLflow's own `mlflow deployments` command finding the plugin through its entry point and driving it, in child
processes as a user runs it, against the fake portal (fake_portal.py): the command line, the entry point and the
plugin module meet here, where test_mlflow_plugin.py calls the client class directly.

The entry point comes from a dist-info of this checkout's pyproject.toml written into a temporary directory on
PYTHONPATH (what `pip install "modelport[mlflow]"` writes), because the test venv's own install of the CLI cannot be
changed from a test; test_the_entry_point_is_the_one_pyproject_declares keeps the two the same. Against the real
portal, the deployment's import needs the mlflow source kind's fetcher and a tracking server (issue 35's other
parts): not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from modelport_cli.tests.fake_portal import TOKEN, FakePortal, Reply, deployment

ROOT = Path(__file__).resolve().parents[2]
MLFLOW = [sys.executable, "-m", "mlflow"]


def entry_points() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project["entry-points"]["mlflow.deployments"])


def test_the_entry_point_is_the_one_pyproject_declares() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "modelport", 'pip install "modelport[mlflow]" names the distribution'
    assert project["optional-dependencies"]["mlflow"] == ["mlflow-skinny>=2.10"]
    assert entry_points() == {"modelport": "modelport_cli.mlflow_plugin"}


@pytest.fixture
def mlflow_env(tmp_path: Path, portal: FakePortal) -> dict[str, str]:
    site = tmp_path / "site"
    info = site / "modelport-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: modelport\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "[mlflow.deployments]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points().items()))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "MODELPORT_", "MLFLOW_"))}
    env.update(PYTHONPATH=f"{site}{os.pathsep}{ROOT}", MODELPORT_URL=portal.url, MODELPORT_TOKEN=TOKEN)
    return env


def mlflow(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MLFLOW, "deployments", *args], env=env, capture_output=True, text=True, timeout=120)


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
