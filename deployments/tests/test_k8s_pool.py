"""Pools on the Kubernetes runtime (issue 24): the pool's objects, its GPU share classes, and loads, rollouts, stop
and delete through the reconciler.

Against a fake API server (fake_kube.py), since no Kubernetes API server can run on this machine; the fake plays
the Deployment controller (`rollout_succeeds`) and, here, the pods' agents (`agents_report`: each running pod's
`pool-agent` container log gets the status line the real agent prints, from what the loads Secret lists). The agent
itself is tested for real in test_k8s_pool_agent.py; the manifests are validated against the OpenAPI schemas of two
Kubernetes versions with kubernetes-validate.
"""

from __future__ import annotations

import base64
import json
import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from deployments import reconcile
from deployments.models import Deployment, Pool, PoolLoad
from deployments.pool_models import GpuShare
from deployments.runtimes.kubernetes import pool_agent, pool_manifests, pool_runtime
from deployments.runtimes.kubernetes.config import KubernetesConfig, parse_egress
from deployments.tests.fake_kube import FakeKube
from deployments.tests.k8s_pools import NS, agents_report, deploy, gpu_pool, kube_runtime, tick
from deployments.tests.manifests import validate_everywhere
from models_registry.models import ModelVersion
from tests.support.people import Person

__all__ = ["gpu_pool", "kube_runtime"]  # fixtures of k8s_pools.py, used here

LOADS = f"/api/v1/namespaces/{NS}/secrets/pool-gpu-loads"
CONFIG = KubernetesConfig(kubeconfig="/dev/null", s3_bucket="models", egress=(parse_egress("10.0.5.0/24:9000"),))


def loads(kube: FakeKube) -> dict[str, dict[str, Any]]:
    secret = kube.get(LOADS)
    assert secret is not None
    return {key: json.loads(base64.b64decode(value)) for key, value in (secret.get("data") or {}).items()}


# --- The pool's objects -------------------------------------------------------------------------------------------


def _target(**fields: Any) -> pool_manifests.PoolTarget:
    return pool_manifests.PoolTarget(**{"name": "gpu", "team": "", "memory_budget_bytes": 2**30, **fields})


@pytest.mark.parametrize("fields", [
    {},
    {"gpu_requests": (("nvidia.com/gpu", "1"), ("nvidia.com/gpumem", "8192"), ("nvidia.com/gpucores", "50")),
     "gpu_count": 1, "gpu_load_fraction": Decimal("0.5"), "min_replicas": 2, "max_replicas": 4},
    {"gpu_requests": (("nvidia.com/mig-1g.10gb", "1"),), "gpu_count": 1, "min_replicas": 2, "max_replicas": 2},
])
def test_the_pools_objects_are_valid_on_two_kubernetes_versions(fields: dict[str, Any]) -> None:
    objects = pool_manifests.build(_target(**fields), NS, CONFIG)
    objects += [pool_manifests.admin_secret(_target(), NS, "k"), pool_manifests.loads_secret(_target(), NS, {})]
    for obj in objects:
        validate_everywhere(obj)
    kinds = [obj["kind"] for obj in objects]
    assert kinds.count("PodDisruptionBudget") == (1 if fields.get("min_replicas", 1) > 1 else 0)
    assert kinds.count("HorizontalPodAutoscaler") == (1 if fields.get("max_replicas", 1) > 2 else 0)


def test_the_pools_triton_holds_no_s3_key_and_only_the_agent_sees_the_urls() -> None:
    deployment = pool_manifests.pool_deployment(_target(), NS, CONFIG)
    pod = deployment["spec"]["template"]["spec"]
    triton, agent = pod["containers"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"] == {
        "type": "RuntimeDefault"}
    for container in (triton, agent):
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                                "readOnlyRootFilesystem": True, "runAsNonRoot": True}
    assert "--model-control-mode=explicit" in triton["args"]
    assert any(arg.startswith("--http-restricted-api=model-repository") for arg in triton["args"])
    assert {m["name"] for m in triton["volumeMounts"]} == {"dshm", "tmp", "repository", "agent", "limits", "usage",
                                                           "backends"}
    assert "loads" not in {m["name"] for m in triton["volumeMounts"]}
    for name in ("repository", "agent", "limits"):  # what it loads, its start script, its models' limits
        assert next(m for m in triton["volumeMounts"] if m["name"] == name)["readOnly"] is True
    assert "loads" in {m["name"] for m in agent["volumeMounts"]}
    # The pod joins the Service only once its agent has loaded what the others serve.
    assert agent["readinessProbe"]["exec"]["command"] == ["cat", pool_manifests.AGENT_READY_FILE]
    assert agent["command"][agent["command"].index("--ready-file") + 1] == pool_manifests.AGENT_READY_FILE
    assert not any("AWS" in e["name"] or "S3" in e["name"] for e in triton["env"] + agent["env"])
    policy = pool_manifests.pool_network_policy(_target(), NS, CONFIG)
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert {"to": [{"ipBlock": {"cidr": "10.0.5.0/24"}}], "ports": [{"protocol": "TCP", "port": 9000}]} in \
        policy["spec"]["egress"]


