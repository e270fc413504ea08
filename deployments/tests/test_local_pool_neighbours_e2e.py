"""A neighbour's loads never fail a model's in-flight requests (issue 24: "a load, unload or restart of one model
never fails another model's in-flight requests (test it under load)", and "one model failing to load in a pool fails
only its deployment"), on the real local runtime: closed-loop clients over gRPC and HTTP call one deployment in a
team's own pool while, in the same Triton, another deployment is loaded, unloaded for being idle, loaded again by
its held first request, stopped (unloaded), started again (loaded), a python model whose initialize() raises
fails to load, and a python model whose requirements the runtime env meets loads. No request of the steady
deployment may fail. The reconciler is ticked here as a worker would."""

from __future__ import annotations

import io
import time
import zipfile
from collections.abc import Callable
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from deployments import reconcile
from deployments.models import Deployment, Pool, PoolLoad, PoolServer
from deployments.runtimes.local import pool as local_pool
from deployments.tests.pool_e2e import Asgi, ClosedLoop, _stop_pool_servers, deploy, infer, people, settle
from deployments.tests.pool_grpc import InProcessGrpcGateway, auth, grpc_gateway, rows
from models_registry.tests.pipeline_versions import ready_version
from tests.artifacts import PYTHON_SIGNATURE, python_model_zip
from tests.support.people import Person
from tests.support.versions import make_ready_version

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]
__all__ = ["_stop_pool_servers", "grpc_gateway", "people"]  # fixtures shared with the other pool tests

BROKEN_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("its weights are missing: this model cannot load")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
'''


def tick_until(name: str, done: Callable[[Deployment], bool], seconds: float = 90) -> Deployment:
    deployment = Deployment.objects.get(name=name)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reconcile.reconcile(deployment.pk)
        deployment.refresh_from_db()
        if done(deployment):
            return deployment
        time.sleep(0.1)
    raise AssertionError(f"{name}: {deployment.status} {deployment.status_message}")


def test_a_neighbours_load_unload_reload_and_failed_load_fail_no_request_under_load(
        people: dict[str, Person], grpc_gateway: InProcessGrpcGateway, settings: Any) -> None:
    alice = people["alice"]
    settings.POOL_IDLE_UNLOAD_LOAD_FACTOR = 0  # its idle_unload_seconds alone (test_local_pool_lock_hog_e2e.py)
    Pool.objects.create(name="acme-own", memory_budget_bytes=2**31, team=alice.team, idle_unload_seconds=0)
    make_ready_version(alice)
    deploy(alice, "steady", pool="acme-own", idle_unload_seconds=0)
    settle("steady")

    def grpc_once(client: grpcclient.InferenceServerClient) -> str:
        answer = client.infer("digits", rows(), headers=auth(alice, "steady"))
        return "ok" if answer.get_response().model_name == "digits" else "wrong model"

    def http_once(gateway: Asgi) -> str:
        status, answer = infer(gateway, alice, "steady")
        return "ok" if status == 200 and answer["model_name"] == "digits" else f"{status}: {answer}"

    def client() -> grpcclient.InferenceServerClient:
        return grpcclient.InferenceServerClient(grpc_gateway.address)

    loads = [ClosedLoop(grpc_once, client), ClosedLoop(grpc_once, client), ClosedLoop(http_once, Asgi)]
    for load in loads:
        load.thread.start()
    time.sleep(1)
    gateway = Asgi()
    try:
        # A load of a neighbour into the same Triton.
        deploy(alice, "neighbour", pool="acme-own", idle_unload_seconds=1)
        neighbour = settle("neighbour")
        [server] = PoolServer.objects.filter(state=PoolServer.State.RUNNING)
        assert neighbour.upstream_url == Deployment.objects.get(name="steady").upstream_url == server.url
        # Its unload for being idle, and its load again by the first request after (held, then answered).
        time.sleep(1.2)
        assert "unloaded acme/neighbour r1 from pool 'acme-own'" in local_pool.unload_idle()
        status, answer = infer(gateway, alice, "neighbour")
        assert status == 200 and answer["model_name"] == "digits", answer
        assert PoolLoad.objects.get(deployment=neighbour).state == PoolLoad.State.LOADED
        # Stopped (unloaded), then started again (loaded again).
        assert alice.client().post("/api/v1/deployments/neighbour/stop", format="json").status_code < 300
        tick_until("neighbour", lambda d: d.status == "stopped"
                   and not PoolLoad.objects.filter(deployment=d).exists())
        assert alice.client().post("/api/v1/deployments/neighbour/start", format="json").status_code < 300
        settle("neighbour")
        assert infer(gateway, alice, "neighbour")[0] == 200

        # A python model whose initialize() raises: its load fails its own deployment, and only it.
        ready_version(alice, "broken", _broken_zip(), "broken.zip", PYTHON_SIGNATURE)
        created = alice.client().post("/api/v1/deployments/", {
            "name": "broken", "models": [{"model": "broken"}],
            "placement": {"mode": "shared", "pool": "acme-own", "idle_unload_seconds": 0}}, format="json")
        assert created.status_code == 201, created.json()
        broken = tick_until("broken", lambda d: d.status == "failed")
        assert "failed to load" in broken.status_message and "its weights are missing" in broken.status_message
        assert f"d{broken.pk}-" not in broken.status_message  # the caller's own names, not the pool's
        # A python model listing requirements the runtime env meets loads beside them, with no environment of its
        # own (docs/pools.md), and answers.
        ready_version(alice, "doubler", python_model_zip({"requirements.txt": b"numpy\n"}), "doubler.zip",
                      PYTHON_SIGNATURE)
        created = alice.client().post("/api/v1/deployments/", {
            "name": "doubler", "models": [{"model": "doubler"}],
            "placement": {"mode": "shared", "pool": "acme-own", "idle_unload_seconds": 0}}, format="json")
        assert created.status_code == 201, created.json()
        settle("doubler")
        status, _, doubled = gateway.call(alice, "POST", "/serve/doubler/v2/models/doubler/infer", {
            "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]})
        assert status == 200 and doubled["model_name"] == "doubler", doubled
        assert doubled["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]
        time.sleep(1)
        assert infer(gateway, alice, "neighbour")[0] == 200
    finally:
        outcomes = [load.stop() for load in loads]
        gateway.close()

    failed = [o for o in sum(outcomes, []) if o != "ok"]
    assert not failed, failed[:5]
    assert all(len(o) > 20 for o in outcomes), [len(o) for o in outcomes]
    assert Deployment.objects.get(name="steady").status == "ready"
    print(f"steady answered {[len(o) for o in outcomes]} requests (gRPC, gRPC, HTTP), none failed")


def _broken_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model.py", BROKEN_MODEL)
    return buffer.getvalue()
