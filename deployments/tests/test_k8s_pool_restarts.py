"""A cluster pool's Triton that restarts is told to every deployment in the pool, once, then that its models are
back (issue 24, "Faults"; deployments/runtimes/kubernetes/pool_restarts.py).

Against the fake API server (fake_kube.py), since no Kubernetes API server can run on this machine: the test plays
the kubelet (a pod's `triton` container's restartCount, lastState and startedAt; an evicted pod's phase) and the
pods' agents (their container logs, with the kubelet's timestamps on each line). The agent's reload after a restart
is tested for real in test_k8s_pool_agent.py.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from deployments.models import Deployment, Event, Pool, PoolLoad, PoolPod
from deployments.runtimes.kubernetes import pool_agent, pool_manifests, pool_restarts, pool_runtime
from deployments.tests import fake_kube
from deployments.tests.fake_kube import FakeKube
from deployments.tests.k8s_pools import NS, agents_report, deploy, gpu_pool, kube_runtime, tick
from models_registry.models import ModelVersion
from tests.support.people import Person

__all__ = ["gpu_pool", "kube_runtime"]  # fixtures of the pool tests, used here too


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pods(kube: FakeKube, pool: str = "gpu") -> list[dict[str, Any]]:
    return kube.items(f"/api/v1/namespaces/{NS}/pods", f"modelport.io/pool={pool}")


def restart(kube: FakeKube, pod: dict[str, Any], reason: str = "OOMKilled", exit_code: int = 137) -> datetime:
    """The kubelet restarted the pod's `triton` container: its count rose, the last one's end is recorded, and the
    new one runs since now (returned)."""
    started = datetime.now(UTC).replace(microsecond=0)
    status = pod["status"]["containerStatuses"][0]
    status["restartCount"] = int(status.get("restartCount", 0)) + 1
    status["lastState"] = {"terminated": {"reason": reason, "exitCode": exit_code}}
    status["state"] = {"running": {"startedAt": started.strftime("%Y-%m-%dT%H:%M:%SZ")}}
    kube.put(fake_kube.pod_path(NS, pod["metadata"]["name"]), pod)
    return started


def agent_log(kube: FakeKube, pod: str, lines: list[tuple[datetime, str]], keys: list[str]) -> None:
    """The pod's agent log as the kubelet keeps it (each line timestamped), ending with a status line loading
    `keys`."""
    status = {"loaded": sorted(keys), "failed": {}, "sha256": {}}
    last = lines[-1][0] if lines else datetime.now(UTC)
    text = [f"{stamp(when)} modelport-pool-agent: {line}" for when, line in lines]
    text.append(f"{stamp(last)} {pool_agent.STATUS_PREFIX}{json.dumps(status)}")
    kube.logs[(NS, pod, pool_manifests.AGENT_CONTAINER, False)] = "\n".join(text) + "\n"


def reloaded(kube: FakeKube, pod: str, keys: list[str], started: datetime) -> None:
    """The agent saw Triton lose the keys' models after its restart and loaded them again."""
    before = started - timedelta(minutes=5)
    lines = [(before, f"{key}: loaded 1 model(s), every sha256 verified") for key in keys]
    lines += [(started + timedelta(seconds=1), f"{key}: Triton no longer has {key}-digits ready: loading it again")
              for key in keys]
    lines += [(started + timedelta(seconds=2), f"{key}: loaded 1 model(s), every sha256 verified") for key in keys]
    agent_log(kube, pod, lines, keys)


def passes(count: int = 1) -> list[str]:
    from deployments.runtimes.kubernetes.runtime import KubernetesRuntime

    done: list[str] = []
    for _ in range(count):
        done += pool_runtime.unload_idle(KubernetesRuntime())
    return done


def told(deployment: Deployment, kind: str | None = None) -> list[str]:
    found = Event.objects.filter(deployment=deployment).order_by("time", "pk")
    return [e.message for e in (found.filter(kind=kind) if kind else found) if "shared pool" in e.message]


def key_of(deployment: Deployment) -> str:
    return f"d{deployment.pk}-r1"


@pytest.fixture
def two_teams(alice: Person, charlie: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None,
              gpu_pool: Pool) -> tuple[Deployment, Deployment]:
    """alice's and charlie's deployments, ready in the open pool `gpu`, its one pod seen by a first pass."""
    from tests.support.versions import make_ready_version

    make_ready_version(charlie)
    mine, theirs = tick(deploy(alice), kube), tick(deploy(charlie), kube)
    assert mine.status == theirs.status == Deployment.Status.READY, (mine.status_message, theirs.status_message)
    assert passes() == []  # the pod is remembered, with its count: nothing to tell
    assert [row.name for row in PoolPod.objects.all()] == [pods(kube)[0]["metadata"]["name"]]
    return mine, theirs


# --- Reading the pod and the agent's log (no database) -------------------------------------------------------------