def test_the_model_load_gpu_limit_is_set_per_gpu_where_the_pool_has_a_budget() -> None:
    args = pool_manifests.triton_args(_target(gpu_count=2, gpu_load_fraction=Decimal("0.80")), CONFIG)
    assert [a for a in args if a.startswith("--model-load-gpu-limit")] == [
        "--model-load-gpu-limit=0:0.80", "--model-load-gpu-limit=1:0.80"]
    assert not [a for a in pool_manifests.triton_args(_target(), CONFIG) if a.startswith("--model-load-gpu-limit")]


@pytest.mark.parametrize(("share", "fields", "resources", "words"), [
    (GpuShare.WHOLE, {"gpus": 2}, {"nvidia.com/gpu": "2"}, "memory and faults isolated"),
    (GpuShare.MIG, {"mig_profile": "1g.10gb"}, {"nvidia.com/mig-1g.10gb": "1"}, "isolated in hardware"),
    (GpuShare.TIME_SLICED, {}, {"nvidia.com/gpu": "1"}, "no memory isolation"),
    (GpuShare.MPS, {}, {"nvidia.com/gpu": "1"}, "no fault isolation"),
    (GpuShare.HAMI, {"gpu_memory_mib": 8192, "gpu_cores_percent": 50, "gpu_type": "tesla-t4"},
     {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "50"},
     "8192 MiB of GPU memory, 50% of its cores, capped in software"),
])
def test_each_share_class_requests_what_it_says_and_says_what_it_isolates(
        db: Any, share: str, fields: dict[str, Any], resources: dict[str, str], words: str) -> None:
    pool = Pool(name="gpu", runtime=Pool.Runtime.KUBERNETES, memory_budget_bytes=2**30, gpu_share=share, **fields)
    pool.full_clean()
    assert pool.gpu_requests() == resources
    assert words in pool.isolation
    deployment = pool_manifests.pool_deployment(pool_runtime.target_for(pool, CONFIG), NS, CONFIG)
    triton = deployment["spec"]["template"]["spec"]["containers"][0]
    assert {k: v for k, v in triton["resources"]["limits"].items() if k.startswith("nvidia.com/")} == resources
    selector = deployment["spec"]["template"]["spec"].get("nodeSelector", {})
    strategy = {"whole": "none", "time_sliced": "time-slicing", "mps": "mps"}.get(share)
    # Only where the device plugin shares the GPUs so (whole GPUs: where it does not share them at all).
    assert selector.get("nvidia.com/gpu.sharing-strategy") == strategy


@pytest.mark.parametrize(("fields", "field"), [
    ({"gpu_share": GpuShare.MIG}, "mig_profile"),
    ({"gpu_share": GpuShare.MIG, "mig_profile": "huge"}, "mig_profile"),
    ({"gpu_share": GpuShare.HAMI}, "gpu_memory_mib"),
    ({"gpu_share": GpuShare.WHOLE, "gpu_memory_mib": 100}, "gpu_memory_mib"),
    ({"gpus": 1}, "gpu_share"),
    ({"min_replicas": 3, "max_replicas": 2}, "max_replicas"),
    ({"gpu_share": GpuShare.WHOLE, "runtime": Pool.Runtime.LOCAL}, "gpu_share"),
])
def test_the_admin_refuses_a_share_class_that_does_not_add_up(db: Any, fields: dict[str, Any], field: str) -> None:
    pool = Pool(name="gpu", memory_budget_bytes=2**30, **{"runtime": Pool.Runtime.KUBERNETES, **fields})
    with pytest.raises(ValidationError) as raised:
        pool.full_clean()
    assert field in raised.value.message_dict


# --- Through the reconciler ---------------------------------------------------------------------------------------


