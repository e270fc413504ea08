"""A pip that writes what it was asked to install, for the python environments' tests (a fake: the real pip needs the
network; a fixture module, nothing here is collected)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


class FakePip:
    """Stands in for `python -m venv` and `python -m pip`: makes the directories they would, records the commands,
    and fails with pip's own words when told to."""

    def __init__(self, fails_with: str = "") -> None:
        self.fails_with = fails_with
        self.commands: list[list[str]] = []
        self.environments: list[dict[str, str]] = []

    def __call__(self, command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.commands.append(command)
        self.environments.append(kwargs["env"])
        assert kwargs["timeout"] > 0
        assert "PATH" in kwargs["env"] and not {"PYTHONPATH", "SECRET_KEY", "DATABASE_URL"} & set(kwargs["env"])
        if command[1:4] == ["-m", "venv", "--without-pip"]:
            env_dir = Path(command[4])
            (env_dir / "bin").mkdir(parents=True)
            (env_dir / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
            return subprocess.CompletedProcess(command, 0, "", "")
        # pip runs in the new environment's directory, never in the worker's (where a file could be a requirement).
        assert kwargs["cwd"] == str(Path(command[command.index("--python") + 1]).parent.parent)
        if self.fails_with:
            return subprocess.CompletedProcess(command, 1, "Collecting nonexistent-pkg-zzz==9.9\n", self.fails_with)
        env_dir = Path(command[command.index("--python") + 1]).parent.parent
        (env_dir / "lib" / "python3.11" / "site-packages" / "tabulate.py").write_text("")
        return subprocess.CompletedProcess(command, 0, "Successfully installed tabulate-0.10.0\n", "")
