"""MLflow's own `mlflow deployments` command, run in a child process as a user runs it, with this checkout's plugin
(modelport_cli/mlflow_plugin.py) found through its entry point.

The entry point comes from a dist-info of this checkout's pyproject.toml written into a folder put first on
PYTHONPATH (what `pip install "modelport[mlflow]"` writes), because the test venv's own install of the CLI cannot be
changed from a test, and may be another checkout's (an editable install). Used by the plugin's command-line test
against the fake portal (modelport_cli/tests/test_mlflow_plugin_cli.py) and by its end-to-end test against a live
one (tests/test_mlflow_deployments_e2e.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MLFLOW = [sys.executable, "-m", "mlflow"]


def declared_entry_points() -> dict[str, str]:
    """The "mlflow.deployments" entry points pyproject.toml declares."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project["entry-points"]["mlflow.deployments"])


def plugin_site(folder: Path) -> Path:
    """A folder holding the modelport distribution's dist-info with the declared entry points; put it on
    PYTHONPATH."""
    info = folder / "modelport-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: modelport\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "[mlflow.deployments]\n" + "".join(f"{k} = {v}\n" for k, v in declared_entry_points().items()))
    return folder


def plugin_env(folder: Path, portal_url: str, token: str, tracking_uri: str = "") -> dict[str, str]:
    """The environment of a user's shell: the portal and its token as the plugin reads them (MODELPORT_URL,
    MODELPORT_TOKEN), MLFLOW_TRACKING_URI where given, and nothing of the test's own Django, portal or MLflow
    settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "MODELPORT_", "MLFLOW_"))}
    env.update(PYTHONPATH=f"{plugin_site(folder)}{os.pathsep}{ROOT}", MODELPORT_URL=portal_url,
               MODELPORT_TOKEN=token)
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    return env


def mlflow_deployments(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`mlflow deployments ARGS...` in a child process."""
    return subprocess.run([*MLFLOW, "deployments", *args], env=env, capture_output=True, text=True, timeout=timeout)