@pytest.mark.kube
def test_a_shared_deployment_loads_in_the_pool_through_its_agents(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool) -> None:
    deployment = deploy(alice)
    reconcile.reconcile(deployment.pk)
    reconcile.reconcile(deployment.pk)
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status != Deployment.Status.READY  # the agents have not said yet
    key = f"d{deployment.pk}-r1"
    entry = loads(kube)[f"{key}.json"]
    assert entry["models"] == [f"{key}-digits"]
    assert all(f["path"].startswith(f"{key}-digits/") and f["url"].startswith("https://") for f in entry["files"])
    row = tick(deployment, kube)
    assert row.status == Deployment.Status.READY, row.status_message
    assert row.upstream_url == f"http://pool-gpu.{NS}.svc.cluster.local:8000"
    assert PoolLoad.objects.get(deployment=deployment).state == PoolLoad.State.LOADED
    triton = kube.applied("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert triton["resources"]["limits"]["nvidia.com/gpumem"] == "8192"
    assert "--model-load-gpu-limit=0:0.90" in triton["args"]


@pytest.mark.kube
def test_a_pooled_onnx_model_is_rendered_as_its_own_processes_model_which_cannot_fold_constants_at_load(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, cfg: KubernetesConfig,
        gpu_pool: Pool) -> None:
    """A pool's ONNX model runs in stub processes of its own, never in Triton's (docs/security.md): the repository
    uploaded for the pool's Triton serves it through the generated python model (the local runtime's), whose
    sessions never fold constants (a ~300-byte graph, ConstantOfShape [6000, 6000] -> MatMul, folded at load held
    the pool's agent for tens of seconds), and which refuses answers over POOL_MAX_OUTPUT_BYTES in its own
    process."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from deployments.runtimes.kubernetes import s3repo

    deployment = deploy(alice)
    reconcile.reconcile(deployment.pk)
    reconcile.reconcile(deployment.pk)
    s3 = s3repo.client(cfg)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=cfg.s3_bucket).get("Contents", [])
            if f"d{deployment.pk}-r1-digits/" in o["Key"]]
    [config_key] = [key for key in keys if key.endswith("/config.pbtxt")]
    text = s3.get_object(Bucket=cfg.s3_bucket, Key=config_key)["Body"].read().decode()
    config = text_format.Parse(text, mc.ModelConfig())
    assert config.backend == "python" and not config.platform
    assert {key.rsplit("/", 1)[-1] for key in keys if "/1/" in key} >= {"model.py", "triton_batching.py",
                                                                         "model.onnx"}
    model_py = next(key for key in keys if key.endswith("/1/model.py"))
    source = s3.get_object(Bucket=cfg.s3_bucket, Key=model_py)["Body"].read().decode()
    assert 'disabled_optimizers=["ConstantFolding"]' in source


@pytest.mark.kube
def test_a_rollout_loads_the_new_revision_beside_the_old_then_unloads_it(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool) -> None:
    deployment = tick(deploy(alice), kube)
    old = f"d{deployment.pk}-r1.json"
    response = alice.client().patch("/api/v1/deployments/digits/", {"models": [{"model": "digits",
                                                                                "max_batch_size": 4}]}, format="json")
    assert response.status_code == 200, response.json()
    reconcile.reconcile(deployment.pk)
    reconcile.reconcile(deployment.pk)
    assert set(loads(kube)) == {old, f"d{deployment.pk}-r2.json"}  # beside the old, which still serves
    row = Deployment.objects.select_related("serving_revision").get(pk=deployment.pk)
    assert row.serving_revision is not None and row.serving_revision.number == 1
    row = tick(deployment, kube)
    assert row.serving_revision is not None and row.serving_revision.number == 2
    assert set(loads(kube)) == {f"d{deployment.pk}-r2.json"}
    assert list(PoolLoad.objects.filter(deployment=deployment).values_list("revision__number", flat=True)) == [2]


@pytest.mark.kube
def test_a_revision_the_agent_refuses_fails_its_deployment_only(
        alice: Person, bob: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool) -> None:
    first = tick(deploy(alice, "digits"), kube)
    second = deploy(alice, "digits-b")
    key = f"d{second.pk}-r1"
    row = tick(second, kube, failed={key: f"{key}-digits/1/model.onnx does not match what Modelport recorded"})
    assert row.status == Deployment.Status.FAILED
    assert "does not match what Modelport recorded" in row.status_message
    assert key not in row.status_message  # the pool's names are not shown, the model's are
    assert Deployment.objects.get(pk=first.pk).status == Deployment.Status.READY
    assert f"d{first.pk}-r1.json" in loads(kube)


@pytest.mark.kube
def test_an_agents_refusal_of_an_earlier_entry_of_the_same_key_does_not_fail_the_current_one(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool) -> None:
    """A quick retry removes the entry and adds it again; until the kubelet syncs the Secret, the agents' last line
    still lists the old refusal, with the old entry's sha256: it is not this entry's."""
    deployment = deploy(alice)
    key = f"d{deployment.pk}-r1"
    why = {key: f"{key}-digits/1/model.onnx does not match what Modelport recorded"}
    row = tick(deployment, kube, failed=why, refused={key: "0" * 64})
    assert row.status != Deployment.Status.FAILED, row.status_message
    assert PoolLoad.objects.get(deployment=deployment).state == PoolLoad.State.LOADING
    row = tick(deployment, kube, failed=why)  # the agents refused the current entry
    assert row.status == Deployment.Status.FAILED


@pytest.mark.kube
def test_stop_and_delete_remove_only_the_deployments_own_entries(
        alice: Person, charlie: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None,
        gpu_pool: Pool) -> None:
    from tests.support.versions import make_ready_version

    make_ready_version(charlie)
    theirs = tick(deploy(charlie), kube)
    mine = tick(deploy(alice), kube)
    assert set(loads(kube)) == {f"d{theirs.pk}-r1.json", f"d{mine.pk}-r1.json"}
    assert alice.client().post("/api/v1/deployments/digits/stop").status_code == 202
    assert tick(mine, kube).status == Deployment.Status.STOPPED
    assert set(loads(kube)) == {f"d{theirs.pk}-r1.json"}
    assert not PoolLoad.objects.filter(deployment=mine).exists()
    other = tick(deploy(alice, "digits-b"), kube)
    assert f"d{other.pk}-r1.json" in loads(kube)
    assert alice.client().delete("/api/v1/deployments/digits-b/").status_code == 202
    reconcile.reconcile(other.pk)
    assert not Deployment.objects.filter(pk=other.pk).exists()
    assert set(loads(kube)) == {f"d{theirs.pk}-r1.json"}
    assert kube.get(f"/apis/apps/v1/namespaces/{NS}/deployments/pool-gpu") is not None  # the pool stays
    assert Deployment.objects.get(pk=theirs.pk).status == Deployment.Status.READY


@pytest.mark.kube
def test_an_object_of_someone_else_named_like_the_pools_is_never_touched(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool) -> None:
    """Another team's (or application's) Secret in the pool's namespace, named as the pool's loads Secret: nothing
    of the pool is applied, and that Secret keeps what it held."""
    theirs = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": "pool-gpu-loads", "namespace": NS,
                           "labels": {"modelport.io/team": "globex", "app.kubernetes.io/managed-by": "helm"}},
              "data": {"password": base64.b64encode(b"hunter2").decode()}}
    kube.put(LOADS, theirs)
    deployment = deploy(alice)
    row = tick(deployment, kube, ticks=3)
    assert row.status != Deployment.Status.READY
    assert "is not pool 'gpu''s" in row.status_message and "never takes over" in row.status_message
    assert kube.get(LOADS)["data"] == theirs["data"]
    assert kube.get(f"/apis/apps/v1/namespaces/{NS}/deployments/pool-gpu") is None
    assert not [r for r in kube.sent("apply") + kube.sent("update") if "pool-gpu-loads" in r.path]


@pytest.mark.kube
def test_a_teams_own_pool_runs_in_the_teams_namespace_and_takes_no_gpu_request_from_the_deployment(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None) -> None:
    Pool.objects.create(name="gpu", runtime=Pool.Runtime.KUBERNETES, memory_budget_bytes=2**30, team=alice.team)
    deployment = deploy(alice)
    reconcile.reconcile(deployment.pk)
    reconcile.reconcile(deployment.pk)
    assert kube.get("/apis/apps/v1/namespaces/modelport-acme/deployments/pool-gpu") is not None
    response = alice.client().post("/api/v1/deployments/", {
        "name": "digits-gpu", "runtime": "kubernetes", "models": [{"model": "digits"}], "resources": {"gpu": 1},
        "placement": {"mode": "shared", "pool": "gpu"}}, format="json")
    assert response.status_code == 400
    assert "uses the GPUs of pool 'gpu'" in json.dumps(response.json())


@pytest.mark.kube
def test_a_team_named_pools_gets_nothing_in_the_open_pools_namespace(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool) -> None:
    """modelport- + pools is the default KUBERNETES_POOL_NAMESPACE: the team's rollout is refused, saying why."""
    from accounts.models import Team

    Team.objects.filter(pk=alice.team.pk).update(name="pools")
    response = alice.client().post("/api/v1/deployments/", {
        "name": "digits", "runtime": "kubernetes", "models": [{"model": "digits"}]}, format="json")
    assert response.status_code == 201, response.json()
    deployment = Deployment.objects.get(name="digits", team=alice.team)
    row = tick(deployment, kube, ticks=3)
    assert row.status != Deployment.Status.READY
    assert "KUBERNETES_POOL_NAMESPACE" in row.status_message, row.status_message
    assert not [r for r in kube.sent("apply") if f"/namespaces/{NS}/" in r.path]


