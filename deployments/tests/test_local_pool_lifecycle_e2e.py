"""A pool's Triton outside its deployments' lives (issue 24), on the real local runtime: one left with no deployment
is stopped after POOL_EMPTY_SERVER_STOP_SECONDS (and one whose deployments are only idle is not: their routes name
its ports), and the orphan sweep and `make stop-triton` (manage.py local_tritons) find pool Tritons under
var/pools/ as they find dedicated ones. The reconciler is ticked here as a worker would."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from deployments import reconcile, tasks
from deployments.models import Deployment, PoolLoad, PoolServer
from deployments.runtimes.local import pool as local_pool
from deployments.runtimes.local import sweeps as local_sweeps
from deployments.runtimes.local import triton as local_triton
from deployments.tests.pool_e2e import Asgi, _stop_pool_servers, deploy, gateway, infer, people, settle, tick_until
from tests.support.people import Person
from tests.support.versions import make_ready_version

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]
__all__ = ["_stop_pool_servers", "gateway", "people"]  # fixtures shared with the other pool tests


def tick_until_stopped(name: str, seconds: float = 60) -> Deployment:
    deployment = Deployment.objects.get(name=name)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reconcile.reconcile(deployment.pk)
        deployment.refresh_from_db()
        if deployment.status == "stopped" and not PoolLoad.objects.filter(deployment=deployment).exists():
            return deployment
        time.sleep(0.2)
    raise AssertionError(f"{name} is {deployment.status}: {deployment.status_message}")


def scratch_of(server: PoolServer) -> Path:
    return local_pool.pool_dir(server.pool) / "scratch" / server.sandbox_id


def test_a_pool_triton_no_deployment_uses_is_stopped_after_a_while_and_started_by_the_next(
        people: dict[str, Person], gateway: Asgi, settings: Any) -> None:
    alice = people["alice"]
    make_ready_version(alice)
    settings.POOL_EMPTY_SERVER_STOP_SECONDS = 1.0
    settings.POOL_IDLE_UNLOAD_LOAD_FACTOR = 0  # its idle_unload_seconds alone (test_local_pool_lock_hog_e2e.py)
    deploy(alice, "digits-idle", idle_unload_seconds=1)
    settle("digits-idle")
    [server] = PoolServer.objects.filter(state=PoolServer.State.RUNNING)

    # Only idle: nothing is loaded, but the deployment's route names the server's ports, so it stays.
    time.sleep(1.2)
    assert local_pool.unload_idle() == ["unloaded acme/digits-idle r1 from pool 'shared'"]
    assert local_pool.stop_empty_servers() == []
    time.sleep(1.2)
    assert local_pool.stop_empty_servers() == []
    assert local_triton.is_alive(server.pid)
    assert PoolServer.objects.get(pk=server.pk).empty_since is None

    stopped = alice.client().post("/api/v1/deployments/digits-idle/stop", format="json")
    assert stopped.status_code < 300, stopped.json()
    tick_until_stopped("digits-idle")
    # The first pass notes that it is empty, a pass the setting later stops it (the periodic task does both).
    assert tasks.unload_idle_pool_models() == 0
    assert local_triton.is_alive(server.pid)
    assert PoolServer.objects.get(pk=server.pk).empty_since is not None
    time.sleep(1.2)
    assert tasks.unload_idle_pool_models() == 1
    assert not local_triton.is_alive(server.pid) and local_triton.server_pids(server.pid) == []
    row = PoolServer.objects.get(pk=server.pk)
    assert row.state == PoolServer.State.STOPPED and row.stopped_at is not None
    assert not scratch_of(server).exists()
    assert all(not Path(d).exists() for d in server.cgroups)

    # The next deployment into the pool starts it again, and is served.
    started = alice.client().post("/api/v1/deployments/digits-idle/start", format="json")
    assert started.status_code < 300, started.json()
    settle("digits-idle")
    [again] = PoolServer.objects.filter(state=PoolServer.State.RUNNING)
    assert again.pk != server.pk and local_triton.is_alive(again.pid)
    status, answer = infer(gateway, alice, "digits-idle")
    assert status == 200 and answer["model_name"] == "digits", answer


def test_the_orphan_sweep_stops_a_pool_triton_no_row_knows_and_keeps_the_one_a_row_knows(
        people: dict[str, Person], settings: Any) -> None:
    alice = people["alice"]
    make_ready_version(alice)
    deploy(alice, "digits-o", idle_unload_seconds=0)
    settle("digits-o")
    [server] = PoolServer.objects.filter(state=PoolServer.State.RUNNING)
    settings.TRITON_ORPHAN_GRACE_SECONDS = 1
    time.sleep(1.2)
    assert not any("orphaned Triton" in line for line in local_sweeps.sweep_orphans())
    assert local_triton.is_alive(server.pid) and scratch_of(server).exists()

    # A worker that died between spawning the pool's Triton and recording it leaves a process no row knows.
    PoolServer.objects.filter(pk=server.pk).update(state=PoolServer.State.STOPPED)
    done = local_sweeps.sweep_orphans()
    assert f"stopped an orphaned Triton (pid {server.pid})" in done
    assert not local_triton.is_alive(server.pid) and local_triton.server_pids(server.pid) == []
    assert f"removed the scratch directory {scratch_of(server)}" in done
    assert not scratch_of(server).exists()


def test_stop_triton_lists_and_stops_a_pool_triton_and_its_models_load_again_at_the_next_need(
        people: dict[str, Person], gateway: Asgi) -> None:
    alice = people["alice"]
    make_ready_version(alice)
    deploy(alice, "digits-s", idle_unload_seconds=0)
    deployment = settle("digits-s")
    [server] = PoolServer.objects.filter(state=PoolServer.State.RUNNING)

    listed = io.StringIO()
    call_command("local_tritons", stdout=listed)
    assert f"Triton pid {server.pid} (pool 'shared')" in listed.getvalue().splitlines()

    stopped = io.StringIO()
    call_command("local_tritons", "--stop", stdout=stopped)
    assert f"stopped Triton pid {server.pid} (pool 'shared')" in stopped.getvalue().splitlines()
    assert not local_triton.is_alive(server.pid)
    assert PoolServer.objects.get(pk=server.pk).state == PoolServer.State.STOPPED
    load = PoolLoad.objects.get(deployment=deployment)
    assert load.state == PoolLoad.State.LOADING and "stop-triton" in load.message
    # What happened, and what will (once the portal runs again), not that it "is started again": nothing runs.
    [told] = deployment.events.filter(message__contains="make stop-triton")
    assert "was stopped by an operator (make stop-triton)" in told.message, told.message
    assert "once the portal runs again" in told.message and "started again" not in told.message
    after = io.StringIO()
    call_command("local_tritons", stdout=after)
    assert "pool" not in after.getvalue()

    # The portal, started again, finds the pool without its Triton and loads the deployment's models again.
    tick_until(deployment, lambda: PoolLoad.objects.get(deployment=deployment).state == PoolLoad.State.LOADED,
               "loaded again")
    [again] = PoolServer.objects.filter(state=PoolServer.State.RUNNING)
    assert again.http_port == server.http_port
    assert deployment.events.filter(
        message__startswith=f"Loaded again in pool 'shared', into its Triton started again (pid {again.pid})").exists()
    status, answer = infer(gateway, alice, "digits-s")
    assert status == 200 and answer["model_name"] == "digits", answer
