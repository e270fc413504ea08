"""A shared deployment's events say when its models come and go in a pool (issue 31): unloaded while idle, evicted,
loaded again by a request (and how long that took), loaded again after the pool's Triton stopped, and what a stop
or a death of that Triton means, said truly (never "started again" before it is). Repeats coalesce into one row per
run (deployments/events.py), so churn floods neither the deployment's list nor the table.

No Triton: the local pool's calls to its Triton (the repository API, its statistics, the memory cgroups) are
replaced by fakes, the rows and the events are the real code's. tests marked `triton` do it for real
(test_local_pool_e2e.py, test_local_pool_lifecycle_e2e.py)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from deployments import events, pool_events
from deployments.models import Deployment, Event, Pool, PoolLoad, PoolServer
from deployments.pools import shared_pool
from deployments.runtimes.local import pool as local_pool
from tests.support.people import Person
from tests.support.versions import make_ready_version


def _shared(person: Person, name: str, idle: int = 60) -> Deployment:
    created = person.client().post("/api/v1/deployments/", {
        "name": name, "models": [{"model": "digits"}],
        "placement": {"mode": "shared", "idle_unload_seconds": idle}}, format="json")
    assert created.status_code == 201, created.json()
    return Deployment.objects.get(team=person.team, name=name)


def _server(pid: int, **fields: Any) -> PoolServer:
    return PoolServer.objects.create(pool=shared_pool(), pid=pid, http_port=1, grpc_port=2, metrics_port=3,
                                     log_path="x", admin_key="k", **fields)


@pytest.fixture
def fake_triton(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[int, bool]:
    """The pool's Triton answering every load and unload at once; which pids are alive is the test's to say."""
    settings.POOLS_DIR = tmp_path
    alive: dict[int, bool] = {}
    monkeypatch.setattr(local_pool.local_triton, "is_alive", lambda pid: alive.get(pid, False))
    monkeypatch.setattr(local_pool, "_admin", lambda *args: None)
    monkeypatch.setattr(local_pool, "_wait_live", lambda *args: None)
    monkeypatch.setattr(local_pool, "_refresh_last_used", lambda *args: None)
    monkeypatch.setattr(local_pool, "refresh_memory", lambda *args: None)
    monkeypatch.setattr(local_pool.pool_memory, "remove", lambda *args: None)
    monkeypatch.setattr(local_pool.pool_memory, "remove_unused", lambda *args: None)

    def load_models(server: PoolServer, load: PoolLoad, reserved: Any) -> Any:
        prefix = local_pool._prefix(load)
        return local_pool._Loaded({"digits": 10 * 2**20}, [f"{prefix}digits"], None, 0.8)

    monkeypatch.setattr(local_pool, "_load_models", load_models)
    return alive


def _running(alive: dict[int, bool], pid: int) -> PoolServer:
    alive[pid] = True
    return _server(pid)


def _loaded_idle(deployment: Deployment, server: PoolServer, seconds: float = 120) -> PoolLoad:
    now = timezone.now()
    load, _ = PoolLoad.objects.update_or_create(
        pool=server.pool, revision=deployment.revision, defaults={
            "deployment": deployment, "server": server, "state": PoolLoad.State.LOADED,
            "idle_unload_seconds": deployment.revision.spec.placement.idle_unload_seconds,
            "loaded_at": now - timedelta(seconds=seconds), "last_used_at": now - timedelta(seconds=seconds)})
    return load


def test_an_idle_unload_and_the_load_a_request_makes_are_the_deployments_events(
        alice: Person, fake_triton: dict[int, bool], settings: Any) -> None:
    settings.POOL_IDLE_UNLOAD_LOAD_FACTOR = 0
    make_ready_version(alice)
    deployment = _shared(alice, "digits-idle", idle=60)
    server = _running(fake_triton, 4100)
    load = _loaded_idle(deployment, server, seconds=125)

    assert local_pool.unload_idle() == [f"unloaded {deployment} r1 from pool 'shared'"]
    [unloaded] = deployment.events.filter(reason=pool_events.IDLE_UNLOADED)
    assert re.fullmatch(r"Unloaded from pool 'shared': unused for 12[5-9] s \(it unloads after 60 s unused\)\. "
                        r"The next request loads it again\.", unloaded.message), unloaded.message

    # The gateway's cold start (the row is unloaded: only a request loads it so).
    done = local_pool.load_revision(load.pk)
    assert done.state == PoolLoad.State.LOADED
    [woken] = deployment.events.filter(reason=pool_events.LOADED_ON_DEMAND)
    assert woken.message == "Loaded again in pool 'shared' by a request, in 0.8 s (the request waited for it)."
    api = alice.client().get(f"/api/v1/deployments/{deployment.name}/events/").json()
    assert [e["message"] for e in api[:2]] == [woken.message, unloaded.message]


def test_a_slow_loader_kept_past_its_idle_time_is_told_why(alice: Person, fake_triton: dict[int, bool],
                                                           settings: Any) -> None:
    settings.POOL_IDLE_UNLOAD_LOAD_FACTOR = 10
    make_ready_version(alice)
    deployment = _shared(alice, "digits-slow", idle=60)
    load = _loaded_idle(deployment, _running(fake_triton, 4150), seconds=400)
    PoolLoad.objects.filter(pk=load.pk).update(cold_start_seconds=30)
    assert local_pool.unload_idle()
    [unloaded] = deployment.events.filter(reason=pool_events.IDLE_UNLOADED)
    assert ("(it unloads after 300 s unused: 300 s is POOL_IDLE_UNLOAD_LOAD_FACTOR times its last load, longer than "
            "its idle time of 60 s)") in unloaded.message


def test_a_model_woken_and_unloaded_again_and_again_keeps_one_row_of_each(
        alice: Person, charlie: Person, fake_triton: dict[int, bool], settings: Any,
        django_assert_max_num_queries: Any) -> None:
    settings.POOL_IDLE_UNLOAD_LOAD_FACTOR = 0
    make_ready_version(alice)
    make_ready_version(charlie)
    deployment = _shared(alice, "digits-churn")
    theirs = _shared(charlie, "digits-calm")
    theirs_before = list(theirs.events.values_list("id", "time", "message"))
    server = _running(fake_triton, 4200)
    load = _loaded_idle(deployment, server)
    for _ in range(20):
        PoolLoad.objects.filter(pk=load.pk).update(last_used_at=timezone.now() - timedelta(seconds=120))
        assert local_pool.unload_idle()
        assert local_pool.load_revision(load.pk).state == PoolLoad.State.LOADED

    rows = list(deployment.events.filter(reason__startswith="pool."))
    assert sorted((e.reason, e.count) for e in rows) == [(pool_events.IDLE_UNLOADED, 20),
                                                         (pool_events.LOADED_ON_DEMAND, 20)]
    assert all("(20 times since " in e.message and e.message.endswith("UTC; this is the latest)") for e in rows)
    # The other team's deployment: not a row more, not a row touched.
    assert list(theirs.events.values_list("id", "time", "message")) == theirs_before
    # Each repeat reads and writes the deployment's own rows only: a few queries (the run's last event, the other
    # events' latest, the update; the log line may read the team's name), however long the run.
    with django_assert_max_num_queries(4):
        pool_events.loaded_on_demand(deployment, "shared", 0.5)


def test_repeats_coalesce_only_within_their_run_and_window(alice: Person, settings: Any) -> None:
    make_ready_version(alice)
    deployment = _shared(alice, "digits-runs")
    for _ in range(3):
        pool_events.idle_unloaded(deployment, "shared", 61, 60, 60)
    assert deployment.events.filter(reason=pool_events.IDLE_UNLOADED).count() == 1
    # Another event of the deployment ends the run: the next repeat starts a row after it, so the list stays in order.
    events.record(deployment, Event.Kind.INFO, "Stop requested by alice.")
    pool_events.idle_unloaded(deployment, "shared", 62, 60, 60)
    newest = list(deployment.events.all()[:3])
    assert [(e.reason, e.count) for e in newest] == [(pool_events.IDLE_UNLOADED, 1), ("", 1),
                                                     (pool_events.IDLE_UNLOADED, 3)]
    assert "unused for 62 s" in newest[0].message and "times since" not in newest[0].message
    # A run older than the window is left as it was.
    Event.objects.filter(pk=newest[0].pk).update(first_time=timezone.now() - timedelta(hours=2))
    pool_events.idle_unloaded(deployment, "shared", 63, 60, 60)
    assert deployment.events.filter(reason=pool_events.IDLE_UNLOADED).count() == 3
    # 0: a row each time.
    settings.EVENT_REPEAT_WINDOW_SECONDS = 0
    pool_events.idle_unloaded(deployment, "shared", 64, 60, 60)
    pool_events.idle_unloaded(deployment, "shared", 65, 60, 60)
    assert deployment.events.filter(reason=pool_events.IDLE_UNLOADED).count() == 5


def test_an_eviction_is_an_event_that_names_no_other_model(
        alice: Person, fake_triton: dict[int, bool], settings: Any) -> None:
    settings.POOL_EVICTION_MIN_IDLE_SECONDS = 30
    make_ready_version(alice)
    server = _running(fake_triton, 4300)
    mine = _loaded_idle(_shared(alice, "digits-old"), server, seconds=300)
    PoolLoad.objects.filter(pk=mine.pk).update(memory_bytes=900 * 2**20)
    Pool.objects.filter(pk=server.pool_id).update(memory_budget_bytes=1000 * 2**20)
    new = _shared(alice, "digits-new")
    incoming = PoolLoad.objects.create(pool=server.pool, revision=new.revision, deployment=new)
    local_pool._make_room(Pool.objects.get(pk=server.pool_id), incoming, 400 * 2**20)

    assert PoolLoad.objects.get(pk=mine.pk).state == PoolLoad.State.UNLOADED
    [told] = Deployment.objects.get(name="digits-old").events.filter(reason=pool_events.EVICTED)
    assert re.match(r"Unloaded from pool 'shared' to make room for another model: unused for 30[0-9] s",
                    told.message), told.message
    assert "digits-new" not in told.message


def test_a_pool_triton_found_dead_says_so_and_its_models_loaded_again_say_when_they_are(
        alice: Person, fake_triton: dict[int, bool]) -> None:
    make_ready_version(alice)
    deployment = _shared(alice, "digits-k", idle=0)
    dead = _server(4400)  # not alive
    load = _loaded_idle(deployment, dead, seconds=3600)

    assert local_pool.live_server(dead.pool) is None
    [told] = deployment.events.filter(message__contains="(pid 4400)")
    assert told.message == ("The Triton of pool 'shared' (pid 4400) died: this deployment's models are loaded again "
                            "at its next health check or request, in a new Triton of the pool.")
    assert "started again" not in told.message  # nothing is, until something looks
    assert PoolLoad.objects.get(pk=load.pk).state == PoolLoad.State.LOADING

    again = _running(fake_triton, 4401)
    assert local_pool._ensure_server(again.pool) == again
    assert local_pool.load_revision(load.pk).state == PoolLoad.State.LOADED
    newest = deployment.events.first()
    assert newest is not None
    assert newest.message == "Loaded again in pool 'shared', into its Triton started again (pid 4401), in 0.8 s."


def test_after_stop_triton_the_events_say_the_operator_stopped_it_and_nothing_runs_until_the_portal_does(
        alice: Person, fake_triton: dict[int, bool]) -> None:
    """`make stop-triton` runs only while the portal is stopped (bin/run-portal refuses otherwise): its event used to
    say the pool "is started again and this deployment's models loaded again", which nothing did."""
    make_ready_version(alice)
    deployment = _shared(alice, "digits-s", idle=0)
    stopped = _server(4500)  # stopped by the command before it marks the rows
    load = _loaded_idle(deployment, stopped)

    local_pool.mark_stopped([4500], "was stopped by an operator (make stop-triton)")

    [told] = deployment.events.filter(message__contains="(pid 4500)")
    assert told.kind == Event.Kind.WARNING
    assert told.message == ("The Triton of pool 'shared' (pid 4500) was stopped by an operator (make stop-triton): "
                            "this deployment's models are loaded again once the portal runs again (make run), at its "
                            "next health check or request, in a new Triton of the pool.")
    load.refresh_from_db()
    assert load.state == PoolLoad.State.LOADING and load.server is None
    assert load.message == "the pool's Triton was stopped by an operator (make stop-triton); to be loaded again"
    assert PoolServer.objects.get(pid=4500).state == PoolServer.State.STOPPED