def test_the_pools_list_shows_the_share_class_and_its_isolation(alice: Person, gpu_pool: Pool) -> None:
    response = alice.client().get("/api/v1/pools/")
    assert response.status_code == 200
    row = next(p for p in response.json() if p["name"] == "gpu")
    assert row["runtime"] == "kubernetes"
    assert row["gpu"]["share"] == "hami"
    assert row["gpu"]["resources"] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192",
                                       "nvidia.com/gpucores": "50"}
    assert "capped in software" in row["gpu"]["isolation"] and "no hardware or fault isolation" in \
        row["gpu"]["isolation"]
    shared = next(p for p in response.json() if p["name"] == "shared")
    assert shared["gpu"] == {"share": "none", "count": 0, "resources": {}, "isolation": "CPU only: no GPU"}


@pytest.mark.kube
def test_the_health_check_renews_an_entrys_urls_at_half_life(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool, settings: Any,
        url_clock: Any) -> None:
    from deployments.runtimes.kubernetes.pool_runtime import KubernetesPoolRuntime
    from deployments.runtimes.kubernetes.runtime import KubernetesRuntime

    deployment = tick(deploy(alice), kube)
    key = f"d{deployment.pk}-r1.json"
    first = loads(kube)[key]
    runtime = KubernetesPoolRuntime(KubernetesRuntime(now=url_clock))
    launch = deployment.serving_launch
    assert launch is not None
    assert runtime.check(deployment, launch).ok
    assert loads(kube)[key] == first  # young URLs are left alone
    url_clock.time += timedelta(seconds=settings.KUBERNETES_REPOSITORY_URL_SECONDS * 0.6)
    assert runtime.check(deployment, launch).ok
    renewed = loads(kube)[key]
    assert renewed["expires_at"] > first["expires_at"]
    assert [f["sha256"] for f in renewed["files"]] == [f["sha256"] for f in first["files"]]
    assert renewed["files"][0]["url"] != first["files"][0]["url"]