def test_a_restarts_reason_names_the_oom_kill_with_the_memory_limit_or_the_exit_code() -> None:
    pod = {"spec": {"containers": [{"name": "triton", "resources": {"limits": {"memory": "3Gi"}}}]},
           "status": {"containerStatuses": [{"name": "triton", "restartCount": 1, "lastState": {
               "terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}}
    assert pool_restarts.restart_reason(pod) == "OOMKilled, memory limit 3 GiB"
    pod["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"reason": "Error", "exitCode": 139}}
    assert pool_restarts.restart_reason(pod) == "Error, exit code 139"
    pod["status"]["containerStatuses"][0]["lastState"] = {}
    assert pool_restarts.restart_reason(pod) == "no reason given"


@pytest.mark.parametrize("count", ["7", -3, True, None, 2.5])
def test_an_odd_restart_count_reads_as_none(count: Any) -> None:
    assert pool_restarts.restart_count({"status": {"containerStatuses": [{"name": "triton",
                                                                            "restartCount": count}]}}) == 0


def test_only_a_load_the_agent_wrote_after_the_new_triton_started_counts_as_back() -> None:
    started = datetime(2026, 12, 1, 18, 0, 0, tzinfo=UTC)
    at = {delta: stamp(started + timedelta(seconds=delta)) for delta in (-60, 1, 2, 3)}
    prefix = "modelport-pool-agent: "
    text = "\n".join([
        f"{at[-60]} {prefix}d1-r1: loaded 1 model(s)",  # before the restart: the old Triton's
        f"{at[-60]} {prefix}d2-r1: loaded 1 model(s)",
        f"{at[1]} {prefix}d3-r1: loaded 2 model(s)",
        f"{at[2]} {prefix}d3-r1: Triton no longer has d3-r1-a ready: loading it again",  # lost again after
        f"{at[1]} {prefix}d4-r1: loaded 1 model(s)",
        f"{at[2]} {prefix}Triton does not answer: nothing is reported loaded until it does",
        f"{at[3]} {prefix}d5-r1: loaded 1 model(s)",
        f"{at[3]} {prefix}d6-r1: refused: model 'x' failed to load",
        f"{prefix}d7-r1: loaded 1 model(s)",  # no timestamp: not the kubelet's line
        f"{at[3]} Triton wrote: d8-r1: loaded 1 model(s)",  # not the agent's
        f"{at[3]} {prefix}d9-r1-x: loaded 1 model(s)",  # not a revision key
    ])
    assert pool_restarts.agent_loads_since(text, started) == {"d5-r1"}


# --- Through the worker's pass over the pool ------------------------------------------------------------------------


@pytest.mark.kube
def test_a_restart_is_told_once_to_every_deployment_in_the_pool_then_that_its_models_are_back(
        two_teams: tuple[Deployment, Deployment], kube: FakeKube, alice: Person, charlie: Person) -> None:
    mine, theirs = two_teams
    pod = pods(kube)[0]
    name = pod["metadata"]["name"]
    started = restart(kube, pod)
    # The agent's last status line is still the one it wrote before the restart: everything loaded.
    agents_report(kube)
    done = passes(2)  # a restart seen by two passes
    assert done == [f"pool 'gpu': pod {name} restarted, told to 2 deployment(s)"]
    limit = pool_restarts.restart_reason(pod).removeprefix("OOMKilled, ")
    for deployment, other in ((mine, theirs), (theirs, mine)):
        assert told(deployment) == [f"The Triton of shared pool 'gpu' in pod {name} restarted (OOMKilled, {limit}); "
                                    "this deployment's models are loading again."]
        assert "MiB" in limit or "GiB" in limit
        assert key_of(other) not in told(deployment)[0] and other.name not in told(deployment)[0].split("pod")[0]
    row = PoolPod.objects.get(name=name)
    assert row.restart_count == 1
    assert set(row.reloading) == set(PoolLoad.objects.values_list("pk", flat=True))

    reloaded(kube, name, [key_of(mine)], started)  # alice's back, charlie's not yet
    assert passes() == [f"pool 'gpu': models of {mine} loaded again after a restart"]
    assert told(mine, Event.Kind.INFO) == [f"This deployment's models are loaded again in pod {name} of shared pool "
                                           "'gpu'."]
    assert told(theirs, Event.Kind.INFO) == []
    reloaded(kube, name, [key_of(mine), key_of(theirs)], started)
    assert passes(2) == [f"pool 'gpu': models of {theirs} loaded again after a restart"]
    assert len(told(mine)) == len(told(theirs)) == 2
    assert PoolPod.objects.get(name=name).reloading == []
    # Each team reads its own events through the API, and never the other's deployment there.
    for person, deployment in ((alice, mine), (charlie, theirs)):
        response = person.client().get(f"/api/v1/deployments/{deployment.name}/events/")
        assert response.status_code == 200
        messages = [e["message"] for e in response.json()]
        assert any("restarted (OOMKilled" in m for m in messages)
        other = theirs if deployment == mine else mine
        assert not any(key_of(other) in m for m in messages)


@pytest.mark.kube
def test_two_restarts_are_two_events(two_teams: tuple[Deployment, Deployment], kube: FakeKube) -> None:
    mine, _theirs = two_teams
    name = pods(kube)[0]["metadata"]["name"]
    stale = PoolPod.objects.get(name=name)
    restart(kube, pods(kube)[0], reason="Error", exit_code=1)
    passes()
    # A second worker that read the row before the first told the restart cannot tell it again.
    assert pool_restarts._claim(stale, stale.pool, 1, gone=False, message="The shared pool ... again") == []
    restart(kube, pods(kube)[0], reason="Error", exit_code=139)
    passes(2)
    assert [m.split("(")[1].split(")")[0] for m in told(mine, Event.Kind.WARNING)] == [
        "Error, exit code 1", "Error, exit code 139"]
    assert PoolPod.objects.get(name=name).restart_count == 2


@pytest.mark.kube
def test_a_pod_the_autoscaler_replaced_tells_nothing(two_teams: tuple[Deployment, Deployment],
                                                     kube: FakeKube) -> None:
    mine, theirs = two_teams
    old = pods(kube)[0]
    kube.remove(fake_kube.pod_path(NS, old["metadata"]["name"]))
    new = json.loads(json.dumps(old))
    new["metadata"]["name"] = old["metadata"]["name"] + "-x"  # a new name, its count 0
    kube.put(fake_kube.pod_path(NS, new["metadata"]["name"]), new)
    agents_report(kube)
    assert passes(2) == []
    assert told(mine) == told(theirs) == []
    assert [row.name for row in PoolPod.objects.all()] == [new["metadata"]["name"]]


@pytest.mark.kube
def test_a_restart_in_another_pool_tells_nothing_here(two_teams: tuple[Deployment, Deployment], kube: FakeKube,
                                                      alice: Person) -> None:
    mine, theirs = two_teams
    Pool.objects.create(name="cpu", runtime=Pool.Runtime.KUBERNETES, memory_budget_bytes=2**30,
                        idle_unload_seconds=0)
    elsewhere = deploy(alice, "digits-cpu", pool="cpu")
    for _ in range(6):
        from deployments import reconcile

        reconcile.reconcile(elsewhere.pk)
        cpu_agents_report(kube)
    assert Deployment.objects.get(pk=elsewhere.pk).status == Deployment.Status.READY
    passes()
    restart(kube, pods(kube, "cpu")[0])
    passes()
    assert told(mine) == told(theirs) == []
    assert [m.split(" in pod")[0] for m in told(elsewhere)] == ["The Triton of shared pool 'cpu'"]
    assert PoolPod.objects.get(name=pods(kube)[0]["metadata"]["name"]).restart_count == 0


def cpu_agents_report(kube: FakeKube) -> None:
    """The `cpu` pool's agents have loaded what its loads Secret lists."""
    secret = kube.get(f"/api/v1/namespaces/{NS}/secrets/pool-cpu-loads") or {}
    keys = sorted(k.removesuffix(".json") for k, v in (secret.get("data") or {}).items()
                  if not pool_agent.is_idle(base64.b64decode(v)))
    for pod in pods(kube, "cpu"):
        kube.logs[(NS, pod["metadata"]["name"], pool_manifests.AGENT_CONTAINER, False)] = (
            pool_agent.STATUS_PREFIX + json.dumps({"loaded": keys, "failed": {}}) + "\n")


@pytest.mark.kube
def test_a_pod_kubernetes_evicted_is_told_and_its_models_are_back_once_its_replacement_has_them(
        two_teams: tuple[Deployment, Deployment], kube: FakeKube) -> None:
    mine, theirs = two_teams
    pod = pods(kube)[0]
    name = pod["metadata"]["name"]
    pod["status"] = {"phase": "Failed", "reason": "Evicted",
                     "message": "The node was low on resource: memory.\nContainer triton was using 9Gi."}
    kube.put(fake_kube.pod_path(NS, name), pod)
    assert passes(2) == [f"pool 'gpu': pod {name} stopped, told to 2 deployment(s)"]
    assert told(mine) == [f"The Triton pod {name} of shared pool 'gpu' was stopped by Kubernetes (Evicted: The node "
                          "was low on resource: memory. Container triton was using 9Gi.); this deployment's models "
                          "are loading again in the pool's other or new pods."]
    replacement = json.loads(json.dumps(pod))
    replacement["metadata"]["name"] = name + "-new"
    replacement["status"] = fake_kube.ready_status()
    kube.put(fake_kube.pod_path(NS, name + "-new"), replacement)
    kube.logs[(NS, name + "-new", pool_manifests.AGENT_CONTAINER, False)] = (
        pool_agent.STATUS_PREFIX + json.dumps({"loaded": [key_of(mine)], "failed": {}}) + "\n")
    assert passes() == [f"pool 'gpu': models of {mine} loaded again after a restart"]
    assert told(theirs, Event.Kind.INFO) == []
    agents_report(kube)  # the replacement has both now
    assert passes(2) == [f"pool 'gpu': models of {theirs} loaded again after a restart"]
    assert told(theirs, Event.Kind.INFO) == ["This deployment's models are loaded again in the pods of shared pool "
                                             "'gpu'."]
    kube.remove(fake_kube.pod_path(NS, name))
    passes()
    assert [row.name for row in PoolPod.objects.all()] == [name + "-new"]  # the stopped pod is forgotten
