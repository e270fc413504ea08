"""The world of the Kubernetes pool tests (test_k8s_pool.py, test_k8s_pool_restarts.py): the runtime on the fake
cluster, a HAMi GPU pool, deploying into it, and the pods' agents reporting what the loads Secret lists."""

from __future__ import annotations

import base64
import hashlib
import json
from decimal import Decimal
from typing import Any

import pytest

from deployments import reconcile
from deployments.models import Deployment, Pool
from deployments.pool_models import GpuShare
from deployments.runtimes.kubernetes import pool_agent, pool_manifests
from deployments.runtimes.kubernetes.config import KubernetesConfig
from deployments.tests import fake_kube
from deployments.tests.fake_kube import FakeKube
from tests.support.people import Person

NS = "modelport-pools"


@pytest.fixture
def kube_runtime(kube: FakeKube, cfg: KubernetesConfig, settings: Any) -> None:
    """The runtime as the reconciler makes it (from the settings), on the fake cluster and moto's S3."""
    settings.ROLLOUT_DRAIN_SECONDS = 0
    settings.KUBERNETES_KUBECONFIG = cfg.kubeconfig
    settings.KUBERNETES_S3_BUCKET, settings.KUBERNETES_S3_ENDPOINT_URL = cfg.s3_bucket, ""
    settings.KUBERNETES_TRITON_EGRESS = ["52.216.0.0/15:443"]
    # A revision counts at its models' memory limits (pools.cluster_charge): with no headroom and no minimum, at
    # their figures, as these tests reckon; test_k8s_pool_confinement.py tests the charge with the real defaults.
    settings.POOL_MODEL_MEMORY_HEADROOM, settings.POOL_MODEL_MEMORY_MIN = 1.0, "0"
    kube.on_apply = fake_kube.rollout_succeeds


@pytest.fixture
def gpu_pool(db: Any) -> Pool:
    return Pool.objects.create(name="gpu", runtime=Pool.Runtime.KUBERNETES, memory_budget_bytes=8 * 2**30,
                               idle_unload_seconds=0, gpu_share=GpuShare.HAMI, gpus=1, gpu_memory_mib=8192,
                               gpu_cores_percent=50, gpu_type="tesla-t4", gpu_load_fraction=Decimal("0.90"))


def agents_report(kube: FakeKube, failed: dict[str, str] | None = None, namespace: str = NS,
                  refused: dict[str, str] | None = None, **extra: dict[str, Any]) -> None:
    """Each running pod's agent has converged to what the loads Secret lists (minus `failed`, which it refused, and
    the entries marked unloaded), with the sha256 of each refused entry as mounted (or, in `refused`, of the entry
    it refused earlier); `extra`: more fields of its status line (last_used, memory)."""
    secret = kube.get(f"/api/v1/namespaces/{namespace}/secrets/pool-gpu-loads")
    data = (secret or {}).get("data") or {}
    keys = sorted(k.removesuffix(".json") for k, v in data.items() if not pool_agent.is_idle(base64.b64decode(v)))
    failed = failed or {}
    digests = {k: hashlib.sha256(base64.b64decode(data.get(f"{k}.json", ""))).hexdigest() for k in failed}
    status = {"loaded": [k for k in keys if k not in failed], "failed": failed,
              "sha256": {**digests, **(refused or {})}, **extra}
    for pod in kube.items(f"/api/v1/namespaces/{namespace}/pods", "modelport.io/pool=gpu"):
        kube.logs[(namespace, pod["metadata"]["name"], pool_manifests.AGENT_CONTAINER, False)] = (
            "modelport-pool-agent: starting\n" + pool_agent.STATUS_PREFIX + json.dumps(status) + "\n")


def deploy(person: Person, name: str = "digits", pool: str = "gpu") -> Deployment:
    response = person.client().post("/api/v1/deployments/", {
        "name": name, "runtime": "kubernetes", "models": [{"model": "digits"}],
        "placement": {"mode": "shared", "pool": pool}}, format="json")
    assert response.status_code == 201, response.json()
    return Deployment.objects.get(team=person.team, name=name)


def tick(deployment: Deployment, kube: FakeKube, ticks: int = 6, failed: dict[str, str] | None = None,
         refused: dict[str, str] | None = None) -> Deployment:
    for _ in range(ticks):
        reconcile.reconcile(deployment.pk)
        agents_report(kube, failed, refused=refused)
    return Deployment.objects.select_related("serving_revision", "revision").get(pk=deployment.pk)
