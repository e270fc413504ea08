"""The Kubernetes runtime against a fake API server (deployments/tests/fake_kube.py).

These tests use a fake because no Kubernetes API server can run on this machine (no Docker, kind or k3s). The fake
speaks the REST paths and verbs the official client sends and records them, so the tests assert the exact objects
Modelport applies and the statuses it derives from simulated pods; the manifests themselves are validated against
the real OpenAPI schemas in test_k8s_manifests.py, and `make e2e-k8s` runs the whole flow on a real cluster.

S3 is moto's in-process mock here (the runtime reads each revision's manifest from S3 and presigns URLs for its
files); test_k8s_s3.py runs the same paths against moto's server, and downloads through the presigned URLs.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from deployments import reconcile
from deployments.models import Deployment, Event, Revision
from deployments.runtimes.base import Launch, Observation, RuntimeUnavailable
from deployments.runtimes.kubernetes import manifests
from deployments.runtimes.kubernetes.config import KubernetesConfig
from deployments.runtimes.kubernetes.runtime import KubernetesRuntime, target_for
from deployments.tests import fake_kube
from deployments.tests.fake_kube import FakeKube
from models_registry.models import ModelVersion
from tests.support.people import Person

NS = "modelport-acme"
DEPLOYMENT_PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/digits"
TRITON_LOG = """I1129 16:24:19.371622 1 model_lifecycle.cc:472] "loading: digits:1"
E1129 16:24:19.713920 1 model_lifecycle.cc:642] "failed to load 'digits' version 1: Internal: onnx runtime error 1: Load model from /tmp/folderXYZ/digits/1/model.onnx failed: Protobuf parsing failed."
I1129 16:24:19.714325 1 server.cc:305] "Waiting for in-flight requests to complete."
error: creating server: Internal - failed to load all models
"""  # noqa: E501 - Triton log lines, verbatim


def access(kube: FakeKube, revision: int = 1, name: str = "digits") -> dict[str, Any]:
    """The access Secret of a revision as stored, with its manifest decoded."""
    secret = kube.get(f"/api/v1/namespaces/{NS}/secrets/{name}-r{revision}-repository")
    assert secret is not None
    return {**secret, "manifest": json.loads(base64.b64decode(secret["data"]["manifest.json"]))}


def url_window(url: str) -> tuple[datetime, datetime]:
    """When a presigned URL starts and stops being valid (what S3 checks)."""
    query = parse_qs(urlsplit(url).query)
    start = datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    return start, start + timedelta(seconds=int(query["X-Amz-Expires"][0]))


def create(person: Person, name: str = "digits", **body: Any) -> Deployment:
    payload = {"name": name, "runtime": "kubernetes", "models": [{"model": "digits"}], **body}
    response = person.client().post("/api/v1/deployments/", payload, format="json")
    assert response.status_code == 201, response.json()
    return Deployment.objects.select_related("team", "revision").get(team=person.team, name=name)


def launch_and_wait(runtime: KubernetesRuntime, revision: Revision, looks: int = 3) -> tuple[Launch, Observation]:
    """Launch, and look at the rollout as the reconciler's ticks would until it is ready or failed."""
    launch = runtime.launch(revision)
    for _ in range(looks):
        seen = runtime.observe(launch)
        if seen.state != "starting":
            break
    return launch, seen


