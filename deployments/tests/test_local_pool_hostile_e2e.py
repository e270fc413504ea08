"""What a hostile team can do to a shared pool with a model it uploads, on the real local runtime (issue 24's
attacker's review): a few hundred bytes of standard ONNX must not occupy the pool's Triton, or its lock, for the
other teams.

The reconciler is ticked here as a worker would (deployments/tests/test_local_pool_e2e.py shows the rest)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from deployments.models import Deployment, PoolLoad, PoolServer
from deployments.runtimes.local import pool as local_pool
from deployments.runtimes.local import triton as local_triton
from deployments.tests.pool_e2e import Asgi, deploy, infer, settle
from tests.artifacts import constant_folding_bomb_onnx, onnx_with_unused_initializer, tiny_onnx
from tests.support.people import Person
from tests.support.versions import make_ready_version

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def asgi_gateway() -> Iterator[Asgi]:
    asgi = Asgi()
    yield asgi
    asgi.close()


@pytest.fixture(autouse=True)
def _stop_pool_servers() -> Iterator[None]:
    yield
    for server in PoolServer.objects.filter(state=PoolServer.State.RUNNING):
        local_triton.stop_server(server.pid, grace_seconds=5)


def test_a_tiny_model_whose_load_would_compute_for_long_loads_at_once_and_its_neighbour_after_it(
        people: dict[str, Person], asgi_gateway: Asgi) -> None:
    """onnxruntime folds constants when it builds a session: a 300-byte graph (ConstantOfShape [6000, 6000], then
    MatMul of it with itself) is about 430 GFLOP and 430 MB computed at load, while the load holds the pool's lock
    and every other team's cold start is refused busy. Loaded in a pool, the graph is built, never evaluated."""
    alice, charlie = people["alice"], people["charlie"]
    bomb = constant_folding_bomb_onnx(6000)
    assert len(bomb) < 400
    make_ready_version(charlie, data=bomb)  # inspection has no objection: standard operators only
    make_ready_version(alice, data=tiny_onnx())
    deploy(charlie, "bomb-c", idle_unload_seconds=0)
    started = time.monotonic()
    settle("bomb-c", seconds=60)
    load = PoolLoad.objects.get(deployment__name="bomb-c")
    assert load.state == "loaded"
    assert load.cold_start_seconds is not None and load.cold_start_seconds < 5, load.cold_start_seconds
    assert load.memory_bytes < 200 * 2**20  # the folded 6000x6000 products would have stayed resident
    deploy(alice, "digits-a", idle_unload_seconds=0)
    settle("digits-a", seconds=60)
    assert time.monotonic() - started < 45
    status, answer = infer(asgi_gateway, alice, "digits-a")  # the neighbour's model answers as ever
    assert status == 200 and answer["outputs"][0]["shape"] == [2, 3], answer


def test_another_teams_model_writes_no_line_into_a_deployments_log(people: dict[str, Person]) -> None:
    """A deployment's log is the lines of the pool's log that name its models; onnxruntime, in another team's model
    process, writes the names that team chose into the same log (here a warning about an unused initializer)."""
    alice, charlie = people["alice"], people["charlie"]
    make_ready_version(alice, data=tiny_onnx())
    deploy(alice, "digits-a", idle_unload_seconds=0)
    victim = settle("digits-a")
    forged = f"d{victim.pk}-r1-digits failed: its weights moved, upload them again at http://evil.example/"
    make_ready_version(charlie, data=onnx_with_unused_initializer(forged))
    deploy(charlie, "spoof-c", idle_unload_seconds=0)
    settle("spoof-c")
    server = PoolServer.objects.get(state=PoolServer.State.RUNNING)
    with open(server.log_path) as handle:
        assert "evil.example" in handle.read()  # it is in the pool's log
    victim = Deployment.objects.select_related("serving_revision").get(pk=victim.pk)
    assert victim.serving_revision is not None
    log = local_pool.logs(victim, 500, victim.serving_revision)
    assert "evil.example" not in log, log
    assert f"d{victim.pk}-r1-digits" in log  # the deployment's own lines are still there
