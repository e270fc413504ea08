"""Tenant isolation on the Kubernetes runtime (issue 11): Modelport never applies over an object it did not create,
Triton's pods get their repository through presigned URLs that the worker renews before they expire, and the
namespaced Role of platform/kubernetes is all the runtime needs.

These tests use a fake API server (fake_kube.py) because no Kubernetes API server can run on this machine (no
Docker, kind or k3s). The fake plays the API server, the authorizer (with the RBAC rules of platform/kubernetes)
and, where a test says so, the kubelet that mounts a Secret into a starting pod. S3 is moto's in-process mock;
test_k8s_s3.py downloads through the presigned URLs from moto's S3 server with the real init container script.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from accounts.models import TeamQuota
from deployments import reconcile, tasks
from deployments.models import Deployment, Pool, Revision
from deployments.runtimes.base import Launch, RuntimeUnavailable
from deployments.runtimes.kubernetes import manifests
from deployments.runtimes.kubernetes.config import KubernetesConfig
from deployments.runtimes.kubernetes.pool_runtime import KubernetesPoolRuntime
from deployments.runtimes.kubernetes.runtime import KubernetesRuntime
from deployments.runtimes.placed import Placed
from deployments.tests import fake_kube
from deployments.tests.fake_kube import FakeKube
from models_registry.models import ModelVersion
from tests.support.clocks import UrlClock
from tests.support.people import Person
from tests.support.versions import make_ready_version

pytestmark = pytest.mark.kube  # every test here talks to the fake Kubernetes API server

NS = "modelport-acme"
DEPLOYMENT_PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/digits"
PODS = f"/api/v1/namespaces/{NS}/pods"
PLATFORM = Path(__file__).resolve().parents[2] / "platform" / "kubernetes"
DAY = timedelta(hours=24)


def create(person: Person, name: str = "digits", **body: Any) -> Deployment:
    payload = {"name": name, "runtime": "kubernetes", "models": [{"model": "digits"}], **body}
    response = person.client().post("/api/v1/deployments/", payload, format="json")
    assert response.status_code == 201, response.json()
    return Deployment.objects.select_related("team", "revision").get(team=person.team, name=name)


def secret_path(revision: int, name: str = "digits", namespace: str = NS) -> str:
    return f"/api/v1/namespaces/{namespace}/secrets/{name}-r{revision}-repository"


def serve(runtime: KubernetesRuntime, deployment: Deployment, revision: Revision | None = None) -> Launch:
    """Roll `revision` (default: the current one) out and record it as serving, as the reconciler does."""
    revision = revision or deployment.revision
    assert revision is not None
    launch = runtime.launch(revision)
    assert runtime.observe(launch).state == "ready"
    deployment.set_status(Deployment.Status.READY, "Serving", serving_revision=revision, upstream_url=launch.url)
    return launch


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def url_window(url: str) -> tuple[datetime, datetime]:
    """When a presigned URL starts and stops being valid (what S3 checks)."""
    query = parse_qs(urlsplit(url).query)
    start = datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    return start, start + timedelta(seconds=int(query["X-Amz-Expires"][0]))


def the_pod(kube: FakeKube) -> dict[str, Any]:
    [pod] = kube.items(PODS)
    return pod


# --- Ownership -----------------------------------------------------------------------------------------------

FOREIGN = {
    "Deployment": (DEPLOYMENT_PATH, {"apiVersion": "apps/v1", "spec": {"replicas": 1}}),
    "Secret": (secret_path(1), {"apiVersion": "v1", "data": {"password": "aHVudGVyMg=="}}),
    "Service": (f"/api/v1/namespaces/{NS}/services/digits", {"apiVersion": "v1", "spec": {"type": "ClusterIP"}}),
    "PodDisruptionBudget": (f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/digits",
                            {"apiVersion": "policy/v1", "spec": {"maxUnavailable": 1}}),
    "HorizontalPodAutoscaler": (f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/digits",
                                {"apiVersion": "autoscaling/v2", "spec": {"maxReplicas": 3}}),
    "NetworkPolicy": (f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/digits",
                      {"apiVersion": "networking.k8s.io/v1", "spec": {"podSelector": {}}}),
}


@pytest.mark.parametrize("kind", FOREIGN)
def test_it_never_applies_over_an_object_it_did_not_create(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                           cfg: KubernetesConfig, kind: str) -> None:
    deployment = create(alice, autoscaling={"min_replicas": 2, "max_replicas": 4, "metric": "cpu", "target": 70})
    path, body = FOREIGN[kind]
    name = path.rsplit("/", 1)[-1]
    theirs = {**copy.deepcopy(body), "kind": kind,
              "metadata": {"name": name, "namespace": NS, "labels": {"app.kubernetes.io/name": "billing"}}}
    kube.put(path, copy.deepcopy(theirs))
    kube.requests.clear()
    with pytest.raises(RuntimeUnavailable) as caught:
        KubernetesRuntime(cfg).launch(deployment.revision)  # type: ignore[arg-type]
    assert str(caught.value) == (
        f"A {kind} named {name} exists in namespace {NS} and is not this deployment's (team none, deployment none, "
        "managed by someone else): Modelport never takes over an object it did not create, so nothing was applied. "
        "Delete or rename that object, choose another deployment name, or map the team to a namespace of its own "
        "(KUBERNETES_NAMESPACES).")
    assert {r.verb for r in kube.requests} == {"get"}  # nothing applied, scaled, replaced or deleted
    stored = kube.get(path)
    assert stored is not None and stored["metadata"]["labels"] == {"app.kubernetes.io/name": "billing"}
    assert kube.get(f"/api/v1/namespaces/{NS}") is None  # not even the namespace was created


def test_another_teams_deployment_in_a_shared_namespace_is_not_taken_over(
        alice: Person, charlie: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig) -> None:
    make_ready_version(charlie)
    kube.on_apply = fake_kube.rollout_succeeds
    shared = KubernetesConfig(**{**cfg.__dict__, "namespaces": (("acme", "ml"), ("globex", "ml"))})
    serve(KubernetesRuntime(shared), create(charlie))
    theirs = kube.get("/apis/apps/v1/namespaces/ml/deployments/digits")
    kube.requests.clear()
    with pytest.raises(RuntimeUnavailable, match=r"^A Deployment named digits exists in namespace ml and is not this "
                                                 r"deployment's \(team globex, deployment digits, managed by "
                                                 r"modelport\)"):
        KubernetesRuntime(shared).launch(create(alice).revision)  # type: ignore[arg-type]
    assert {r.verb for r in kube.requests} == {"get"}
    assert kube.get("/apis/apps/v1/namespaces/ml/deployments/digits") == theirs


# --- Presigned URLs ------------------------------------------------------------------------------------------


def test_the_urls_are_renewed_at_half_life_and_a_restarted_pod_gets_fresh_ones(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig, url_clock: UrlClock) -> None:
    deployment = create(alice)
    kube.on_apply = fake_kube.rollout_succeeds
    runtime = KubernetesRuntime(cfg, now=url_clock)
    t0 = url_clock.time
    serve(runtime, deployment)
    first = fake_kube.mounted_access(kube, the_pod(kube))
    assert first is not None and first["expires_at"] == iso(t0 + DAY)
    assert {url_window(f["url"]) for f in first["files"]} == {(t0, t0 + DAY)}
    generation = kube.get(DEPLOYMENT_PATH)["metadata"]["generation"]  # type: ignore[index]

    url_clock.time = t0 + timedelta(hours=11)  # more than half their life left: nothing to do
    kube.requests.clear()
    assert runtime.refresh_repository_access(deployment) == []
    assert [r.verb for r in kube.requests] == ["get"]  # the list of its access Secrets, nothing written

    url_clock.time = t0 + timedelta(hours=13)
    listed = kube.get(secret_path(1))
    assert listed is not None
    assert runtime.refresh_repository_access(deployment) == [1]
    [update] = kube.sent("update")
    assert update.path == secret_path(1)
    assert update.body["metadata"]["resourceVersion"] == listed["metadata"]["resourceVersion"]
    assert update.body["metadata"]["ownerReferences"] == listed["metadata"]["ownerReferences"]
    # The pod template did not change: renewing the URLs rolls nothing out.
    assert kube.get(DEPLOYMENT_PATH)["metadata"]["generation"] == generation  # type: ignore[index]

    # The first URLs have expired when the pod is replaced (a node drained, at t0 + 25 h): the kubelet mounts the
    # Secret as it is then, and the new pod's init container finds URLs valid until t0 + 37 h, for the same files.
    url_clock.time = t0 + timedelta(hours=25)
    fake_kube.rollout_succeeds(kube, kube.get(DEPLOYMENT_PATH))  # type: ignore[arg-type]
    mounted = fake_kube.mounted_access(kube, the_pod(kube))
    assert mounted is not None and mounted["expires_at"] == iso(t0 + timedelta(hours=37))
    for file in mounted["files"]:
        start, end = url_window(file["url"])
        assert (start, end) == (t0 + timedelta(hours=13), t0 + timedelta(hours=37)) and start <= url_clock.time < end
    assert [(f["path"], f["sha256"], f["size"]) for f in mounted["files"]] == \
        [(f["path"], f["sha256"], f["size"]) for f in first["files"]]


def test_renewing_never_recreates_a_secret_deleted_meanwhile_nor_overwrites_a_changed_one(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig, url_clock: UrlClock) -> None:
    deployment = create(alice)
    kube.on_apply = fake_kube.rollout_succeeds
    runtime = KubernetesRuntime(cfg, now=url_clock)
    serve(runtime, deployment)
    url_clock.time += timedelta(hours=20)

    def teardown_races(request: fake_kube.Request) -> None:  # the Secret goes between the list and the update
        if request.verb == "update":
            kube.remove(secret_path(1))

    kube.forbid = lambda request: teardown_races(request)
    assert runtime.refresh_repository_access(deployment) == []
    assert kube.get(secret_path(1)) is None

    kube.forbid = None
    serve(runtime, deployment)  # written again, with fresh URLs

    def someone_changes_it(request: fake_kube.Request) -> None:
        if request.verb == "update":
            secret = copy.deepcopy(kube.get(secret_path(1)))
            assert secret is not None
            kube.put(secret_path(1), secret)  # a new resourceVersion

    url_clock.time += timedelta(hours=20)
    kube.forbid = lambda request: someone_changes_it(request)
    assert runtime.refresh_repository_access(deployment) == []  # 409: the next pass tries again
    kube.forbid = None
    assert runtime.refresh_repository_access(deployment) == [1]


def test_the_periodic_task_renews_running_deployments_failed_ones_included(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig, settings: Any) -> None:
    settings.KUBERNETES_KUBECONFIG = cfg.kubeconfig
    settings.KUBERNETES_S3_BUCKET, settings.KUBERNETES_S3_ENDPOINT_URL = cfg.s3_bucket, ""
    settings.KUBERNETES_S3_ACCESS_KEY_ID, settings.KUBERNETES_S3_SECRET_ACCESS_KEY = "AKIAFAKE", "fake-secret"
    kube.on_apply = fake_kube.rollout_succeeds
    runtime = KubernetesRuntime(cfg)
    serving = create(alice)
    serve(runtime, serving)
    failed = create(alice, name="failed")
    serve(runtime, failed)
    failed.set_status(Deployment.Status.FAILED, "Revision 2 failed to start; revision 1 keeps serving.")
    stopped = create(alice, name="stopped")
    serve(runtime, stopped)
    Deployment.objects.filter(pk=stopped.pk).update(desired_state=Deployment.Desired.STOPPED)
    soon = iso(datetime.now(UTC) + timedelta(hours=1))  # an hour left of 24: past half-life
    for name in ("digits", "failed", "stopped"):
        kube.objects[secret_path(1, name)]["metadata"]["annotations"]["modelport.io/urls-expire-at"] = soon

    assert tasks.refresh_repository_access() == 2
    renewed = {r.path for r in kube.sent("update")}
    assert renewed == {secret_path(1, "digits"), secret_path(1, "failed")}
    for name in ("digits", "failed"):
        expires = kube.get(secret_path(1, name))["metadata"]["annotations"]["modelport.io/urls-expire-at"]  # type: ignore[index]
        assert expires > iso(datetime.now(UTC) + timedelta(hours=23))
    assert tasks.refresh_repository_access() == 0  # fresh now


def test_a_new_revision_retires_the_previous_revisions_access_secret(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig) -> None:
    deployment = create(alice)
    kube.on_apply = fake_kube.rollout_succeeds
    runtime = KubernetesRuntime(cfg)
    serve(runtime, deployment)
    assert alice.client().patch("/api/v1/deployments/digits/", {"replicas": 2}, format="json").status_code == 200
    second = Revision.objects.get(deployment=deployment, number=2)
    launch = serve(runtime, deployment, second)
    assert kube.get(secret_path(1)) is not None  # the old pods may still restart during the rollout
    runtime.retire(deployment, keep=[launch])
    assert kube.get(secret_path(1)) is None and kube.get(secret_path(2)) is not None


def test_a_repository_with_too_many_files_for_one_secret_is_refused_before_anything_is_applied(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig,
        monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = create(alice)
    monkeypatch.setattr("deployments.runtimes.kubernetes.runtime.MAX_SECRET_BYTES", 1000)
    with pytest.raises(RuntimeUnavailable, match=r"^The model repository of revision 1 has 2 files: their download "
                                                 r"URLs \(\d+ KiB\) do not fit in one Kubernetes Secret"):
        KubernetesRuntime(cfg).launch(deployment.revision)  # type: ignore[arg-type]
    assert not kube.sent("apply", "Secret") and not kube.sent("apply", "Deployment")


# --- Permissions ---------------------------------------------------------------------------------------------


def rules(directory: str, kind: str) -> list[dict[str, Any]]:
    docs = [d for f in sorted((PLATFORM / directory).glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    [role] = [d for d in docs if d["kind"] == kind]
    return role["rules"]  # type: ignore[no-any-return]


def granted(rule_list: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rule_list for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def whole_life(alice: Person, kube: FakeKube, runtime: KubernetesRuntime, url_clock: UrlClock) -> None:
    """Everything the runtime does to a deployment: roll out (looking at its pods), check, logs, renew URLs, a new
    revision that drops objects, a failed one rolled back, stop, start, delete; with a team quota (its namespace's
    ResourceQuota and LimitRange)."""
    TeamQuota.objects.create(team=alice.team, total_memory="64Gi", deployment_memory="8Gi")
    deployment = create(alice, autoscaling={"min_replicas": 2, "max_replicas": 4, "metric": "cpu", "target": 70})
    kube.on_apply = fake_kube.pod_stays(fake_kube.loading_status())
    loading = runtime.launch(deployment.revision)  # type: ignore[arg-type]
    assert runtime.observe(loading).state == "starting"
    fake_kube.rollout_succeeds(kube, kube.get(DEPLOYMENT_PATH))  # type: ignore[arg-type]
    kube.on_apply = fake_kube.rollout_succeeds
    first = serve(runtime, deployment)
    assert runtime.check(deployment, first).ok
    runtime.logs(deployment, 5)
    url_clock.time += timedelta(hours=13)
    assert runtime.refresh_repository_access(deployment) == [1]
    assert alice.client().patch("/api/v1/deployments/digits/", {"autoscaling": None, "replicas": 1},
                                format="json").status_code == 200
    second = serve(runtime, deployment, Revision.objects.get(deployment=deployment, number=2))
    runtime.retire(deployment, keep=[second])
    assert alice.client().patch("/api/v1/deployments/digits/", {"replicas": 1, "resources": {"memory": "1Gi"}},
                                format="json").status_code == 200
    kube.on_apply = fake_kube.pod_stays(fake_kube.fetch_failed_status(2))
    third = runtime.launch(Revision.objects.get(deployment=deployment, number=3))
    kube.logs[(NS, "digits-r3-0", True)] = "fetch-repository: error: digits/1/model.onnx does not match\n"
    seen = runtime.observe(third)
    assert seen.state == "failed" and "does not match" in seen.detail
    kube.on_apply = fake_kube.rollout_succeeds
    runtime.abandon(third)
    runtime.stop(deployment)
    serve(runtime, deployment, Revision.objects.get(pk=first.revision_id))
    runtime.teardown(deployment)
    # With KUBERNETES_AUTOSCALING=keda (KEDA installed): a ScaledObject applied, then removed with autoscaling.
    kube.custom_resources.add("scaledobjects.keda.sh")
    keda = KubernetesRuntime(replace(runtime.cfg, autoscaling="keda", keda_prometheus_url="http://prometheus:9090"),
                             now=runtime.now)
    scaled = create(alice, name="digits-keda",
                    autoscaling={"min_replicas": 1, "max_replicas": 3, "metric": "cpu", "target": 70})
    serve(keda, scaled)
    assert kube.get(f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects/digits-keda") is not None
    assert alice.client().patch("/api/v1/deployments/digits-keda/", {"autoscaling": None},
                                format="json").status_code == 200
    serve(keda, scaled, Revision.objects.get(deployment=scaled, number=2))
    assert kube.get(f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects/digits-keda") is None
    keda.teardown(scaled)
    # A shared deployment in the team's own pool on the cluster: the pool's objects, its loads Secret edited.
    Pool.objects.create(name="own", runtime=Pool.Runtime.KUBERNETES, memory_budget_bytes=2**30, team=alice.team,
                        min_replicas=2, max_replicas=3)
    shared = create(alice, name="digits-shared", placement={"mode": "shared", "pool": "own"})
    placed = Placed(runtime, KubernetesPoolRuntime(runtime))  # as the registry puts them: its pool launcher beside
    pooled = placed.launch(shared.revision)  # type: ignore[arg-type]
    assert placed.observe(pooled).state == "starting"  # no agent has said it loaded yet
    placed.check(shared, pooled)
    placed.teardown(shared)
    # The team's quota objects stay: they hold the team's other deployments too; and so does the team's pool.
    assert not [p for p in kube.objects if f"/namespaces/{NS}/" in p and "/pods/" not in p
                and not p.endswith(f"/{manifests.QUOTA_NAME}") and "/pool-own" not in p]


def test_the_namespaced_role_is_all_the_runtime_needs_and_nothing_more(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig, url_clock: UrlClock) -> None:
    """A deployment's whole life with only the Role that platform/kubernetes/team-namespace binds in the team's
    namespace: nothing is refused but reading the (cluster-scoped) namespace, and every rule is used."""
    role = rules("team-namespace", "Role")
    kube.put(f"/api/v1/namespaces/{NS}", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    kube.forbid = fake_kube.rbac(kube, role, namespaces={NS})
    namespaced = KubernetesConfig(**{**cfg.__dict__, "create_namespaces": False})
    whole_life(alice, kube, KubernetesRuntime(namespaced, now=url_clock), url_clock)
    assert kube.refused == {("", "namespaces", "get")}  # the operator prepared it; Modelport may not even look
    assert kube.checked - kube.refused == granted(role)


def test_cluster_wide_management_adds_only_namespaces(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                      cfg: KubernetesConfig, url_clock: UrlClock) -> None:
    cluster_role = rules("cluster-wide", "ClusterRole")
    kube.forbid = fake_kube.rbac(kube, cluster_role, namespaces=None)
    whole_life(alice, kube, KubernetesRuntime(cfg, now=url_clock), url_clock)
    assert kube.refused == set()
    assert kube.checked == granted(cluster_role)
    assert kube.get(f"/api/v1/namespaces/{NS}") is not None  # created, labelled "restricted"


def test_a_namespace_without_the_role_says_how_to_prepare_it(alice: Person, digits: ModelVersion,
                                                             kube: FakeKube, cfg: KubernetesConfig) -> None:
    kube.forbid = fake_kube.rbac(kube, rules("team-namespace", "Role"), namespaces={"modelport-globex"})
    deployment = create(alice)
    with pytest.raises(RuntimeUnavailable) as caught:
        KubernetesRuntime(KubernetesConfig(**{**cfg.__dict__, "create_namespaces": False})).launch(
            deployment.revision)  # type: ignore[arg-type]
    assert str(caught.value).startswith(f"Kubernetes refused to let Modelport read the objects of {NS}/digits: ")
    assert "Role of platform/kubernetes/team-namespace in that namespace" in str(caught.value)
    assert not kube.sent("apply")


def test_the_reconciler_fails_a_deployment_whose_object_is_taken_saying_which(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig, settings: Any) -> None:
    settings.KUBERNETES_KUBECONFIG = cfg.kubeconfig
    settings.KUBERNETES_S3_BUCKET, settings.KUBERNETES_S3_ENDPOINT_URL = cfg.s3_bucket, ""
    settings.KUBERNETES_TRITON_EGRESS = ["52.216.0.0/15:443"]
    deployment = create(alice)
    kube.put(f"/api/v1/namespaces/{NS}/services/digits", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "digits", "namespace": NS}, "spec": {}})
    reconcile.reconcile(deployment.pk)  # renders and uploads
    reconcile.reconcile(deployment.pk)  # launches: refused before anything is applied
    deployment.refresh_from_db()
    assert deployment.status == Deployment.Status.FAILED
    assert deployment.status_message.startswith(f"A Service named digits exists in namespace {NS} and is not this "
                                                "deployment's")
    assert not kube.sent("apply")
