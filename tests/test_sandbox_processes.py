"""Stop, delete and rollout end every process a sandboxed deployment started, detached ones included; the orphan
sweep stops a Triton that no database row knows; Triton's admin APIs need the server's own key. Real local runtime
(reconciled in the test process through eager tasks) and real tritonservers."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from deployments import tasks
from deployments.models import Deployment, TritonServer
from deployments.revision_spec import RevisionSpec
from deployments.runtimes.local import backends, readiness
from deployments.runtimes.local import confined as local_confined
from deployments.runtimes.local import files as local_files
from deployments.runtimes.local import pyenv as local_pyenv
from deployments.runtimes.local import sweeps as local_sweeps
from deployments.runtimes.local import triton as local_triton
from infra import sandbox_settings
from modelport.core import sandbox
from tests.artifacts import tiny_onnx
from tests.sandbox_helpers import (
    VECTOR,
    deploy,
    gone,
    infer,
    kill_named,
    model_source,
    output,
    processes_named,
    python_version,
    ready,
)
from tests.support.people import Person
from tests.support.versions import make_ready_version

pytestmark = [pytest.mark.triton, pytest.mark.django_db, pytest.mark.usefixtures("sandboxed")]


@pytest.fixture
def token() -> Iterator[str]:
    value = secrets.token_hex(6)
    yield value
    kill_named(f"detached-{value}")


def detaching(alice: Person, token: str) -> None:
    python_version(alice, "detacher", {"model.py": model_source("detaching_model"), "token.txt": token.encode()},
                   VECTOR)


def doubles(server: TritonServer) -> bool:
    answer = infer(server, "detacher", [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}])
    return bool(output(answer, "y") == [2, 4, 6, 8])


def test_stop_and_delete_end_every_process_of_the_deployment_detached_ones_included(
    alice: Person, eager_tasks: Any, token: str
) -> None:
    detaching(alice, token)
    deployment = deploy(alice, "detacher", [{"model": "detacher"}])
    first = ready(deployment)
    assert first.sandboxed and doubles(first)
    assert len(processes_named(f"detached-{token}")) == 1
    assert len(local_triton.server_pids(first.pid)) == 3  # Triton, the stub, the detached process

    assert alice.client().post("/api/v1/deployments/detacher/stop").status_code == 202
    assert gone(first) and processes_named(f"detached-{token}") == []

    assert alice.client().post("/api/v1/deployments/detacher/start").status_code == 202
    second = ready(deployment)
    assert second.pk != first.pk and len(processes_named(f"detached-{token}")) == 1

    assert alice.client().delete("/api/v1/deployments/detacher/").status_code == 202  # torn down eagerly
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    assert gone(second) and processes_named(f"detached-{token}") == []
    assert not local_files.deployment_dir(deployment).exists()


def test_a_rollout_ends_the_old_revisions_processes_and_a_killed_triton_takes_its_own_with_it(
    alice: Person, eager_tasks: Any, token: str
) -> None:
    detaching(alice, token)
    deployment = deploy(alice, "detacher", [{"model": "detacher"}])
    old = ready(deployment)
    response = alice.client().patch("/api/v1/deployments/detacher/", {"models": [
        {"model": "detacher", "instance_group": {"count": 2}}]}, format="json")
    assert response.status_code == 200, response.json()
    new = ready(deployment)
    assert new.revision.number == 2 and gone(old) and doubles(new)
    # Two instances, each with its own detached process; the old revision's is gone with its server.
    assert len(processes_named(f"detached-{token}")) == 2

    # SIGKILL to the server alone (an OOM kill, an operator's kill -9): the kernel ends the rest of its sandbox.
    os.kill(new.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    # The kernel kills the namespace's processes one by one: wait for all of them, not only the detached ones.
    while ((processes_named(f"detached-{token}") or local_triton.server_pids(new.pid))
           and time.monotonic() < deadline):
        time.sleep(0.1)
    assert processes_named(f"detached-{token}") == [] and local_triton.server_pids(new.pid) == []


def test_the_orphan_sweep_stops_a_triton_no_row_knows_and_nothing_else(
    alice: Person, eager_tasks: Any, settings: Any, tmp_path: Path
) -> None:
    make_ready_version(alice, "known")
    known = ready(deploy(alice, "known", [{"model": "known"}]))
    # A worker that died between spawning Triton and recording it: a sandboxed server under this var/, no row.
    env = local_pyenv.runtime_env()
    repository = Path(settings.DEPLOYMENTS_DIR) / "999" / "r1" / "repository"
    repository.parent.mkdir(parents=True)
    (repository.parent.parent / "scratch").mkdir()
    shutil.copytree(local_files.repository_dir(known.revision), repository)
    caps, options = sandbox_settings.sandbox_capabilities(), sandbox_settings.sandbox_options()
    scratch = repository.parent.parent / "scratch" / "orphan"
    sandbox.prepare_scratch(scratch, options)
    backend = backends.build_backend_dir(env, Path(settings.VAR_DIR), sandboxed=True)
    spec = sandbox.Spec(read_only=(repository, backend, env.root, env.base_prefix), scratch=scratch, tcp_ports=(),
                        egress=False, name=f"mp-{sandbox_settings.var_tag()}-orphan",
                        limits=local_confined.limits_for(RevisionSpec(runtime="local", models=())))
    orphan = local_triton.start_server(repository, repository.parent / "triton.log", env, backend,
                                       env=sandbox.environment([env.bin_dir], scratch, {}),
                                       sandbox=sandbox.Sandbox(spec, caps, options))
    # And one of another var/ (its repository lies elsewhere): never this var/'s to stop.
    elsewhere = tmp_path / "other-var" / "repository"
    shutil.copytree(local_files.repository_dir(known.revision), elsewhere)
    foreign = local_triton.start_server(elsewhere, tmp_path / "other.log", env, backend)
    try:
        assert readiness.wait_ready(orphan, ["known"], 60).ready
        assert readiness.wait_ready(foreign, ["known"], 60).ready

        settings.TRITON_ORPHAN_GRACE_SECONDS = 3600
        assert tasks.sweep_orphan_servers() == 0  # too young: it may be a server whose row is being written
        assert local_triton.is_alive(orphan.pid)
        settings.TRITON_ORPHAN_GRACE_SECONDS = 1
        time.sleep(1.2)
        done = local_sweeps.sweep_orphans()
        assert done[0] == f"stopped an orphaned Triton (pid {orphan.pid})"
        assert not local_triton.is_alive(orphan.pid) and local_triton.server_pids(orphan.pid) == []
        assert local_triton.is_alive(known.pid) and local_triton.is_alive(foreign.pid)
        assert not scratch.exists()  # its scratch directory and cgroup went too; the known server's stay
        assert local_confined.scratch_dir(known).exists()
        assert orphan.cgroups and all(not Path(d).exists() for d in orphan.cgroups)
        assert all(Path(d).exists() for d in known.cgroups)
        assert "deployments.tasks.sweep_orphan_servers" in {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
    finally:
        local_triton.stop_server(orphan.pid, grace_seconds=2)
        local_triton.stop_server(foreign.pid, grace_seconds=2)


def test_tritons_admin_apis_need_the_servers_own_key_and_statistics_stay_open(alice: Person, eager_tasks: Any) -> None:
    make_ready_version(alice, "digits", data=tiny_onnx())
    server = ready(deploy(alice, "digits", [{"model": "digits"}]))
    assert len(server.admin_key) >= 40

    def call(path: str, data: bytes | None = None, key: str | None = None) -> int:
        headers = {local_triton.ADMIN_HEADER: key} if key else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(server.url + path, data, headers), timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    for path, data in [("/v2/logging", None), ("/v2/trace/setting", None), ("/v2/systemsharedmemory/status", None),
                       ("/v2/repository/index", b"{}"), ("/v2/repository/models/digits/unload", b"{}")]:
        assert call(path, data) == 403, path
        assert call(path, data, key="guessed") == 403, path
    assert call("/v2/logging", key=server.admin_key) == 200
    assert call("/v2/repository/index", b"{}", key=server.admin_key) == 200
    assert call("/v2/models/digits/stats") == 200  # the gateway serves statistics
    assert call("/v2/health/ready") == 200
    assert call("/v2/models/digits/config") == 200


def test_resources_become_the_sandboxs_cgroup_limits_and_every_process_is_in_them(alice: Person, eager_tasks: Any,
                                                                                  token: str) -> None:
    if sandbox_settings.sandbox_capabilities().cgroups.version != 1:
        pytest.skip("this test reads cgroup v1 files (CI's machine); v2 is covered by the fast tests")
    detaching(alice, token)
    server = ready(deploy(alice, "detacher", [{"model": "detacher"}], resources={"memory": "768Mi", "cpu": "250m"}))
    memory = next(Path(d) for d in server.cgroups if "/memory/" in d)
    cpu = next(Path(d) for d in server.cgroups if "/cpu/" in d)
    pids = next(Path(d) for d in server.cgroups if "/pids/" in d)
    assert len(server.cgroups) == 3
    assert int((memory / "memory.limit_in_bytes").read_text()) == 768 * 2**20
    assert int((cpu / "cpu.cfs_quota_us").read_text()) == 25_000
    assert int((cpu / "cpu.cfs_period_us").read_text()) == 100_000
    assert int((pids / "pids.max").read_text()) == settings.SANDBOX_PIDS_MAX
    members = set(local_triton.server_pids(server.pid))
    assert len(members) == 3  # Triton, the stub and the detached process
    for directory in (memory, cpu, pids):
        assert members <= {int(p) for p in (directory / "cgroup.procs").read_text().split()}, directory
