from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests import processes
from tests.schema_world import World


@pytest.fixture
def celery_processes(transactional_db: Any, tmp_path: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """A real Celery worker and beat, on the test database and the configured broker (files under var/test, or
    Redis in CI). Yields a dict so that a test can kill and replace the worker."""
    processes.purge_broker()
    logs = tmp_path / "logs"
    logs.mkdir()
    running = {
        "worker": processes.start_worker(logs / "worker.log"),
        "beat": processes.start_beat(logs / "beat.log", tmp_path / "beat-schedule"),
    }
    try:
        yield running
    finally:
        for process in running.values():
            processes.kill(process)
        _stop_leftover_servers()
        for name in ("worker.log", "beat.log"):
            path = logs / name
            if path.exists():
                print(f"--- {name} (last lines) ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-40:]))


@pytest.fixture
def portal_url(celery_processes: Any, tmp_path: Path) -> Iterator[str]:
    """The whole portal over real HTTP (uvicorn + Django + gateway), with the worker and beat of celery_processes."""
    import urllib.request

    port = processes.free_port()
    web = processes.start_web(tmp_path / "logs" / "web.log", port)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        processes.wait_for(up, 30, what="the web server")
        yield url
    finally:
        processes.kill(web)
        log = tmp_path / "logs" / "web.log"
        if log.exists():
            print("--- web.log (last lines) ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))


@dataclass(frozen=True)
class GrpcGatewayProcess:
    address: str  # host:port for tritonclient.grpc
    metrics_url: str  # its own Prometheus /metrics


@pytest.fixture
def grpc_gateway(portal_url: str, tmp_path: Path) -> Iterator[GrpcGatewayProcess]:
    """The gRPC gateway over a real socket (`manage.py grpc_gateway`), beside the portal of portal_url."""
    import socket

    port, metrics_port = processes.free_port(), processes.free_port()
    gateway = processes.start_grpc_gateway(tmp_path / "logs" / "grpc.log", port, metrics_port)

    def up() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    try:
        processes.wait_for(up, 30, what="the gRPC gateway")
        yield GrpcGatewayProcess(f"127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        processes.kill(gateway)
        log = tmp_path / "logs" / "grpc.log"
        if log.exists():
            print("--- grpc.log (last lines) ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))


def _stop_leftover_servers() -> None:
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


@pytest.fixture
def world(db: Any) -> World:
    """The schema tests' world (tests/schema_world.py)."""
    return World()