@pytest.mark.kube
def test_one_team_cannot_fill_a_cluster_pool_its_share_is_counted_before_the_agents_are_asked(
        alice: Person, charlie: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None,
        settings: Any) -> None:
    """Loads on a cluster are not measured: each counts at its models' size times POOL_UNMEASURED_FACTOR against
    the team's share (POOL_TEAM_SHARE) and the budget, so that one team's many deployments cannot get the pods
    OOM-killed with every other team's models in them."""
    from tests.support.versions import make_ready_version

    settings.POOL_UNMEASURED_FACTOR = 2.0
    need = 2 * digits.size
    Pool.objects.create(name="gpu", runtime=Pool.Runtime.KUBERNETES, memory_budget_bytes=4 * need - 1,
                        idle_unload_seconds=0)
    first = tick(deploy(alice, "digits"), kube)
    assert first.status == Deployment.Status.READY
    second = tick(deploy(alice, "digits-b"), kube)
    assert second.status == Deployment.Status.FAILED
    assert "your team's share of it" in second.status_message and "POOL_TEAM_SHARE" in second.status_message
    assert f"d{second.pk}-r1.json" not in loads(kube)  # the agents were never asked
    make_ready_version(charlie)
    assert tick(deploy(charlie), kube).status == Deployment.Status.READY  # the other team's half is still free


def settle_until(deployment: Deployment, kube: FakeKube, done: Any, ticks: int = 20) -> Deployment:
    for _ in range(ticks):
        reconcile.reconcile(deployment.pk)
        agents_report(kube)
        row = Deployment.objects.select_related("serving_revision", "canary_revision").get(pk=deployment.pk)
        if done(row):
            return row
    raise AssertionError(f"not done: {row.status_message}")


@pytest.mark.kube
def test_a_canary_in_a_cluster_pool_loads_beside_the_serving_revision_and_goes_with_rollback_or_promote(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool) -> None:
    from deployments import actions

    deployment = tick(deploy(alice), kube)
    pk = deployment.pk

    def canary(batch: int) -> None:
        response = alice.client().patch("/api/v1/deployments/digits/", {
            "models": [{"model": "digits", "max_batch_size": batch}],
            "rollout": {"strategy": "canary", "percent": 10}}, format="json")
        assert response.status_code == 200, response.json()

    canary(4)
    row = settle_until(deployment, kube, lambda d: bool(d.canary_upstream_url))
    assert row.canary_upstream_url == row.upstream_url == f"http://pool-gpu.{NS}.svc.cluster.local:8000"
    assert set(loads(kube)) == {f"d{pk}-r1.json", f"d{pk}-r2.json"}  # the gateway splits by revision prefix
    actions.rollback_canary(row, alice.user)
    row = settle_until(deployment, kube, lambda d: d.drain_until is None and d.canary_revision_id is None)
    assert set(loads(kube)) == {f"d{pk}-r1.json"}
    canary(2)
    row = settle_until(deployment, kube, lambda d: bool(d.canary_upstream_url))
    actions.promote_canary(row, alice.user)
    row = settle_until(deployment, kube, lambda d: d.drain_until is None and d.serving_revision.number == 3)
    assert set(loads(kube)) == {f"d{pk}-r3.json"}
    assert list(PoolLoad.objects.filter(deployment=deployment).values_list("revision__number", flat=True)) == [3]


@pytest.mark.kube
def test_a_shared_deployment_has_no_manifests_of_its_own_to_export(
        alice: Person, digits: ModelVersion, kube_runtime: None, gpu_pool: Pool) -> None:
    deploy(alice)
    response = alice.client().get("/api/v1/deployments/digits/manifests")
    assert response.status_code == 409
    assert "loaded in pool 'gpu'" in json.dumps(response.json())


@pytest.mark.kube
def test_the_gateways_cold_start_never_starts_a_local_triton_for_a_cluster_pool(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool) -> None:
    """A request to a cluster pool's revision not loaded yet is answered 503 with Retry-After (gateway/cold_start.py
    takes PoolBusy so): the local pool's loader refuses a pool that is not its own."""
    from deployments.runtimes.local import pool as local_pool

    deployment = deploy(alice)
    reconcile.reconcile(deployment.pk)
    reconcile.reconcile(deployment.pk)
    load = PoolLoad.objects.get(deployment=deployment)
    with pytest.raises(local_pool.PoolBusy, match="loads this deployment's models on its cluster"):
        local_pool.load_revision(load.pk, wait=False)
    assert not local_pool.pool_dir(gpu_pool).exists()


# --- On demand ----------------------------------------------------------------------------------------------------


def idle_deployment(alice: Person, kube: FakeKube, seconds: int = 60) -> tuple[Deployment, PoolLoad]:
    response = alice.client().post("/api/v1/deployments/", {
        "name": "digits", "runtime": "kubernetes", "models": [{"model": "digits"}],
        "placement": {"mode": "shared", "pool": "gpu", "idle_unload_seconds": seconds}}, format="json")
    assert response.status_code == 201, response.json()
    deployment = tick(Deployment.objects.get(team=alice.team, name="digits"), kube)
    assert deployment.status == Deployment.Status.READY, deployment.status_message
    load = PoolLoad.objects.get(deployment=deployment)
    assert load.state == PoolLoad.State.LOADED and load.idle_unload_seconds == seconds
    return deployment, load


