"""A portal started as its operator would start it, for the tests of bin/run-portal and of the docs' commands (a fixture
module: nothing here is collected)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import requests

from tests.markers import require
from tests.processes import ROOT, free_port, wait_for


def clean_env(var_dir: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DATABASE_URL", "CELERY_", "MODELPORT_", "ARTIFACT_ROOT", "DEBUG", "PYTEST",
                                "DJANGO_SETTINGS_MODULE", "SECRET_KEY"))}
    return {**env, "MODELPORT_VAR_DIR": str(var_dir), "PORT": str(port), "RECONCILE_INTERVAL_SECONDS": "1",
            "GATEWAY_GRPC_PORT": str(free_port())}


def run(env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


class RunningPortal:
    def __init__(self, var_dir: Path) -> None:
        self.var_dir = var_dir
        self.port = free_port()
        self.env = clean_env(var_dir, self.port)
        self.url = f"http://127.0.0.1:{self.port}"
        self.output = var_dir.parent / "run-portal.out"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        require("worker", "starts bin/run-portal (a web server, a worker and beat)")
        # As `make run`: var/ and the development secret key first (settings create nothing), then the database.
        ensure = run(self.env, sys.executable, "manage.py", "ensure_dirs")
        assert ensure.returncode == 0, ensure.stderr
        assert (self.var_dir / "secret_key").stat().st_mode & 0o077 == 0
        migrate = run(self.env, sys.executable, "manage.py", "migrate", "--noinput")
        assert migrate.returncode == 0, migrate.stderr
        # A session of its own, as a terminal gives `make run`: Ctrl-C is SIGINT to that process group.
        self.process = subprocess.Popen(["bin/run-portal"], cwd=ROOT, env=self.env, start_new_session=True,
                                        stdout=open(self.output, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
        wait_for(self.answers, 60, what="bin/run-portal to serve")

    def answers(self) -> bool:
        try:
            return requests.get(self.url + "/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def kill(self) -> None:
        """Whatever a failed test left: the portal's processes (each in its own group) and its Tritons."""
        for pid_file in (self.var_dir / "run").glob("*.pid"):
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        run(self.env, sys.executable, "manage.py", "local_tritons", "--stop")
