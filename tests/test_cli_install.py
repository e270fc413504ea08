"""`make run` installs the `modelport` command the deployment page's CLI snippet uses (issue 31: the snippet gave
"command not found" after `make run`, which installed none). The rule is checked with `make -n` against a venv of
the test's own: running it would reach the package index for setuptools, and would install into the checkout."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

from tests.processes import ROOT
from web import inference


def _planned(venv: Path) -> list[str]:
    ran = subprocess.run(["make", "-n", "venv", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=30, check=True)
    return ran.stdout.splitlines()


def test_make_venv_installs_the_modelport_command_into_the_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").touch()  # the requirements are in: only the command is missing (a venv made before it)

    assert f"{venv}/bin/pip install --quiet --no-deps -e ." in _planned(venv)
    # The command is what the distribution names `modelport`: the CLI's entry point.
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"modelport": "modelport_cli.main:main"}

    (venv / "bin" / "modelport").touch()  # installed: nothing more to do, `make run` does not reinstall each time
    assert not any("pip install" in line for line in _planned(venv))


def test_the_cli_snippet_says_where_make_run_put_the_command() -> None:
    snippet = inference.cli_snippet("digits-prod", "digits")
    assert "`.venv/bin/modelport`" in snippet and "source .venv/bin/activate" in snippet
    assert "modelport infer digits-prod digits --input req.json" in snippet