def _ms(moment: Any) -> int:
    return int(moment.timestamp() * 1000)


@pytest.mark.kube
def test_a_cluster_revision_unused_for_its_idle_time_is_marked_unloaded_for_the_agents(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool) -> None:
    from django.utils import timezone

    from deployments.runtimes.kubernetes.runtime import KubernetesRuntime
    from deployments.runtimes.registry import runtime_for

    deployment, load = idle_deployment(alice, kube)
    key = f"d{deployment.pk}-r1"
    runtime = KubernetesRuntime()
    PoolLoad.objects.filter(pk=load.pk).update(last_used_at=timezone.now() - timedelta(seconds=30))
    recent = timezone.now() - timedelta(seconds=5)
    agents_report(kube, last_used={key: _ms(recent)})
    assert pool_runtime.unload_idle(runtime) == []  # used 5 s ago: kept
    load.refresh_from_db()
    assert load.state == PoolLoad.State.LOADED and load.last_used_at is not None
    assert abs((load.last_used_at - recent).total_seconds()) < 0.01
    PoolLoad.objects.filter(pk=load.pk).update(last_used_at=timezone.now() - timedelta(seconds=61))
    # An agent's "last used" far in the future (or not a number) is not believed: it cannot pin a revision.
    agents_report(kube, last_used={key: _ms(timezone.now() + timedelta(days=3650))})
    assert pool_runtime.unload_idle(runtime) == [f"unloaded {deployment} r1 from pool 'gpu'"]
    load.refresh_from_db()
    assert load.state == PoolLoad.State.UNLOADED and "60 s unused" in load.message
    [told] = deployment.events.filter(reason="pool.idle_unloaded")
    unused = re.fullmatch(r"Unloaded from pool 'gpu': unused for (\d+) s \(it unloads after 60 s unused\)\. The "
                          r"next request loads it again\.", told.message)
    assert unused is not None and int(unused[1]) >= 61, told.message
    entry = loads(kube)[f"{key}.json"]
    assert entry["unloaded"] is True and entry["models"] == [f"{key}-digits"]
    agents_report(kube)
    # Idle is healthy (the next request loads it), and a renewal of its URLs keeps the mark.
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.serving_launch is not None and runtime_for(row).check(row, row.serving_launch).ok
    assert loads(kube)[f"{key}.json"]["unloaded"] is True


@pytest.mark.kube
def test_a_request_wakes_an_idle_cluster_revision_and_its_cold_start_is_recorded(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool) -> None:
    from django.utils import timezone

    from deployments.runtimes.kubernetes.runtime import KubernetesRuntime

    deployment, load = idle_deployment(alice, kube)
    key = f"d{deployment.pk}-r1"
    runtime = KubernetesRuntime()
    PoolLoad.objects.filter(pk=load.pk).update(last_used_at=timezone.now() - timedelta(seconds=120))
    pool_runtime.unload_idle(runtime)
    agents_report(kube)
    assert pool_runtime.wait_loaded(load.pk, 0) == (False, "")
    assert pool_runtime.wake(load.pk) == ""  # the gateway changes the row only
    load.refresh_from_db()
    assert load.state == PoolLoad.State.LOADING and load.woken_at is not None
    assert loads(kube)[f"{key}.json"]["unloaded"] is True
    pool_runtime.unload_idle(runtime)  # the worker's pass writes the entry without the mark
    assert "unloaded" not in loads(kube)[f"{key}.json"]
    assert PoolLoad.objects.get(pk=load.pk).state == PoolLoad.State.LOADING  # the agents have not said yet
    agents_report(kube)
    assert pool_runtime.unload_idle(runtime) == [f"loaded {deployment} r1 in pool 'gpu' again"]
    load.refresh_from_db()
    assert load.state == PoolLoad.State.LOADED and load.woken_at is None
    assert load.cold_start_seconds is not None and load.cold_start_seconds >= 0
    # Both are the deployment's events, the load's time as measured from the wake.
    [unloaded] = deployment.events.filter(reason="pool.idle_unloaded")
    assert re.search(r"unused for 1[2-9][0-9] s", unloaded.message), unloaded.message
    [woken] = deployment.events.filter(reason="pool.loaded_on_demand")
    assert woken.message == f"Loaded again in pool 'gpu' by a request, in {load.cold_start_seconds:.1f} s (the " \
                            "request waited for it)."
    assert pool_runtime.wait_loaded(load.pk, 0) == (True, "")


@pytest.mark.kube
def test_a_woken_revision_the_agent_refuses_fails_and_the_held_request_hears_why(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool,
        settings: Any) -> None:
    from django.utils import timezone

    from deployments.runtimes.base import Wake
    from deployments.runtimes.kubernetes.runtime import KubernetesRuntime
    from deployments.runtimes.registry import runtime_for

    deployment, load = idle_deployment(alice, kube)
    key = f"d{deployment.pk}-r1"
    runtime = KubernetesRuntime()
    PoolLoad.objects.filter(pk=load.pk).update(last_used_at=timezone.now() - timedelta(seconds=120))
    pool_runtime.unload_idle(runtime)
    agents_report(kube)
    settings.POOL_COLD_START_WAIT_SECONDS = 0
    # Past the wait the held request hears that it is still loading; the load goes on for the retry.
    # (the gateway's cold start wakes it through the interface, gateway/cold_start.py, and says so)
    assert runtime_for(deployment).wake(load.pk, 0) == Wake(loading=True)
    pool_runtime.unload_idle(runtime)
    agents_report(kube, failed={key: f"model '{key}-digits' failed to load: out of memory"})
    pool_runtime.unload_idle(runtime)
    load.refresh_from_db()
    assert load.state == PoolLoad.State.FAILED and "out of memory" in load.message and key not in load.message
    assert runtime_for(deployment).wake(load.pk, 0) == Wake(failure=load.message)


