"""A pool is no team's failure domain (issue 30's attacker, items 2 and 4), on the real local runtime: one team's
model asked for a huge answer gets a clear error and never takes the pool's Triton (and every other team's models)
with it; a model's memory figure is its own peak under use, which a neighbour's allocations do not change, and the
pools API shows what the models hold after use, not what they took at load.

The reconciler is ticked here as a worker would (deployments/tests/test_local_pool_e2e.py shows the rest)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from deployments import reconcile
from deployments.models import Deployment, Event, ModelMemory, PoolLoad, PoolServer
from deployments.runtimes.local import pool as local_pool
from deployments.runtimes.local import pool_memory
from deployments.runtimes.local import triton as local_triton
from deployments.tests.pool_e2e import Asgi, ClosedLoop, _stop_pool_servers, deploy, infer, people, settle
from tests.artifacts import constant_of_shape_onnx, tiny_onnx
from tests.support.people import Person
from tests.support.versions import make_ready_version

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]
__all__ = ["_stop_pool_servers", "people"]  # fixtures shared with the other pool tests


def ask(gateway: Asgi, person: Person, deployment: str, count: int) -> tuple[int, Any]:
    body = {"inputs": [{"name": "n", "shape": [1], "datatype": "INT64", "data": [count]}]}
    status, _, answer = gateway.call(person, "POST", f"/serve/{deployment}/v2/models/digits/infer", body)
    return status, answer


def test_a_huge_answer_fails_its_own_request_and_never_the_pools_triton_or_another_teams_requests(
        people: dict[str, Person]) -> None:
    alice, charlie = people["alice"], people["charlie"]
    make_ready_version(alice, data=tiny_onnx())
    make_ready_version(charlie, data=constant_of_shape_onnx())
    deploy(alice, "digits-a", idle_unload_seconds=0)
    deploy(charlie, "shaper-c", idle_unload_seconds=0)
    settle("digits-a")
    settle("shaper-c")
    [server] = PoolServer.objects.filter(state=PoolServer.State.RUNNING)
    gateway = Asgi()
    try:
        status, answer = ask(gateway, charlie, "shaper-c", 3)  # a modest answer is served
        assert status == 200 and answer["outputs"][0]["data"] == [1.0, 1.0, 1.0], answer
    finally:
        gateway.close()

    def victim_once(client: Asgi) -> int:
        return infer(client, alice, "digits-a")[0]

    attacks: list[tuple[int, str]] = []
    victim = ClosedLoop(victim_once, Asgi)
    victim.thread.start()
    attacker = Asgi()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            status, answer = ask(attacker, charlie, "shaper-c", 60_000_000)  # 240 MB of floats, ~1 GB as JSON
            attacks.append((status, str((answer or {}).get("error", ""))))
    finally:
        answered = Counter(victim.stop())
        attacker.close()
    assert attacks and all(status >= 400 and message for status, message in attacks), attacks[:3]
    assert any("POOL_MAX_OUTPUT_BYTES" in message or "memory limit" in message for _, message in attacks), attacks[:3]
    assert local_triton.is_alive(server.pid), "the pool's Triton died"
    assert PoolServer.objects.filter(state=PoolServer.State.RUNNING).get().pid == server.pid
    assert set(answered) == {200} and answered[200] >= 10, answered
    print(f"attacker: {Counter(s for s, _ in attacks)} {attacks[0][1][:160]!r}; victim: {dict(answered)}")


def test_a_models_figure_is_its_own_peak_under_use_and_past_its_limit_it_loses_only_its_own_process(
        people: dict[str, Person]) -> None:
    alice, charlie = people["alice"], people["charlie"]
    digits = make_ready_version(alice, data=tiny_onnx())
    shaper = make_ready_version(charlie, data=constant_of_shape_onnx())
    deploy(alice, "digits-a", idle_unload_seconds=0)
    deploy(charlie, "shaper-c", idle_unload_seconds=0)
    settle("digits-a")
    settle("shaper-c")
    [server] = PoolServer.objects.filter(state=PoolServer.State.RUNNING)
    victim_at_load = ModelMemory.objects.get(version=digits).memory_bytes
    shaper_at_load = ModelMemory.objects.get(version=shaper).memory_bytes
    assert 20 * 2**20 < victim_at_load < 200 * 2**20, victim_at_load  # a stub with onnxruntime: some 70 MB

    gateway = Asgi()
    try:
        for _ in range(3):  # the neighbour allocates: 16 MB answers, inside its limit
            status, answer = ask(gateway, charlie, "shaper-c", 4_000_000)
            assert status == 200 and answer["outputs"][0]["shape"] == [4_000_000], str(answer)[:300]
        [row] = [r for r in charlie.client().get("/api/v1/pools/").json() if r["name"] == "shared"]
        # The neighbour's allocations are its own figure (what it held after use, not at load), never alice's.
        assert ModelMemory.objects.get(version=shaper).memory_bytes > shaper_at_load + 16 * 2**20
        assert abs(ModelMemory.objects.get(version=digits).memory_bytes - victim_at_load) < 4 * 2**20
        # What the pools API shows charlie is at least what its model really holds, as the kernel counts it.
        load = PoolLoad.objects.select_related("revision").get(deployment__name="shaper-c")
        held = pool_memory.measure(server, local_pool.repository(load.pool), f"d{load.deployment_id}-r1-digits")
        assert row["memory_used_bytes"] >= held > shaper_at_load, (row, held)
        charged = row["memory_used_bytes"]

        name = f"d{load.deployment_id}-r1-digits"
        [stub] = pool_memory.stub_pids(server, local_pool.repository(load.pool), name)
        # Past its limit bit by bit, the kernel ends its own process. (The limit lowered here, as the kernel would
        # see a model whose pages grew to it: what the 16 MB answers above take is then too much.)
        cgroup = pool_memory.model_dir(server, name)
        assert cgroup is not None
        anon = next(int(line.split()[1]) * 1024 for line in open(f"/proc/{stub}/status")
                    if line.startswith("RssAnon:"))
        for step in range(1, 64):  # the lowest limit the kernel accepts (pages it cannot reclaim stay charged)
            try:
                (cgroup / "memory.limit_in_bytes").write_text(str(anon + step * 2**22))
                break
            except OSError:
                continue
        status, answer = ask(gateway, charlie, "shaper-c", 6_000_000)
        assert status >= 500 and answer["error"], answer
        assert pool_memory.limit_reached(server, name)
        for _ in range(20):
            assert infer(gateway, alice, "digits-a")[0] == 200
        assert local_triton.is_alive(server.pid)
        assert PoolServer.objects.filter(state=PoolServer.State.RUNNING).get().pid == server.pid
        # It is loaded again with more memory reserved, which the pools API shows.
        shaper_c = Deployment.objects.get(name="shaper-c")
        deadline = time.monotonic() + 90
        while True:
            reconcile.reconcile(shaper_c.pk)
            load.refresh_from_db()
            if load.state == PoolLoad.State.LOADED and load.memory_bytes > charged:
                break
            assert time.monotonic() < deadline, (load.state, load.message)
            time.sleep(0.5)
        assert Event.objects.filter(deployment=shaper_c, message__contains="passed its memory limit").exists()
        [row] = [r for r in charlie.client().get("/api/v1/pools/").json() if r["name"] == "shared"]
        assert row["memory_used_bytes"] > charged, row
        status, answer = ask(gateway, charlie, "shaper-c", 3)
        assert status == 200, answer
        # One tensor far past its limit fails as an error in the request that asked for it; the process lives on.
        stubs = pool_memory.stub_pids(server, local_pool.repository(load.pool), name)
        status, answer = ask(gateway, charlie, "shaper-c", 60_000_000)
        assert status == 400 and "needs more memory than model 'digits' may hold" in answer["error"], answer
        assert pool_memory.stub_pids(server, local_pool.repository(load.pool), name) == stubs
        assert infer(gateway, alice, "digits-a")[0] == 200
        assert PoolServer.objects.filter(state=PoolServer.State.RUNNING).get().pid == server.pid
    finally:
        gateway.close()

