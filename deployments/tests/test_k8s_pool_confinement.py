"""A cluster pool is no team's failure domain (issue 30): what the worker renders and writes for it, against the fake
Kubernetes API server (fake_kube.py; no API server runs on this machine). The pods run every model's stub behind
the wrapper that limits it (pool_stub.py, tested as real processes in test_k8s_pool_stub.py), each revision's entry
gives its models' limits, and a revision is charged those limits, so that together they stay within the budget.

With the real POOL_MODEL_MEMORY_HEADROOM and POOL_MODEL_MEMORY_MIN (the other pool tests set them to 1 and 0)."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from deployments import pools
from deployments.model_entry import InstanceGroup
from deployments.models import Deployment, ModelMemory, Pool, PoolLoad
from deployments.runtimes.kubernetes import pool_manifests, pool_runtime
from deployments.tests.fake_kube import FakeKube
from deployments.tests.k8s_pools import NS, agents_report, deploy, gpu_pool, kube_runtime, tick
from models_registry.models import ModelVersion
from tests.support.people import Person

__all__ = ["gpu_pool", "kube_runtime"]  # fixtures of k8s_pools.py, used here
pytestmark = pytest.mark.kube
MiB = 2**20


@pytest.fixture
def real_reservations(kube_runtime: None, settings: Any) -> None:
    settings.POOL_MODEL_MEMORY_HEADROOM, settings.POOL_MODEL_MEMORY_MIN = 1.5, "128Mi"
    settings.POOL_MAX_OUTPUT_BYTES = 8 * MiB
    settings.KUBERNETES_POOL_TRITON_IMAGE = "registry.example/modelport-triton-pool:24.10"


def loads(kube: FakeKube) -> dict[str, dict[str, Any]]:
    secret = kube.get(f"/api/v1/namespaces/{NS}/secrets/pool-gpu-loads")
    assert secret is not None
    return {key: json.loads(base64.b64decode(value)) for key, value in (secret.get("data") or {}).items()}


def test_the_pools_pods_start_every_models_stub_confined_with_what_that_needs(
    alice: Person, digits: ModelVersion, kube: FakeKube, real_reservations: None, gpu_pool: Pool
) -> None:
    assert tick(deploy(alice), kube).status == Deployment.Status.READY
    pod = kube.applied("Deployment")["spec"]["template"]["spec"]
    triton, agent = pod["containers"]
    # The pool's image (onnxruntime for the generated models), started through the script that puts the wrapper in
    # the python backend's place.
    assert triton["image"] == "registry.example/modelport-triton-pool:24.10"
    assert triton["command"] == ["sh", f"{pool_manifests.AGENT_DIR}/pool_triton.sh"]
    assert "--model-control-mode=explicit" in triton["args"]
    env = {e["name"]: e.get("value") for e in triton["env"]}
    assert env["MODELPORT_MAX_OUTPUT_BYTES"] == str(8 * MiB)  # the answer bound, in each model's own process
    assert env["MODELPORT_MODEL_LIMITS_DIR"] == pool_manifests.LIMITS_DIR
    assert env["MODELPORT_USAGE_DIR"] == pool_manifests.USAGE_DIR and env["MODELPORT_CPUS"] == "1"

    def mounts(container: dict[str, Any]) -> dict[str, bool]:
        return {m["name"]: bool(m.get("readOnly")) for m in container["volumeMounts"]}

    # Only the agent writes the limits; only Triton's processes write their figures; nobody but the agent sees the
    # loads Secret.
    assert mounts(triton)["limits"] is True and mounts(agent)["limits"] is False
    assert mounts(triton)["usage"] is False and mounts(agent)["usage"] is True
    assert "loads" not in mounts(triton) and mounts(triton)["agent"] is True
    assert agent["command"][agent["command"].index("--limits-dir") + 1] == pool_manifests.LIMITS_DIR
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert all(volumes[name]["emptyDir"]["medium"] == "Memory" for name in ("limits", "usage", "backends"))
    config_map = kube.applied("ConfigMap")
    source = Path(pool_manifests.__file__).parent
    for name in ("pool_stub.py", "pool_triton.sh", "pool_agent.py", "fetch_repository.py"):
        assert config_map["data"][name] == (source / name).read_text()


def test_each_entry_gives_its_models_limits_and_the_revision_is_charged_them(
    alice: Person, digits: ModelVersion, kube: FakeKube, real_reservations: None, gpu_pool: Pool
) -> None:
    deployment = tick(deploy(alice), kube)
    assert deployment.status == Deployment.Status.READY, deployment.status_message
    key = f"d{deployment.pk}-r1"
    # Never measured: its size times POOL_UNMEASURED_FACTOR, with headroom, at least POOL_MODEL_MEMORY_MIN.
    assert loads(kube)[f"{key}.json"]["memory_limits"] == {f"{key}-digits": 128 * MiB}
    assert PoolLoad.objects.get(deployment=deployment).memory_bytes == 128 * MiB


def test_one_team_cannot_fill_a_cluster_pool_with_models_of_a_few_bytes(
    alice: Person, charlie: Person, digits: ModelVersion, kube: FakeKube, real_reservations: None
) -> None:
    """Each model's processes may hold their limit, whatever its file weighs: a revision counts at its limits, so
    the limits of all the pool's models stay within its budget (the pod's memory limit, the budget plus overhead,
    is then not what runs out), and one team's within its share. Counted at their files' size (as before), any
    number of tiny models fitted, each then allowed 128 MiB."""
    from tests.support.versions import make_ready_version

    Pool.objects.create(
        name="gpu", runtime=Pool.Runtime.KUBERNETES, memory_budget_bytes=1024 * MiB, idle_unload_seconds=0
    )
    for name in ("a1", "a2", "a3", "a4"):  # 4 x 128 MiB: the team's half of 1 GiB
        assert tick(deploy(alice, name), kube).status == Deployment.Status.READY
    fifth = tick(deploy(alice, "a5"), kube)
    assert fifth.status == Deployment.Status.FAILED
    assert "your team's share of it" in fifth.status_message and "128 MiB" in fifth.status_message
    assert f"d{fifth.pk}-r1.json" not in loads(kube)  # the agents were never asked
    make_ready_version(charlie)
    assert tick(deploy(charlie), kube).status == Deployment.Status.READY  # the other half is the other team's


def test_a_models_instances_share_its_reservation_each_at_least_the_minimum(
    alice: Person, digits: ModelVersion, kube: FakeKube, real_reservations: None, gpu_pool: Pool
) -> None:
    deployment = tick(deploy(alice), kube)
    assert deployment.revision is not None
    ModelMemory.objects.create(version=digits, fingerprint=pools.fingerprint(gpu_pool), memory_bytes=400 * MiB)
    spec = deployment.revision.spec
    two = replace(spec, models=tuple(replace(entry, instance_group=InstanceGroup(count=2)) for entry in spec.models))
    assert pools.process_limits(two, gpu_pool) == {"digits": 300 * MiB}  # 1.5 x 400 MiB, in two processes
    assert pools.cluster_charge(two, gpu_pool) == 600 * MiB
    eight = replace(spec, models=tuple(replace(entry, instance_group=InstanceGroup(count=8)) for entry in spec.models))
    assert pools.process_limits(eight, gpu_pool) == {"digits": 128 * MiB}  # a stub holds its minimum idle
    assert pools.cluster_charge(eight, gpu_pool) == 8 * 128 * MiB


def test_a_figure_grown_under_use_is_kept_at_the_periodic_pass_and_never_lowered(
    alice: Person, digits: ModelVersion, kube: FakeKube, real_reservations: None, gpu_pool: Pool
) -> None:
    """The agents report each model's own processes' peak as it grows (onnxruntime's arena at the first request):
    beat's pass over the pool keeps the most seen, which the next load's limit and the charge come from."""
    from deployments.runtimes.kubernetes.runtime import KubernetesRuntime

    deployment = tick(deploy(alice), kube)
    key = f"d{deployment.pk}-r1"
    runtime = KubernetesRuntime()
    agents_report(kube, memory={key: {"digits": 200 * MiB}})
    pool_runtime.unload_idle(runtime)
    assert ModelMemory.objects.get(version=digits).memory_bytes == 200 * MiB
    assert PoolLoad.objects.get(deployment=deployment).memory_bytes == 300 * MiB  # 1.5 x 200 MiB
    agents_report(kube, memory={key: {"digits": 90 * MiB}})  # a restarted process, say: the peak stays
    pool_runtime.unload_idle(runtime)
    assert ModelMemory.objects.get(version=digits).memory_bytes == 200 * MiB
    assert PoolLoad.objects.get(deployment=deployment).memory_bytes == 300 * MiB
    # The entry written next (a renewal, the next load) gives the model its grown limit.
    assert pool_runtime._entry(runtime, deployment.revision)["memory_limits"] == {  # type: ignore[arg-type]
        f"{key}-digits": 300 * MiB
    }