@pytest.mark.kube
def test_a_wake_past_the_teams_share_is_refused_without_asking_the_agents(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool) -> None:
    from django.utils import timezone

    from deployments.runtimes.kubernetes.runtime import KubernetesRuntime

    deployment, load = idle_deployment(alice, kube)
    PoolLoad.objects.filter(pk=load.pk).update(last_used_at=timezone.now() - timedelta(seconds=120))
    pool_runtime.unload_idle(KubernetesRuntime())
    Pool.objects.filter(pk=gpu_pool.pk).update(memory_budget_bytes=1)
    refusal = pool_runtime.wake(load.pk)
    assert "cannot take this revision" in refusal
    assert PoolLoad.objects.get(pk=load.pk).state == PoolLoad.State.UNLOADED
    assert loads(kube)[f"d{deployment.pk}-r1.json"]["unloaded"] is True


@pytest.mark.kube
def test_a_wake_that_could_never_fit_evicts_none_of_the_teams_idle_revisions(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool) -> None:
    """The rule of a local pool (deployments/pool_policy.py, both runtimes'): a revision that needs more than its
    team's share or the pool's budget is refused before anything is evicted. The cluster pool's own rule used to
    unload the team's idle revisions one by one first, and then refuse it all the same."""
    from django.utils import timezone

    deployment, load = idle_deployment(alice, kube)
    other = tick(deploy(alice, "other"), kube)
    assert other.status == Deployment.Status.READY, other.status_message
    idle = PoolLoad.objects.get(deployment=other)
    PoolLoad.objects.filter(pk=load.pk).update(state=PoolLoad.State.UNLOADED)
    PoolLoad.objects.filter(pk=idle.pk).update(last_used_at=timezone.now() - timedelta(seconds=600),
                                               loaded_at=timezone.now() - timedelta(seconds=3600))
    Pool.objects.filter(pk=gpu_pool.pk).update(memory_budget_bytes=idle.memory_bytes - 1)
    refusal = pool_runtime.wake(load.pk)
    assert "cannot take this revision" in refusal
    assert PoolLoad.objects.get(pk=idle.pk).state == PoolLoad.State.LOADED
    assert not other.events.filter(reason="pool.evicted").exists()


# --- Measured memory ----------------------------------------------------------------------------------------------


@pytest.mark.kube
def test_what_the_agents_measured_is_kept_for_the_pool_and_fits_n_more_comes_from_it(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool) -> None:
    from deployments import pools
    from deployments.models import ModelMemory

    deployment = deploy(alice)
    key = f"d{deployment.pk}-r1"
    reconcile.reconcile(deployment.pk)
    reconcile.reconcile(deployment.pk)
    row = tick(deployment, kube, ticks=1)
    agents_report(kube, memory={key: {"digits": 300 * 2**20}})
    row = tick(deployment, kube)
    assert row.status == Deployment.Status.READY, row.status_message
    memory = ModelMemory.objects.get(version=digits)
    assert memory.memory_bytes == 300 * 2**20 and memory.fingerprint == pools.fingerprint(gpu_pool)
    assert memory.fingerprint != pools.fingerprint()  # the local pools' figures are this machine's
    assert PoolLoad.objects.get(deployment=deployment).memory_bytes == 300 * 2**20
    response = alice.client().get("/api/v1/pools/?model=digits&version=1")
    found = {p["name"]: p for p in response.json()}
    # 8 GiB budget, half of it the team's share (4096 MiB), 300 MiB of it used: 12 more copies of 300 MiB.
    assert found["gpu"]["fit"]["memory_bytes"] == 300 * 2**20 and found["gpu"]["fit"]["copies"] == 12
    assert found["gpu"]["memory_used_bytes"] == 300 * 2**20
    assert found["shared"]["fit"]["memory_bytes"] is None  # never measured in the local pool


@pytest.mark.kube
@pytest.mark.parametrize("figures", [
    {"digits": 9 * 2**30},  # past the pool's budget
    {"digits": True}, {"digits": -1}, {"digits": 0}, {"digits": "300"}, {"other-model": 1000},
])
def test_an_agents_odd_memory_figure_is_not_believed(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, gpu_pool: Pool,
        figures: dict[str, Any]) -> None:
    from deployments.models import ModelMemory

    deployment = deploy(alice)
    key = f"d{deployment.pk}-r1"
    for _ in range(6):
        reconcile.reconcile(deployment.pk)
        agents_report(kube, memory={key: figures, f"d{deployment.pk + 1}-r1": {"digits": 1000}})
    assert Deployment.objects.get(pk=deployment.pk).status == Deployment.Status.READY
    assert not ModelMemory.objects.exists()
    assert PoolLoad.objects.get(deployment=deployment).memory_bytes == 2 * digits.size  # still the estimate


