"""A rollout and a canary inside a pool under load (issue 24: "a load, unload or restart of one model never fails
another model's in-flight requests"): closed-loop clients over gRPC (tritonclient.grpc through the in-process gRPC
gateway) and HTTP (the ASGI gateway) call a deployment while it rolls out to a new version in the same pool Triton,
then runs a canary of a third one that is promoted; another team's deployment in the same pool is called all along.
No request may fail, and each answer is one revision's (the model's output width tells them apart). The reconciler
is ticked here as a worker would, as fast as it can, so that the old revision is unloaded as early as it may be."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from deployments import reconcile
from deployments.models import Deployment, PoolLoad
from deployments.tests.pool_e2e import Asgi, ClosedLoop, _stop_pool_servers, deploy, infer, people, settle
from deployments.tests.pool_grpc import InProcessGrpcGateway, auth, grpc_gateway, rows
from tests.artifacts import tiny_onnx
from tests.processes import wait_for
from tests.support.people import Person
from tests.support.versions import make_ready_version

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]
__all__ = ["_stop_pool_servers", "grpc_gateway", "people"]  # fixtures (pool_e2e.py, pool_grpc.py)


def tick_until(name: str, done: Callable[[Deployment], bool], seconds: float = 90) -> Deployment:
    deployment = Deployment.objects.get(name=name)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reconcile.reconcile(deployment.pk)
        deployment.refresh_from_db()
        assert deployment.status != "failed", deployment.status_message
        if done(deployment):
            return deployment
        time.sleep(0.05)
    raise AssertionError(f"{name}: {deployment.status} {deployment.status_message}")


def test_a_rollout_and_a_canary_in_a_pool_under_load_fail_no_request_of_it_or_of_its_neighbour(
        people: dict[str, Person], grpc_gateway: InProcessGrpcGateway) -> None:
    alice, charlie = people["alice"], people["charlie"]
    make_ready_version(alice, data=tiny_onnx(out_features=3))
    make_ready_version(charlie, data=tiny_onnx(out_features=7))
    deploy(alice, "digits-a", idle_unload_seconds=0)
    deploy(charlie, "digits-c", idle_unload_seconds=0)
    settle("digits-a")
    settle("digits-c")

    def grpc_width(person: Person, name: str) -> Callable[[grpcclient.InferenceServerClient], int]:
        def once(client: grpcclient.InferenceServerClient) -> int:
            answer = client.infer("digits", rows(), headers=auth(person, name))
            assert answer.get_response().model_name == "digits"
            return int(answer.as_numpy("y").shape[1])
        return once

    def http_width(gateway: Asgi) -> int | str:
        status, answer = infer(gateway, alice, "digits-a")
        return int(np.asarray(answer["outputs"][0]["data"]).size // 2) if status == 200 else f"{status}: {answer}"

    def client() -> grpcclient.InferenceServerClient:
        return grpcclient.InferenceServerClient(grpc_gateway.address)

    loads = [ClosedLoop(grpc_width(alice, "digits-a"), client), ClosedLoop(grpc_width(alice, "digits-a"), client),
             ClosedLoop(http_width, Asgi), ClosedLoop(grpc_width(charlie, "digits-c"), client)]
    for load in loads:
        load.thread.start()

    def each_answers(width: int, times: int = 3) -> None:
        """Each of digits-a's loops is answered `width` `times` more from now: every phase has its traffic, on a
        loaded machine too (a fixed second could give a loop no answer of a revision)."""
        before = [load.outcomes.count(width) for load in loads[:3]]
        wait_for(lambda: all(load.outcomes.count(width) >= n + times
                             for load, n in zip(loads[:3], before, strict=True)),
                 60, what=f"every loop to be answered {times} times by the revision of width {width}")

    each_answers(3)

    # A rollout: version 2 loads beside version 1 in the same Triton, the route switches, version 1 is unloaded.
    make_ready_version(alice, data=tiny_onnx(out_features=4))
    patched = alice.client().patch("/api/v1/deployments/digits-a/", {"models": [{"model": "digits", "version": 2}]},
                                   format="json")
    assert patched.status_code == 200, patched.json()
    deployment = tick_until("digits-a", lambda d: d.serving_revision.number == 2 and d.drain_until is None
                            and not PoolLoad.objects.filter(deployment=d, revision__number=1).exists())
    each_answers(4)

    # A canary of version 3 beside it (half the requests), promoted; version 2 is unloaded after the drain.
    make_ready_version(alice, data=tiny_onnx(out_features=5))
    patched = alice.client().patch("/api/v1/deployments/digits-a/", {
        "models": [{"model": "digits", "version": 3}],
        "rollout": {"strategy": "canary", "percent": 50, "max_p99_ratio": 1000.0}}, format="json")
    assert patched.status_code == 200, patched.json()
    tick_until("digits-a", lambda d: bool(d.canary_upstream_url))
    each_answers(5)  # the canary's half
    promoted = alice.client().post("/api/v1/deployments/digits-a/promote", format="json")
    assert promoted.status_code < 300, promoted.json()
    tick_until("digits-a", lambda d: d.drain_until is None and d.serving_revision.number == 3
               and list(PoolLoad.objects.filter(deployment=d).values_list("revision__number", flat=True)) == [3])
    each_answers(5)
    outcomes = [load.stop() for load in loads]

    failed = [o for o in sum(outcomes, []) if not isinstance(o, int)]
    assert not failed, failed[:5]
    mine = Counter(outcomes[0] + outcomes[1] + outcomes[2])
    assert set(mine) == {3, 4, 5}, mine  # every revision answered, and only through its own model
    assert set(outcomes[2]) == {3, 4, 5}  # over HTTP too
    assert set(outcomes[3]) == {7} and len(outcomes[3]) > 50  # the neighbour, all along
    assert deployment.pk == Deployment.objects.get(name="digits-a").pk
    print(f"requests: digits-a {sum(mine.values())} {dict(mine)}, digits-c {len(outcomes[3])}")
