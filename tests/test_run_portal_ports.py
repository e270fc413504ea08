"""bin/run-portal checks its ports before it starts anything: a taken gRPC port ended the whole portal a moment later
with "The grpc exited (status 1)", the reason only in a log file. Nothing is started here (the script stops at the
check), so no marker: it runs in the fast suite."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.processes import ROOT, free_port


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def run_portal(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MODELPORT_", "PORT", "GATEWAY_", "HOST"))}
    return subprocess.run(["bin/run-portal"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**clean, "MODELPORT_VAR_DIR": str(tmp_path / "var"), "HOST": "127.0.0.1", **env})


def test_a_taken_grpc_port_is_named_with_how_to_choose_another_before_anything_starts(
        tmp_path: Path, taken_port: int) -> None:
    result = run_portal(tmp_path, PORT=str(free_port()), GATEWAY_GRPC_PORT=str(taken_port))

    assert result.returncode == 1
    assert (f"Port {taken_port} on 127.0.0.1 (the gRPC gateway) is taken by another program" in result.stderr)
    assert f"GATEWAY_GRPC_PORT={taken_port + 10} make run or GATEWAY_GRPC_PORT=0 to run without gRPC" in result.stderr
    assert "Nothing was started." in result.stderr
    assert not (tmp_path / "var" / "run").exists()  # no pid file: no process was started


def test_a_taken_web_port_is_named_too(tmp_path: Path, taken_port: int) -> None:
    result = run_portal(tmp_path, PORT=str(taken_port), GATEWAY_GRPC_PORT="0")

    assert result.returncode == 1
    assert f"Port {taken_port} on 127.0.0.1 (the web server) is taken" in result.stderr
    assert f"PORT={taken_port + 10} make run." in result.stderr


def test_the_same_port_for_both_and_a_port_that_is_no_number_are_refused(tmp_path: Path) -> None:
    port = str(free_port())
    same = run_portal(tmp_path, PORT=port, GATEWAY_GRPC_PORT=port)
    assert same.returncode == 1
    assert f"The gRPC gateway and the web server are both set to port {port}" in same.stderr

    bad = run_portal(tmp_path, PORT="80a", GATEWAY_GRPC_PORT="0")
    assert bad.returncode == 1
    assert "PORT='80a' is not a port number" in bad.stderr
