"""Real Celery worker and beat processes for end-to-end tests, sharing the test database, broker and var/."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from infra.lanes import Lane
from tests.markers import require

ROOT = Path(__file__).resolve().parent.parent


def process_env() -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "portal.settings_test"
    env["ARTIFACT_ROOT"] = str(settings.ARTIFACT_ROOT)
    # The end-to-end tests scrape /metrics as a Prometheus on the operators' own network would: opened explicitly.
    env.setdefault("METRICS_OPEN", "true")
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        env["MODELPORT_TEST_DB"] = str(db["NAME"])
    else:
        env["DATABASE_URL"] = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    return env


def start(kind: str, log_path: Path, *args: str) -> subprocess.Popen[bytes]:
    require("worker", f"starts a real Celery {kind}")
    command = [sys.executable, "-m", "celery", "-A", "portal", kind, "--loglevel=INFO", *args]
    log = open(log_path, "ab")  # noqa: SIM115 - kept open for the process' lifetime
    return subprocess.Popen(command, cwd=ROOT, env=process_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def start_worker(log_path: Path) -> subprocess.Popen[bytes]:
    # Threads: several reconciles at once in one process, so kill -9 of this pid kills every task it runs.
    return start("worker", log_path, "-P", "threads", "--concurrency=4", "--without-gossip", "--without-mingle")


def start_lanes(lanes: tuple[Lane, ...], logs: Path,
                env: dict[str, str] | None = None) -> list[subprocess.Popen[bytes]]:
    """Each lane's worker as bin/run-portal starts it (the same arguments), on the test's database and broker, with
    `env` added to the settings; returns once every one is ready."""
    require("worker", "starts real Celery workers")
    started = []
    for lane in lanes:
        command = [sys.executable, "-m", "celery", "-A", "portal", "worker", *lane.worker_args(), "--loglevel=INFO",
                   "--without-gossip", "--without-mingle"]
        log = open(logs / f"worker-{lane.name}.log", "ab")  # noqa: SIM115 - kept open for the process' lifetime
        started.append(subprocess.Popen(command, cwd=ROOT, env={**process_env(), **(env or {})}, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True))
    for lane in lanes:
        log_path = logs / f"worker-{lane.name}.log"
        wait_for(lambda: _says_ready(log_path), 60, what=f"the {lane.name} worker")  # noqa: B023 - waited on here
    return started


def _says_ready(log: Path) -> bool:
    return " ready." in log.read_text(errors="replace")


def print_logs(logs: Path, lines: int = 25) -> None:
    """The last lines of each worker's log, for the test's output."""
    for log in sorted(logs.glob("worker-*.log")):
        print(f"--- {log.name} (last lines) ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))


def start_beat(log_path: Path, schedule: Path) -> subprocess.Popen[bytes]:
    return start("beat", log_path, "--schedule", str(schedule))


def kill(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        os.killpg(process.pid, sig)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def purge_broker() -> None:
    from portal.celery import app

    app.control.purge()


def wait_for(condition: Callable[[], Any], timeout: float, interval: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


async def until(condition: Callable[[], Any], timeout: float, interval: float = 0.01,
                what: str = "condition") -> Any:
    """wait_for's twin for a test that runs on an event loop: what it waits for happens on the same loop (a close
    seen by the other end of a connection), which a fixed sleep gives only so many turns on a loaded machine."""
    import asyncio

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def free_port() -> int:
    from deployments.runtimes.local.triton import pick_free_ports

    return pick_free_ports(1)[0]


def start_web(log_path: Path, port: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The portal as `make run` serves it: uvicorn running portal.asgi (Django plus the /serve/ gateway) with the
    guarded protocol (portal/web_server.py); `env` adds settings."""
    from portal.web_server import UVICORN_HTTP

    require("worker", "starts the portal's web server process")
    command = [sys.executable, "-m", "uvicorn", "portal.asgi:application", "--http", UVICORN_HTTP,
               "--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
    log = open(log_path, "ab")  # noqa: SIM115 - kept open for the process' lifetime
    return subprocess.Popen(command, cwd=ROOT, env={**process_env(), **(env or {})}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def start_grpc_gateway(log_path: Path, port: int, metrics_port: int = 0,
                       env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The gRPC gateway as bin/run-portal starts it: `manage.py grpc_gateway`, a process of its own."""
    require("worker", "starts the portal's gRPC gateway process")
    command = [sys.executable, "manage.py", "grpc_gateway", "--host", "127.0.0.1", "--port", str(port),
               "--metrics-port", str(metrics_port)]
    log = open(log_path, "ab")  # noqa: SIM115 - kept open for the process' lifetime
    return subprocess.Popen(command, cwd=ROOT, env={**process_env(), **(env or {})}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


@dataclass(frozen=True)
class GrpcGatewayProcess:
    address: str  # host:port for tritonclient.grpc
    metrics_url: str  # its own Prometheus /metrics


def stop_leftover_servers() -> None:
    """A failed test must not leave Triton processes behind for the next one."""
    from deployments.models import Pool, TritonServer
    from deployments.runtimes.local import pool
    from deployments.runtimes.local.runtime import clean_up
    from deployments.runtimes.local.triton import stop_server

    for server in TritonServer.objects.exclude(state=TritonServer.State.STOPPED):
        stop_server(server.pid, grace_seconds=2)
        clean_up(server)  # its sandbox's cgroups (they outlive this run's var/ otherwise) and scratch directory
    for shared in Pool.objects.all():  # the pools' Tritons, which the orphan sweep keeps while their row says running
        pool.stop_servers(shared)
    # A worker killed between spawning Triton and recording it leaves a process no row knows: find it by the
    # repository path, which lies under this test run's own var/.
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"tritonserver" in cmdline and any(str(where).encode() in cmdline
                                                  for where in (settings.DEPLOYMENTS_DIR, settings.POOLS_DIR)):
                stop_server(int(proc.name), grace_seconds=2)
    # The cgroups their sandboxes left (named after this run's var/, which goes away with the run).
    from django.test import override_settings

    from deployments.runtimes.local.sweeps import sweep_orphans

    with override_settings(TRITON_ORPHAN_GRACE_SECONDS=0):
        sweep_orphans()
    shutil.rmtree(Path(settings.DEPLOYMENTS_DIR), ignore_errors=True)
    shutil.rmtree(Path(settings.POOLS_DIR), ignore_errors=True)
