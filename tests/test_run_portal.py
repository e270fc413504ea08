"""bin/run-portal (what `make run` starts) keeps every file under MODELPORT_VAR_DIR, refuses a second portal on
the same one (it would share the task queue), stops with `make stop` from elsewhere or with Ctrl-C, and either way
says what keeps running (the local Triton servers, which live in sessions of their own) and how to stop it."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from deployments.runtimes.local.triton import is_alive
from infra.lanes import LANES
from tests.artifacts import tiny_onnx
from tests.faults import wait_exit
from tests.processes import ROOT, free_port, wait_for
from tests.running_portal import RunningPortal, run

pytestmark = [pytest.mark.faults, pytest.mark.worker]


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[RunningPortal]:
    running = RunningPortal(tmp_path / "var")
    try:
        yield running
    finally:
        running.kill()
        print(f"--- run-portal output ---\n{running.text() if running.output.exists() else ''}")


def listens(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def checkout_var_files() -> dict[str, float]:
    var = ROOT / "var"
    names = ["log/worker-reconcile.log", "log/worker-inspection.log", "log/beat.log", "celerybeat-schedule",
             "celerybeat-schedule.db",
             "celerybeat-schedule.dat", "run/web.pid"]
    return {name: (var / name).stat().st_mtime for name in names if (var / name).exists()}


def test_it_keeps_its_files_under_the_var_dir_refuses_a_second_portal_and_stops_with_make_stop(
        launched: RunningPortal) -> None:
    before = checkout_var_files()
    launched.start()
    wait_for(lambda: (launched.var_dir / "log" / "beat.log").exists()
             and list(launched.var_dir.glob("celerybeat-schedule*")),
             30, what="beat to write its schedule")
    for lane in LANES:  # one worker per lane (infra/lanes.py)
        log = launched.var_dir / "log" / f"worker-{lane.name}.log"
        wait_for(lambda log=log: log.exists() and " ready." in log.read_text(), 60, what=f"the {lane.name} worker")
    assert sorted(p.name for p in (launched.var_dir / "run").glob("*.pid")) == sorted(
        ["beat.pid", "grpc.pid", "web.pid", *(f"worker-{lane.name}.pid" for lane in LANES)])
    grpc_port = int(launched.env["GATEWAY_GRPC_PORT"])
    assert f"gRPC inference (tritonclient.grpc): 127.0.0.1:{grpc_port}" in launched.text()
    wait_for(lambda: listens(grpc_port), 60, what="the gRPC gateway")
    assert checkout_var_files() == before, "nothing written to the checkout's var/"

    second = run({**launched.env, "PORT": str(free_port())}, "bin/run-portal")
    assert second.returncode == 1
    assert "Modelport is running already from" in second.stderr and "make stop" in second.stderr

    stop = run(launched.env, "make", "--no-print-directory", "stop")
    assert stop.returncode == 0, stop.stderr
    assert "Modelport has stopped: web server, worker and beat." in stop.stdout
    assert "Nothing of it keeps running." in stop.stdout
    assert launched.process is not None and wait_exit(launched.process, 30) is not None
    assert launched.process.returncode == 0
    assert "Stopped from another terminal (make stop)." in launched.text()
    assert not list((launched.var_dir / "run").glob("*.pid"))
    assert not listens(grpc_port)
    again = run(launched.env, "make", "--no-print-directory", "stop")
    assert f"Modelport is not running from {launched.var_dir}." in again.stdout


@pytest.mark.triton
def test_ctrl_c_stops_the_portal_and_says_which_tritons_keep_running_and_how_to_stop_them(
        launched: RunningPortal) -> None:
    launched.start()
    token = run(launched.env, sys.executable, "manage.py", "create_api_token", "--user", "alice", "--team", "acme",
                "--create", "--admin").stdout.strip()
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {token}"
    api.post(launched.url + "/api/v1/models/", json={"name": "tiny"}, timeout=30)
    assert api.post(launched.url + "/api/v1/models/tiny/versions/", files={"file": ("model.onnx", tiny_onnx())},
                    timeout=30).status_code == 201
    wait_for(lambda: api.get(launched.url + "/api/v1/models/tiny/versions/1/", timeout=30).json()["status"] == "ready",
             60, interval=0.5, what="the upload to be inspected")
    assert api.post(launched.url + "/api/v1/deployments/", json={"name": "tiny", "models": [{"model": "tiny"}]},
                    timeout=30).status_code == 201
    wait_for(lambda: api.get(launched.url + "/api/v1/deployments/tiny/", timeout=30).json()["status"] == "ready",
             120, interval=0.5, what="the deployment to be ready")
    tritons = run(launched.env, sys.executable, "manage.py", "local_tritons").stdout
    assert "(acme/tiny, revision 1)" in tritons
    pid = int(tritons.split()[2])

    assert launched.process is not None
    os.killpg(launched.process.pid, signal.SIGINT)  # Ctrl-C in the terminal
    assert wait_exit(launched.process, 60) is not None
    out = launched.text()
    assert "Modelport has stopped: web server, worker and beat." in out
    assert f"Triton pid {pid} (acme/tiny, revision 1)" in out
    assert "To stop them now: make stop-triton" in out
    assert not launched.answers()
    assert is_alive(pid)  # the Triton server runs on

    stopped = run(launched.env, "make", "--no-print-directory", "stop-triton")
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped Triton pid {pid} (acme/tiny, revision 1)" in stopped.stdout
    assert not is_alive(pid)
    # The next health check says it was stopped on purpose, not that it died (deployments/tests/test_operator_stop.py).
    assert list(launched.var_dir.rglob("*.stopped-by-operator"))
    stopped_none = run(launched.env, "make", "--no-print-directory", "stop-triton").stdout
    assert "No local Triton server is running" in stopped_none


def test_a_killed_web_server_is_started_again_alone_and_the_workers_and_beat_keep_running(
        launched: RunningPortal) -> None:
    """Issue 30: the web process killed (for its memory, by the kernel) took the worker and beat down with it. Now
    bin/run-portal starts the web server again, with a backoff, and leaves every other process of the portal as it
    was: same pids, still alive."""
    launched.start()
    run_dir = launched.var_dir / "run"
    others = {p.stem: int(p.read_text()) for p in run_dir.glob("*.pid") if p.stem != "web"}
    assert {"beat", "grpc", *(f"worker-{lane.name}" for lane in LANES)} <= set(others)
    for round_ in range(2):  # twice: the second death is within WEB_STABLE_SECONDS, so it waits longer
        web = int((run_dir / "web.pid").read_text())
        os.killpg(web, signal.SIGKILL)
        wait_for(lambda web=web: (run_dir / "web.pid").read_text().strip() not in ("", str(web)), 60,
                 what="the web server to be started again")
        wait_for(launched.answers, 60, what="the new web server to answer")
        assert launched.text().count("exited (status 137): starting it again") == round_ + 1
    assert "starting it again in 1 s" in launched.text() and "starting it again in 2 s" in launched.text()
    for name, pid in others.items():
        assert int((run_dir / f"{name}.pid").read_text()) == pid, name
        os.kill(pid, 0)  # alive: raises ProcessLookupError otherwise
    assert launched.process is not None and launched.process.poll() is None
    stop = run(launched.env, "make", "--no-print-directory", "stop")
    assert stop.returncode == 0, stop.stderr
    assert wait_exit(launched.process, 30) is not None and launched.process.returncode == 0
    assert not list(run_dir.glob("*.pid"))