@pytest.mark.kube
def test_a_load_past_the_budget_evicts_the_least_recently_used_idle_revision_first(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None, settings: Any) -> None:
    from django.utils import timezone

    settings.POOL_UNMEASURED_FACTOR = 2.0
    settings.POOL_TEAM_SHARE = 1.0
    need = 2 * digits.size
    Pool.objects.create(name="gpu", runtime=Pool.Runtime.KUBERNETES, memory_budget_bytes=2 * need,
                        idle_unload_seconds=0)
    old = tick(deploy(alice, "old"), kube)
    recent = tick(deploy(alice, "recent"), kube)
    assert old.status == recent.status == Deployment.Status.READY
    now = timezone.now()
    PoolLoad.objects.filter(deployment=old).update(last_used_at=now - timedelta(seconds=600))
    PoolLoad.objects.filter(deployment=recent).update(last_used_at=now - timedelta(seconds=300))
    third = tick(deploy(alice, "third"), kube)
    assert third.status == Deployment.Status.READY, third.status_message
    evicted = PoolLoad.objects.get(deployment=old)
    assert evicted.state == PoolLoad.State.UNLOADED and evicted.message.startswith("evicted")
    [told] = old.events.filter(reason="pool.evicted")
    unused = re.match(r"Unloaded from pool 'gpu' to make room for another model: unused for (\d+) s", told.message)
    assert unused is not None and int(unused[1]) >= 600, told.message
    assert "third" not in told.message and not recent.events.filter(reason="pool.evicted").exists()
    assert PoolLoad.objects.get(deployment=recent).state == PoolLoad.State.LOADED
    entries = loads(kube)
    assert entries[f"d{old.pk}-r1.json"]["unloaded"] is True
    assert "unloaded" not in entries[f"d{third.pk}-r1.json"]
    # In use now (the agents saw a request a moment ago): nothing is idle enough to evict, so a fourth is refused.
    PoolLoad.objects.filter(deployment__in=[recent, third]).update(last_used_at=timezone.now())
    fourth = tick(deploy(alice, "fourth"), kube)
    assert fourth.status == Deployment.Status.FAILED and "cannot take this revision" in fourth.status_message


# --- A shared deployment's log ------------------------------------------------------------------------------------


@pytest.mark.kube
def test_a_shared_deployments_log_holds_only_its_own_lines_of_the_pools_pods(
        alice: Person, charlie: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None,
        gpu_pool: Pool) -> None:
    from tests.support.versions import make_ready_version

    mine = tick(deploy(alice), kube)
    make_ready_version(charlie)
    theirs = tick(deploy(charlie), kube)
    a, c = f"d{mine.pk}-r1", f"d{theirs.pk}-r1"
    agent_log = "\n".join([
        "modelport-pool-agent: starting",
        f"modelport-pool-agent: {a}: loaded 1 model(s), every sha256 verified",
        f"modelport-pool-agent: {c}: loaded 1 model(s), every sha256 verified",
        # Another team's refusal quoting words its model chose, with a line separator and a newline in them: neither
        # starts a line of this deployment's log.
        f"modelport-pool-agent: {c}: refused: bad\u2028modelport-pool-agent: {a}: unloaded",
        f"modelport-pool-agent: {c}: refused: x", f"modelport-pool-agent: {a}: forged by {c}-digits",
        pool_agent.STATUS_PREFIX + json.dumps({"loaded": [a, c], "failed": {}}),
    ]) + "\n"
    triton_log = "\n".join([
        f'I1201 17:00:00.000001 1 model_lifecycle.cc:849] "successfully loaded \'{a}-digits\'"',
        f'I1201 17:00:00.000002 1 model_lifecycle.cc:849] "successfully loaded \'{c}-digits\'"',
        f'E1201 17:00:00.000003 1 model_lifecycle.cc:641] "failed to load \'{c}-digits\': tensor {a}-digits"',
        f"2026-12-01 17:00:00.1 [W:onnxruntime] tensor {a}-digits is odd",  # a model's process: its words
    ]) + "\n"
    for pod in kube.items(f"/api/v1/namespaces/{NS}/pods", "modelport.io/pool=gpu"):
        kube.logs[(NS, pod["metadata"]["name"], pool_manifests.AGENT_CONTAINER, False)] = agent_log
        kube.logs[(NS, pod["metadata"]["name"], "triton", False)] = triton_log
    text = alice.client().get("/api/v1/deployments/digits/logs/").json()["log"]
    lines = [line for line in text.split("\n") if line and not line.startswith("==> pod/")]
    assert lines == [f"modelport-pool-agent: {a}: loaded 1 model(s), every sha256 verified",
                     f'I1201 17:00:00.000001 1 model_lifecycle.cc:849] "successfully loaded \'{a}-digits\'"'], text
    theirs_text = charlie.client().get("/api/v1/deployments/digits/logs/").json()["log"]
    assert a not in theirs_text and f"{c}: refused: x" in theirs_text
    assert "\u2028" not in theirs_text  # escaped: the line reads as one line