@pytest.mark.kube
def test_launch_applies_every_object_with_server_side_apply(alice: Person, digits: ModelVersion,
                                                             kube: FakeKube, cfg: KubernetesConfig) -> None:
    deployment = create(alice, replicas=2)
    kube.on_apply = fake_kube.rollout_succeeds
    launch = KubernetesRuntime(cfg).launch(deployment.revision)

    assert launch.url == "http://digits.modelport-acme.svc.cluster.local:8000"
    assert launch.ref == "modelport-acme/digits"
    assert launch.description == "Deployment modelport-acme/digits, 2 replicas"
    calls = [(r.verb, r.path) for r in kube.requests]
    secret_path = f"/api/v1/namespaces/{NS}/secrets/digits-r1-repository"
    assert calls == [
        # Whose objects are these? Nothing is applied before every name is known to be free or this deployment's.
        ("get", DEPLOYMENT_PATH),
        ("get", secret_path),
        ("get", f"/api/v1/namespaces/{NS}/services/digits"),
        ("get", f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/digits"),
        ("get", f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/digits"),
        ("get", f"/api/v1/namespaces/{NS}"),
        ("apply", f"/api/v1/namespaces/{NS}"),
        ("apply", secret_path),  # before the Deployment, whose pods mount it
        ("apply", DEPLOYMENT_PATH),
        ("apply", secret_path),  # now with its owner reference to the Deployment
        # Stale objects to prune, first (KEDA refuses a ScaledObject beside an HPA); no KEDA here: a 404, none.
        ("get", f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects"),
        ("get", f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers"),
        ("apply", f"/api/v1/namespaces/{NS}/services/digits"),
        ("apply", f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/digits"),
        ("apply", f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/digits"),
    ]
    for request in kube.sent("apply"):
        assert request.query == {"fieldManager": "modelport", "force": "true"}
        assert request.content_type == "application/apply-patch+yaml"

    target = target_for(deployment.revision, cfg)
    uid = kube.get(DEPLOYMENT_PATH)["metadata"]["uid"]  # type: ignore[index]
    expected = manifests.build(target, NS, cfg, owner_uid=uid)
    assert kube.applied("Deployment") == manifests.build(target, NS, cfg)[0]
    assert [kube.applied(kind) for kind in ("Service", "PodDisruptionBudget", "NetworkPolicy")] == expected[1:]
    assert kube.applied("Namespace") == manifests.namespace_object(NS)
    assert kube.applied("Deployment")["metadata"]["annotations"]["modelport.io/repository"] == \
        f"s3://models/modelport/repositories/acme/digits-{deployment.pk}/r1"
    secret = access(kube)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == uid
    files = {f["path"]: f for f in secret["manifest"]["files"]}
    assert sorted(files) == ["digits/1/model.onnx", "digits/config.pbtxt"]
    model_file = files["digits/1/model.onnx"]
    assert model_file["sha256"] == digits.sha256 and model_file["size"] == digits.size  # the registry's
    assert model_file["url"].startswith(f"https://models.s3.amazonaws.com/modelport/repositories/acme/"
                                        f"digits-{deployment.pk}/r1/digits/1/model.onnx?")


@pytest.mark.kube
def test_a_completed_rollout_is_ready(alice: Person, digits: ModelVersion, kube: FakeKube,
                                      cfg: KubernetesConfig) -> None:
    deployment = create(alice)
    kube.on_apply = fake_kube.rollout_succeeds
    _, ready = launch_and_wait(KubernetesRuntime(cfg), deployment.revision)
    assert ready.state == "ready", ready
    assert ready.message == "1 of 1 pods ready"
    assert not kube.sent("watch")


@pytest.mark.kube
def test_each_look_reads_the_pods_once_and_never_waits_for_them(alice: Person, digits: ModelVersion,
                                                                kube: FakeKube, cfg: KubernetesConfig) -> None:
    deployment = create(alice)
    kube.on_apply = fake_kube.pod_stays(fake_kube.loading_status())
    runtime = KubernetesRuntime(cfg)
    launch = runtime.launch(deployment.revision)
    kube.requests.clear()
    seen = runtime.observe(launch)
    assert seen.state == "starting"
    assert [(r.verb, r.path) for r in kube.requests] == [("get", DEPLOYMENT_PATH),
                                                         ("get", f"/api/v1/namespaces/{NS}/pods")]
    assert kube.requests[1].query["labelSelector"] == manifests.revision_selector("acme", "digits", 1)
    fake_kube.rollout_succeeds(kube, kube.get(DEPLOYMENT_PATH))  # type: ignore[arg-type]
    assert runtime.observe(launch).state == "ready"
    assert not kube.sent("watch")  # a watch would hold the worker; the reconciler looks again at its next tick


@pytest.mark.kube
def test_an_image_that_cannot_be_pulled_fails_with_what_to_fix(alice: Person, digits: ModelVersion,
                                                               kube: FakeKube, cfg: KubernetesConfig) -> None:
    deployment = create(alice)
    kube.on_apply = fake_kube.pod_stays(fake_kube.image_pull_status(cfg.image))
    _, ready = launch_and_wait(KubernetesRuntime(cfg), deployment.revision)
    assert ready.state == "failed"
    assert ready.message.startswith(
        "Kubernetes cannot pull the Triton image 'nvcr.io/nvidia/tritonserver:24.10-py3' (ImagePullBackOff: "
        "Back-off pulling image")
    assert "KUBERNETES_IMAGE_PULL_SECRETS" in ready.message and "namespace modelport-acme" in ready.message


@pytest.mark.kube
def test_no_free_gpu_fails_with_the_schedulers_reason(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                      cfg: KubernetesConfig) -> None:
    deployment = create(alice, resources={"gpu": 1})
    scheduler = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: " \
                "3 No preemption victims found for incoming pod."
    kube.on_apply = fake_kube.pod_stays(fake_kube.unschedulable_status(scheduler, since_seconds=600))
    _, ready = launch_and_wait(KubernetesRuntime(cfg), deployment.revision)
    assert ready.state == "failed"
    assert ready.message == (
        f"No node has 1 free GPU(s) for it (the scheduler: {scheduler}). Ask for fewer GPUs (resources.gpu) or "
        "replicas, stop another deployment that holds GPUs, or add GPU nodes.")


@pytest.mark.kube
def test_a_pod_waiting_for_a_node_within_the_grace_period_is_still_starting(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig) -> None:
    deployment = create(alice, resources={"gpu": 1})
    kube.on_apply = fake_kube.pod_stays(fake_kube.unschedulable_status("0/3 nodes are available: 3 Insufficient "
                                                                       "nvidia.com/gpu.", since_seconds=1))
    runtime = KubernetesRuntime(cfg)
    launch = runtime.launch(deployment.revision)
    seen = runtime.observe(launch)
    assert seen.state == "starting" and "Insufficient nvidia.com/gpu" in seen.message


@pytest.mark.kube
def test_oomkilled_says_to_raise_the_memory(alice: Person, digits: ModelVersion, kube: FakeKube,
                                           cfg: KubernetesConfig) -> None:
    deployment = create(alice, resources={"memory": "2Gi"})
    kube.on_apply = fake_kube.pod_stays(fake_kube.oom_status())
    _, ready = launch_and_wait(KubernetesRuntime(cfg), deployment.revision)
    assert ready.state == "failed"
    assert ready.message == (
        "Triton ran out of memory and was killed (OOMKilled) at its limit of 2Gi: the models need more memory than "
        "that to load and serve. Raise resources.memory, or serve fewer or smaller models.")


@pytest.mark.kube
def test_a_crash_loop_comes_with_tritons_last_log_lines(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                        cfg: KubernetesConfig) -> None:
    deployment = create(alice)
    kube.on_apply = fake_kube.pod_stays(fake_kube.crash_loop_status(restarts=3))
    kube.logs[(NS, "digits-r1-0", True)] = "noise\n" * 30 + TRITON_LOG
    _, ready = launch_and_wait(KubernetesRuntime(cfg), deployment.revision)
    assert ready.state == "failed"
    assert ready.message == ("Triton exited with code 1 (pod digits-r1-0, 3 restarts, CrashLoopBackOff). "
                             "Its last log lines say why:")
    assert ready.detail.splitlines()[-4:] == TRITON_LOG.splitlines()
    assert len(ready.detail.splitlines()) == 10
    [log_request] = [r for r in kube.requests if r.path.endswith("/log")]
    assert log_request.path == f"/api/v1/namespaces/{NS}/pods/digits-r1-0/log"
    assert log_request.query == {"container": "triton", "tailLines": "10", "previous": "true", "limitBytes": "1048576"}


@pytest.mark.kube
def test_a_failed_first_revision_is_scaled_to_zero(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                  cfg: KubernetesConfig) -> None:
    deployment = create(alice)
    kube.on_apply = fake_kube.pod_stays(fake_kube.oom_status())
    runtime = KubernetesRuntime(cfg)
    launch, _ = launch_and_wait(runtime, deployment.revision)
    runtime.abandon(launch)
    [scale] = kube.sent("patch")
    assert (scale.path, scale.content_type, scale.body) == (
        f"{DEPLOYMENT_PATH}/scale", "application/merge-patch+json", {"spec": {"replicas": 0}})
    assert kube.get(DEPLOYMENT_PATH)["spec"]["replicas"] == 0  # type: ignore[index]


@pytest.mark.kube
def test_a_failed_new_revision_goes_back_to_the_serving_one(alice: Person, digits: ModelVersion,
                                                           kube: FakeKube, cfg: KubernetesConfig) -> None:
    deployment = create(alice)
    kube.on_apply = fake_kube.rollout_succeeds
    runtime = KubernetesRuntime(cfg)
    first, _ = launch_and_wait(runtime, deployment.revision)
    deployment.set_status(Deployment.Status.READY, "Serving", serving_revision=deployment.revision,
                          upstream_url=first.url)
    response = alice.client().patch("/api/v1/deployments/digits/", {"resources": {"memory": "1Gi"}}, format="json")
    assert response.status_code == 200, response.json()
    second_revision = Revision.objects.get(deployment=deployment, number=2)
    kube.on_apply = fake_kube.pod_stays(fake_kube.oom_status())
    second, ready = launch_and_wait(runtime, second_revision)
    assert ready.state == "failed" and "OOMKilled" in ready.message
    runtime.abandon(second)
    reverted = kube.applied("Deployment")
    assert reverted["metadata"]["labels"]["modelport.io/revision"] == "1"
    assert reverted["metadata"]["annotations"]["modelport.io/repository"].endswith("/r1")
    # The serving revision's pods mount its own access Secret, with URLs written afresh by the rollback.
    assert kube.applied("Secret")["metadata"]["name"] == "digits-r1-repository"
    assert reverted["spec"]["template"]["spec"]["volumes"][-1]["secret"]["secretName"] == "digits-r1-repository"


@pytest.mark.kube
def test_stop_scales_to_zero_and_start_scales_an_autoscaled_deployment_back(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig) -> None:
    deployment = create(alice, autoscaling={"min_replicas": 2, "max_replicas": 4, "metric": "cpu", "target": 60})
    kube.on_apply = fake_kube.rollout_succeeds
    runtime = KubernetesRuntime(cfg)
    launch_and_wait(runtime, deployment.revision)
    assert "replicas" not in kube.applied("Deployment")["spec"]
    assert kube.applied("HorizontalPodAutoscaler")["spec"]["minReplicas"] == 2

    runtime.stop(deployment)
    assert kube.get(DEPLOYMENT_PATH)["spec"]["replicas"] == 0  # type: ignore[index]
    assert kube.items(f"/api/v1/namespaces/{NS}/pods") == []

    kube.requests.clear()
    launch, ready = launch_and_wait(runtime, deployment.revision)
    assert ready.state == "ready", ready
    assert [r.body for r in kube.sent("patch")] == [{"spec": {"replicas": 2}}]  # the HPA does not scale up from 0
    assert launch.description == "Deployment modelport-acme/digits, 2 replicas"
    assert len(kube.items(f"/api/v1/namespaces/{NS}/pods")) == 2


@pytest.mark.kube
def test_objects_a_new_revision_no_longer_has_are_removed(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                          cfg: KubernetesConfig) -> None:
    deployment = create(alice, replicas=3)
    kube.on_apply = fake_kube.rollout_succeeds
    runtime = KubernetesRuntime(cfg)
    launch_and_wait(runtime, deployment.revision)
    assert kube.get(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/digits")
    alice.client().patch("/api/v1/deployments/digits/", {"replicas": 1}, format="json")
    launch_and_wait(runtime, Revision.objects.get(deployment=deployment, number=2))
    assert kube.get(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/digits") is None
    [delete] = kube.sent("delete")
    assert delete.path == f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/digits"


@pytest.mark.kube
def test_teardown_deletes_every_object_labelled_for_the_deployment_and_nothing_else(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig) -> None:
    kube.on_apply = fake_kube.rollout_succeeds
    runtime = KubernetesRuntime(cfg)
    deployment = create(alice, autoscaling={"min_replicas": 2, "max_replicas": 3, "metric": "cpu", "target": 60})
    launch_and_wait(runtime, deployment.revision)
    other = create(alice, name="other")
    launch_and_wait(runtime, other.revision)
    kube.requests.clear()

    runtime.teardown(deployment)
    deleted = sorted(r.path for r in kube.sent("delete"))
    assert deleted == sorted([
        DEPLOYMENT_PATH,
        f"/api/v1/namespaces/{NS}/secrets/digits-r1-repository",
        f"/api/v1/namespaces/{NS}/services/digits",
        f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/digits",
        f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/digits",
        f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/digits",
    ])
    for request in kube.sent("delete"):
        assert request.body == {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
    selector = manifests.managed_selector("acme", "digits")
    assert {r.query.get("labelSelector") for r in kube.sent("get")} == {selector}
    remaining = {p.rsplit("/", 1)[-1] for p in kube.objects if "/namespaces/modelport-acme/" in p
                 and "/pods/" not in p}
    assert remaining == {"other", "other-r1-repository"}


@pytest.mark.kube
def test_logs_come_from_the_pods(alice: Person, digits: ModelVersion, kube: FakeKube,
                                 cfg: KubernetesConfig) -> None:
    deployment = create(alice, replicas=2)
    kube.on_apply = fake_kube.rollout_succeeds
    runtime = KubernetesRuntime(cfg)
    launch_and_wait(runtime, deployment.revision)
    kube.logs[(NS, "digits-r1-0", False)] = "a\nb\nc\n"
    kube.logs[(NS, "digits-r1-1", False)] = "x\ny\n"
    text = runtime.logs(deployment, 2)
    assert "==> pod/digits-r1-0 <==\nb\nc\n" in text and "==> pod/digits-r1-1 <==\nx\ny\n" in text


@pytest.mark.kube
def test_a_pods_giant_log_line_is_read_within_the_cap_even_from_a_server_that_ignores_limit_bytes(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig, settings: Any) -> None:
    settings.LOG_TAIL_MAX_BYTES = 256 * 1024
    deployment = create(alice)
    kube.on_apply = fake_kube.rollout_succeeds
    runtime = KubernetesRuntime(cfg)
    launch_and_wait(runtime, deployment.revision)
    kube.logs[(NS, "digits-r1-0", False)] = "started\n" + "x" * (4 * 1024**2)  # one line, no newline
    for honour in (True, False):
        kube.honour_limit_bytes = honour
        text = runtime.logs(deployment, 1)
        assert len(text.encode()) <= settings.LOG_LINE_MAX_BYTES + 100, honour
        assert text.startswith("x" * 1000) and text.endswith("bytes cut)")
    [request, *_] = [r for r in kube.requests if r.path.endswith("/log")]
    assert request.query["limitBytes"] == str(256 * 1024)


@pytest.mark.kube
def test_check_reports_pods_that_stopped_serving(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                 cfg: KubernetesConfig) -> None:
    deployment = create(alice)
    kube.on_apply = fake_kube.rollout_succeeds
    runtime = KubernetesRuntime(cfg)
    launch, _ = launch_and_wait(runtime, deployment.revision)
    deployment.set_status(Deployment.Status.READY, "Serving", serving_revision=deployment.revision)
    assert runtime.check(deployment, launch).ok

    fake_kube.pod_stays(fake_kube.crash_loop_status(restarts=5, exit_code=139))(kube, kube.get(DEPLOYMENT_PATH))  # type: ignore[arg-type]
    kube.logs[(NS, "digits-r1-0", True)] = TRITON_LOG
    health = runtime.check(deployment, launch)
    assert not health.ok
    assert health.message == "none of its 1 Triton pod(s) is ready"
    assert health.detail.startswith("Triton exited with code 139 (pod digits-r1-0, 5 restarts")
    assert health.detail.endswith("error: creating server: Internal - failed to load all models")


@pytest.mark.kube
def test_it_refuses_to_take_over_another_teams_deployment(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                          cfg: KubernetesConfig) -> None:
    deployment = create(alice)
    kube.put(DEPLOYMENT_PATH, {"apiVersion": "apps/v1", "kind": "Deployment",
                               "metadata": {"name": "digits", "namespace": NS, "labels": {"app": "digits"}},
                               "spec": {"replicas": 1}})
    with pytest.raises(RuntimeUnavailable, match="A Deployment named digits exists in namespace modelport-acme and "
                                                 "is not this deployment's"):
        KubernetesRuntime(cfg).launch(deployment.revision)
    assert not kube.sent("apply", "Deployment")


@pytest.mark.kube
def test_credentials_the_cluster_does_not_accept_are_named(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                         cfg: KubernetesConfig) -> None:
    deployment = create(alice)
    kube.token = "another-token"  # Modelport's token is no longer valid
    with pytest.raises(RuntimeUnavailable, match="did not accept Modelport's credentials"):
        KubernetesRuntime(cfg).launch(deployment.revision)


@pytest.mark.kube
def test_a_forbidden_request_names_the_rbac_rules_to_grant(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                           cfg: KubernetesConfig) -> None:
    deployment = create(alice)
    message = ('networkpolicies.networking.k8s.io "digits" is forbidden: User "system:serviceaccount:modelport:'
               'modelport" cannot patch resource "networkpolicies" in API group "networking.k8s.io" in the '
               'namespace "modelport-acme"')
    kube.forbid = lambda request: message if "networkpolicies" in request.path and request.verb == "apply" else None
    with pytest.raises(RuntimeUnavailable) as caught:
        KubernetesRuntime(cfg).launch(deployment.revision)
    assert str(caught.value) == (
        f"Kubernetes refused to let Modelport apply NetworkPolicy modelport-acme/digits: {message}. Give the "
        "worker's service account the Role of platform/kubernetes/team-namespace in that namespace (or, for "
        "cluster-wide management, platform/kubernetes/cluster-wide).")


def test_a_cluster_that_does_not_answer_says_so(alice: Person, digits: ModelVersion, tmp_path: Path) -> None:
    deployment = create(alice)
    gone = FakeKube()
    kubeconfig = gone.write_kubeconfig(tmp_path / "kubeconfig")
    gone.server.server_close()  # the port is closed: connection refused
    runtime = KubernetesRuntime(KubernetesConfig(kubeconfig=str(kubeconfig)))
    with pytest.raises(RuntimeUnavailable, match=r"^The Kubernetes API server is not reachable \("):
        runtime.launch(deployment.revision)
    launch = Launch(deployment.revision.pk, "http://digits.modelport-acme.svc.cluster.local:8000", "", f"{NS}/digits")
    health = runtime.check(deployment, launch)
    assert health.ok and health.unknown  # cannot tell: the pods most likely still serve, nothing is restarted
    assert health.message.startswith("the Kubernetes API server is not reachable (")


@pytest.mark.kube
def test_a_health_check_that_rbac_refuses_is_unknown_and_names_the_rules(alice: Person, digits: ModelVersion,
                                                                        kube: FakeKube, cfg: KubernetesConfig,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A 403 while reading the Deployment was reported as healthy: now the check says it cannot tell, and why."""
    deployment = create(alice)
    kube.on_apply = fake_kube.rollout_succeeds
    runtime = KubernetesRuntime(cfg)
    launch, _ = launch_and_wait(runtime, deployment.revision)
    refusal = 'deployments.apps "digits" is forbidden: User "system:serviceaccount:modelport:modelport" cannot get'
    kube.forbid = lambda request: refusal if request.verb == "get" else None
    with caplog.at_level("WARNING", logger="deployments.runtimes.kubernetes.runtime"):
        health = runtime.check(deployment, launch)
    assert health.unknown and health.ok
    assert health.message == (f"Kubernetes refused to let Modelport read Deployment {NS}/digits: {refusal}. Give "
                              "the worker's service account the Role of platform/kubernetes/team-namespace in that "
                              "namespace (or, for cluster-wide management, platform/kubernetes/cluster-wide).")
    assert f"cannot check deployment {deployment.pk} ({NS}/digits) on Kubernetes: 403" in caplog.text


def test_without_a_cluster_the_deployment_fails_saying_what_to_set(
        alice: Person, digits: ModelVersion, settings: Any) -> None:
    settings.KUBERNETES_KUBECONFIG = ""
    settings.KUBERNETES_IN_CLUSTER = False
    settings.KUBERNETES_S3_BUCKET = ""
    deployment = create(alice)
    reconcile.reconcile(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.status == Deployment.Status.FAILED
    assert deployment.status_message.startswith(
        "No Kubernetes cluster is configured: set KUBECONFIG to a kubeconfig file, or run the worker in-cluster "
        "with KUBERNETES_IN_CLUSTER=true")
    assert "S3 for model repositories is not configured" in deployment.status_message
    assert "KUBERNETES_S3_BUCKET (or S3_BUCKET)" in deployment.status_message
    assert Event.objects.filter(deployment=deployment, kind=Event.Kind.ERROR,
                                message__startswith="No Kubernetes cluster is configured").exists()
    # Nothing was started, so stopping and deleting need no cluster.
    response = alice.client().delete("/api/v1/deployments/digits/")
    assert response.status_code == 202
    reconcile.reconcile(deployment.pk)
    assert not Deployment.objects.filter(pk=deployment.pk).exists()


@pytest.mark.kube
def test_stop_and_delete_go_through_the_reconciler(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                   cfg: KubernetesConfig, settings: Any) -> None:
    settings.KUBERNETES_KUBECONFIG = cfg.kubeconfig
    settings.KUBERNETES_S3_BUCKET = ""
    deployment = create(alice)
    kube.on_apply = fake_kube.rollout_succeeds
    KubernetesRuntime(cfg).launch(deployment.revision)
    deployment.set_status(Deployment.Status.READY, "Serving", serving_revision=deployment.revision)

    assert alice.client().post("/api/v1/deployments/digits/stop").status_code == 202
    reconcile.reconcile(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.status == Deployment.Status.STOPPED
    assert kube.get(DEPLOYMENT_PATH)["spec"]["replicas"] == 0  # type: ignore[index]

    assert alice.client().delete("/api/v1/deployments/digits/").status_code == 202
    reconcile.reconcile(deployment.pk)
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    assert kube.get(DEPLOYMENT_PATH) is None
    assert kube.get(f"/api/v1/namespaces/{NS}/services/digits") is None


def test_deleting_waits_while_the_cluster_does_not_answer(alice: Person, digits: ModelVersion, tmp_path: Path,
                                                          settings: Any) -> None:
    gone = FakeKube()
    settings.KUBERNETES_KUBECONFIG = str(gone.write_kubeconfig(tmp_path / "kubeconfig"))
    gone.server.server_close()
    settings.KUBERNETES_S3_BUCKET = ""
    deployment = create(alice)
    from deployments import actions

    actions.delete_deployment(deployment, alice.user)
    reconcile.reconcile(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.status == Deployment.Status.STOPPING
    assert deployment.status_message.startswith("Waiting for the runtime: The Kubernetes API server is not reachable")


def test_a_kubeconfig_that_cannot_be_loaded_says_so(alice: Person, digits: ModelVersion, tmp_path: Path) -> None:
    deployment = create(alice)
    runtime = KubernetesRuntime(KubernetesConfig(kubeconfig=str(tmp_path / "missing")))
    with pytest.raises(RuntimeUnavailable, match=f"from KUBECONFIG={tmp_path / 'missing'} cannot be loaded"):
        runtime.launch(deployment.revision)
