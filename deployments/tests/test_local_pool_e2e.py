"""Shared servers on the real local runtime (issue 24): two teams' deployments of a model named `digits` in the
pool `shared`, served by one sandboxed Triton in explicit model-control mode, each answering its own through the
gateway (driven in-process as an ASGI app); idle unload and the held first request; the budget refusal; a pool
Triton killed and its models loaded again.

The reconciler is ticked here as a worker would; the gateway is the real one, its database lookups in threads."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deployments import reconcile, triton_metrics
from deployments.models import Deployment, ModelMemory, Pool, PoolLoad, PoolServer
from deployments.pools import shared_pool
from deployments.runtimes.local import pool as local_pool
from deployments.runtimes.local import triton as local_triton
from deployments.tests.pool_e2e import Asgi, _stop_pool_servers, deploy, gateway, infer, people, settle, tick_until
from tests.artifacts import tiny_onnx
from tests.support.people import Person
from tests.support.versions import make_ready_version

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]
__all__ = ["_stop_pool_servers", "gateway", "people"]  # fixtures (deployments/tests/pool_e2e.py)


def test_two_teams_models_of_one_name_share_one_triton_and_each_answers_its_own(
        people: dict[str, Person], gateway: Asgi) -> None:
    alice, charlie = people["alice"], people["charlie"]
    make_ready_version(alice, data=tiny_onnx(out_features=3))
    make_ready_version(charlie, data=tiny_onnx(out_features=5))
    deploy(alice, "digits-a")
    deploy(charlie, "digits-c")
    a, c = settle("digits-a"), settle("digits-c")
    [server] = PoolServer.objects.filter(state=PoolServer.State.RUNNING)
    assert server.pool.name == "shared" and server.sandboxed is not None
    assert a.upstream_url == c.upstream_url == server.url  # one Triton process for both teams

    status, answer = infer(gateway, alice, "digits-a")
    assert status == 200, answer
    assert answer["model_name"] == "digits" and answer["outputs"][0]["shape"] == [2, 3]
    status, answer = infer(gateway, charlie, "digits-c")
    assert status == 200 and answer["model_name"] == "digits" and answer["outputs"][0]["shape"] == [2, 5]

    # The pool's Triton as the portal's /metrics relays it (deployments/triton_metrics.py): each team's requests under
    # its own labels and model name, the server's memory the pool's, no team's.
    relayed = {family.name: [sample.labels for sample in family.samples] for family in
               text_string_to_metric_families(triton_metrics.exposition(triton_metrics.targets()).decode())}
    assert sorted((labels["team"], labels["deployment"], labels["revision"], labels["pool"], labels["model"])
                  for labels in relayed["nv_inference_request_success"]) == [
        ("acme", "digits-a", "1", "shared", "digits"), ("globex", "digits-c", "1", "shared", "digits")]
    assert relayed["nv_cpu_memory_used_bytes"] == [{"pool": "shared"}]

    # Metadata, config and statistics name the user's model; the pool's other models are invisible.
    status, _, meta = gateway.call(alice, "GET", "/serve/digits-a/v2/models/digits")
    assert status == 200 and meta["name"] == "digits", meta
    status, _, config = gateway.call(alice, "GET", "/serve/digits-a/v2/models/digits/config")
    assert status == 200 and config["name"] == "digits"
    status, _, stats = gateway.call(alice, "GET", "/serve/digits-a/v2/models/stats")
    assert status == 200 and [row["name"] for row in stats["model_stats"]] == ["digits"]
    other = f"d{c.pk}-r1-digits"
    status, _, refused = gateway.call(alice, "GET", f"/serve/digits-a/v2/models/{other}")
    assert status == 404 and other in refused["error"]
    status, _, _ = gateway.call(alice, "POST", f"/serve/digits-a/v2/models/{other}/infer",
                                {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]})
    assert status == 404
    assert gateway.call(charlie, "GET", "/serve/digits-a/v2/models/digits")[0] == 404

    # Memory was measured at the load and kept with each version; the pool's listing counts the team's own only.
    assert ModelMemory.objects.count() == 2 and all(m.memory_bytes > 0 for m in ModelMemory.objects.all())
    [listed] = [p for p in alice.client().get("/api/v1/pools/?model=digits").json() if p["name"] == "shared"]
    assert listed["models_loaded"] == 1 and listed["memory_used_bytes"] > 0 and listed["fit"]["copies"] > 0
    assert listed["memory_used_bytes"] == PoolLoad.objects.get(deployment__name="digits-a").memory_bytes
    shown = alice.client().get("/api/v1/deployments/digits-a/").json()
    assert shown["placement"]["state"] == "loaded" and shown["models"][0]["loaded"] is True
    assert shown["placement"]["cold_start_seconds"] > 0

    # A rollout loads the new revision beside the old, switches, and unloads the old one.
    patched = alice.client().patch("/api/v1/deployments/digits-a/", {"models": [{"model": "digits",
                                                                                  "max_batch_size": 4}]},
                                   format="json")
    assert patched.status_code == 200
    a = settle("digits-a")
    assert a.serving_revision.number == 2
    # The drain ends, the old revision is retired.
    tick_until(a, lambda: not PoolLoad.objects.filter(deployment=a, revision__number=1).exists(),
               "the old revision retired")
    assert list(PoolLoad.objects.filter(deployment=a).values_list("revision__number", flat=True)) == [2]
    assert not (local_pool.repository(server.pool) / f"d{a.pk}-r1-digits").exists()
    assert infer(gateway, alice, "digits-a")[0] == 200

    # Deleting unloads and removes the files; the other team's model answers on.
    alice.client().delete("/api/v1/deployments/digits-a/")
    tick_until(a, lambda: not Deployment.objects.filter(pk=a.pk).exists(), "deleted")
    assert not any(p.name.startswith(f"d{a.pk}-") for p in local_pool.repository(server.pool).iterdir())
    assert infer(gateway, charlie, "digits-c")[0] == 200


def test_an_idle_model_is_unloaded_and_the_first_request_after_waits_for_its_load(
        people: dict[str, Person], gateway: Asgi, settings: Any) -> None:
    alice = people["alice"]
    settings.POOL_IDLE_UNLOAD_LOAD_FACTOR = 0  # its idle_unload_seconds alone (test_local_pool_lock_hog_e2e.py)
    make_ready_version(alice)
    deploy(alice, "digits-idle", idle_unload_seconds=1)
    deployment = settle("digits-idle")
    time.sleep(1.5)
    assert local_pool.unload_idle() == ["unloaded acme/digits-idle r1 from pool 'shared'"]
    load = PoolLoad.objects.get(deployment=deployment)
    assert load.state == PoolLoad.State.UNLOADED
    assert alice.client().get("/api/v1/deployments/digits-idle/").json()["models"][0]["loaded"] is False
    reconcile.reconcile(deployment.pk)  # a health check of an idle model restarts nothing
    assert Deployment.objects.get(pk=deployment.pk).status == "ready"

    started = time.monotonic()
    status, answer = infer(gateway, alice, "digits-idle")
    held = time.monotonic() - started
    assert status == 200 and answer["model_name"] == "digits", answer
    assert PoolLoad.objects.get(pk=load.pk).state == PoolLoad.State.LOADED
    # Held no longer than the wait it promises (a small ONNX model's cold start, which a loaded machine slows).
    assert held < settings.POOL_COLD_START_WAIT_SECONDS, held
    # Both are the deployment's events, newest first, the load with the time it took.
    cold = PoolLoad.objects.get(pk=load.pk).cold_start_seconds
    assert cold is not None
    told = [e["message"] for e in alice.client().get("/api/v1/deployments/digits-idle/events/").json()[:2]]
    assert told[0] == f"Loaded again in pool 'shared' by a request, in {cold:.1f} s (the request waited for it)."
    assert told[1].startswith("Unloaded from pool 'shared': unused for ") and "after 1 s unused" in told[1]

    # A wait shorter than the load: 503 with Retry-After, and the load goes on for the retry.
    time.sleep(1.5)
    assert local_pool.unload_idle()
    settings.POOL_COLD_START_WAIT_SECONDS = 0.0
    status, headers, refused = gateway.call(alice, "POST", "/serve/digits-idle/v2/models/digits/infer", {
        "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]})
    assert status == 503 and headers["retry-after"] == "2" and "loading" in refused["error"]
    settings.POOL_COLD_START_WAIT_SECONDS = 10.0
    assert infer(gateway, alice, "digits-idle")[0] == 200


def test_a_load_past_the_budget_is_refused_naming_what_to_unload(people: dict[str, Person]) -> None:
    alice = people["alice"]
    make_ready_version(alice)
    deploy(alice, "digits-one", idle_unload_seconds=0)
    settle("digits-one")
    pool = shared_pool()
    used = PoolLoad.objects.get(deployment__name="digits-one").memory_bytes
    Pool.objects.filter(pk=pool.pk).update(memory_budget_bytes=used + used // 2)  # room for half another
    deploy(alice, "digits-two", idle_unload_seconds=0)
    deployment = Deployment.objects.get(name="digits-two")
    tick_until(deployment, lambda: Deployment.objects.get(pk=deployment.pk).status == "failed", "failed")
    deployment.refresh_from_db()
    assert "stop one of your deployments loaded in it (digits-one r1" in deployment.status_message
    assert "placement mode 'dedicated'" in deployment.status_message


def test_a_pool_triton_that_dies_is_started_again_with_its_models_loaded(
        people: dict[str, Person], gateway: Asgi) -> None:
    alice = people["alice"]
    make_ready_version(alice)
    deploy(alice, "digits-k", idle_unload_seconds=0)
    deployment = settle("digits-k")
    [server] = PoolServer.objects.filter(state=PoolServer.State.RUNNING)
    os.kill(server.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while local_triton.is_alive(server.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not local_triton.is_alive(server.pid)
    for _ in range(5):  # a tick may end the drain first; the health check finds it dead, starts it, loads
        reconcile.reconcile(deployment.pk)
        if not PoolServer.objects.filter(pk=server.pk, state=PoolServer.State.RUNNING).exists():
            break
    [again] = PoolServer.objects.filter(state=PoolServer.State.RUNNING)
    assert again.pid != server.pid and again.http_port == server.http_port
    assert PoolLoad.objects.get(deployment=deployment).state == PoolLoad.State.LOADED
    status, answer = infer(gateway, alice, "digits-k")
    assert status == 200, answer
    died = deployment.events.get(message__contains="died")
    assert "started again" not in died.message and "loaded again at its next health check" in died.message
    assert deployment.events.filter(
        message__startswith=f"Loaded again in pool 'shared', into its Triton started again (pid {again.pid})").exists()
    assert np.asarray(answer["outputs"][0]["data"]).size == 6
