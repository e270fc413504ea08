"""KUBERNETES_AUTOSCALING on the fake API server (deployments/tests/fake_kube.py; no real one runs on this machine):
the queue-ratio HPA and KEDA's ScaledObject are applied in place of the deployment's own HPA, a switch between them
removes the old autoscaler before the new one is applied, KEDA's own HPA is left to KEDA, and a cluster without
KEDA's CRD (the fake answers 404 for it, as an API server does) refuses the rollout before anything is applied."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from deployments.models import Deployment, Revision
from deployments.runtimes.base import RuntimeUnavailable
from deployments.runtimes.kubernetes import manifests
from deployments.runtimes.kubernetes.config import KubernetesConfig
from deployments.runtimes.kubernetes.runtime import KubernetesRuntime
from deployments.tests import fake_kube
from deployments.tests.fake_kube import FakeKube
from models_registry.models import ModelVersion
from tests.support.people import Person

NS = "modelport-acme"
HPA_PATH = f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/digits"
SCALED_PATH = f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects/digits"
AUTOSCALING = {"min_replicas": 2, "max_replicas": 5, "metric": "cpu", "target": 70}
PROMETHEUS = "http://prometheus.observability.svc:9090"

pytestmark = pytest.mark.kube


def create(person: Person, name: str = "digits", **body: Any) -> Deployment:
    payload = {"name": name, "runtime": "kubernetes", "models": [{"model": "digits"}], **body}
    response = person.client().post("/api/v1/deployments/", payload, format="json")
    assert response.status_code == 201, response.json()
    return Deployment.objects.select_related("team", "revision").get(team=person.team, name=name)


def keda(cfg: KubernetesConfig) -> KubernetesRuntime:
    return KubernetesRuntime(replace(cfg, autoscaling="keda", keda_prometheus_url=PROMETHEUS))


def test_without_kedas_crd_a_keda_rollout_is_refused_before_anything_is_applied(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig) -> None:
    deployment = create(alice, autoscaling=AUTOSCALING)
    with pytest.raises(RuntimeUnavailable, match="the cluster has no KEDA.*Install KEDA"):
        keda(cfg).launch(deployment.revision)  # type: ignore[arg-type]
    assert kube.sent("apply") == []
    assert kube.get(SCALED_PATH) is None


def test_with_kedas_crd_the_scaled_object_replaces_the_hpa(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                            cfg: KubernetesConfig) -> None:
    kube.custom_resources.add("scaledobjects.keda.sh")
    kube.on_apply = fake_kube.rollout_succeeds
    deployment = create(alice, autoscaling=AUTOSCALING)
    KubernetesRuntime(cfg).launch(deployment.revision)  # type: ignore[arg-type]
    assert kube.get(HPA_PATH) is not None and kube.get(SCALED_PATH) is None

    kube.requests.clear()
    launch = keda(cfg).launch(deployment.revision)  # type: ignore[arg-type]
    assert launch.description == "Deployment modelport-acme/digits, 2 replicas"
    scaled = kube.get(SCALED_PATH)
    assert scaled is not None and kube.get(HPA_PATH) is None
    assert scaled["spec"]["triggers"][0]["metadata"]["serverAddress"] == PROMETHEUS
    assert scaled["metadata"]["ownerReferences"][0]["kind"] == "Deployment"  # goes with it
    # The HPA went before the ScaledObject came (KEDA's webhook refuses one for a Deployment an HPA scales).
    calls = [(r.verb, r.path) for r in kube.requests]
    assert calls.index(("delete", HPA_PATH)) < calls.index(("apply", SCALED_PATH))


def test_kedas_own_hpa_is_left_to_keda_and_a_switch_back_removes_the_scaled_object(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig) -> None:
    kube.custom_resources.add("scaledobjects.keda.sh")
    kube.on_apply = fake_kube.rollout_succeeds
    deployment = create(alice, autoscaling=AUTOSCALING)
    keda(cfg).launch(deployment.revision)  # type: ignore[arg-type]
    scaled = kube.get(SCALED_PATH)
    assert scaled is not None
    # What KEDA's operator makes: an HPA named keda-hpa-<name>, with the ScaledObject's labels, owned by it.
    keda_hpa = f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/keda-hpa-digits"
    kube.put(keda_hpa, {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {
        "name": "keda-hpa-digits", "namespace": NS, "labels": dict(scaled["metadata"]["labels"]),
        "ownerReferences": [{"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": "digits",
                             "uid": scaled["metadata"]["uid"]}]}, "spec": {}})
    keda(cfg).launch(deployment.revision)  # type: ignore[arg-type]
    assert kube.get(keda_hpa) is not None and kube.sent("delete") == []

    queue_ratio = KubernetesRuntime(replace(cfg, autoscaling="queue-ratio-hpa"))
    queue_ratio.launch(deployment.revision)  # type: ignore[arg-type]
    assert kube.get(SCALED_PATH) is None  # KEDA's garbage collection takes its HPA with it
    hpa = kube.get(HPA_PATH)
    assert hpa is not None and hpa["spec"]["metrics"][0]["external"]["metric"]["name"] == (
        manifests.QUEUE_RATIO_METRIC)


def test_on_a_cluster_without_keda_the_other_settings_never_need_it(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig) -> None:
    """The pruning and teardown lists of ScaledObjects answer 404 there: nothing to remove, the rest goes on."""
    kube.on_apply = fake_kube.rollout_succeeds
    deployment = create(alice, autoscaling=AUTOSCALING)
    runtime = KubernetesRuntime(replace(cfg, autoscaling="queue-ratio-hpa"))
    runtime.launch(deployment.revision)  # type: ignore[arg-type]
    assert kube.get(HPA_PATH) is not None
    alice.client().patch("/api/v1/deployments/digits/", {"autoscaling": None, "replicas": 1}, format="json")
    runtime.launch(Revision.objects.get(deployment=deployment, number=2))
    assert kube.get(HPA_PATH) is None
    runtime.teardown(deployment)
    assert [p for p in kube.objects if f"/namespaces/{NS}/" in p and "/pods/" not in p] == []


def test_stop_removes_the_scaled_object_so_that_keda_does_not_scale_the_deployment_back_up(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig) -> None:
    kube.custom_resources.add("scaledobjects.keda.sh")
    kube.on_apply = fake_kube.rollout_succeeds
    deployment = create(alice, autoscaling=AUTOSCALING)
    runtime = keda(cfg)
    runtime.launch(deployment.revision)  # type: ignore[arg-type]
    runtime.stop(deployment)
    assert kube.get(SCALED_PATH) is None
    assert kube.get(f"/apis/apps/v1/namespaces/{NS}/deployments/digits")["spec"]["replicas"] == 0  # type: ignore[index]
    runtime.launch(deployment.revision)  # type: ignore[arg-type]  # start: back, at the minimum
    assert kube.get(SCALED_PATH) is not None
    assert kube.get(f"/apis/apps/v1/namespaces/{NS}/deployments/digits")["spec"]["replicas"] == 2  # type: ignore[index]


ZERO = {"min_replicas": 0, "max_replicas": 3, "metric": "cpu", "target": 70}
DEPLOYMENT_PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/digits"


def test_min_replicas_zero_is_a_400_unless_the_cluster_autoscales_with_keda(
        alice: Person, digits: ModelVersion, kube: FakeKube, settings: Any) -> None:
    payload = {"name": "digits", "runtime": "kubernetes", "models": [{"model": "digits"}], "autoscaling": ZERO}
    response = alice.client().post("/api/v1/deployments/", payload, format="json")
    assert response.status_code == 400, response.json()
    [message] = response.json()["error"]["fields"]["autoscaling.min_replicas"]
    assert "needs KEDA" in message and "KUBERNETES_AUTOSCALING=keda" in message
    assert not Deployment.objects.filter(name="digits").exists()
    settings.KUBERNETES_AUTOSCALING, settings.KUBERNETES_KEDA_PROMETHEUS_URL = "keda", PROMETHEUS
    assert alice.client().post("/api/v1/deployments/", payload, format="json").status_code == 201


def test_a_scale_to_zero_rollout_is_verified_on_a_pod_and_then_left_to_keda(
        alice: Person, digits: ModelVersion, kube: FakeKube, cfg: KubernetesConfig, settings: Any) -> None:
    """KEDA would take a fresh pod of an idle deployment back to zero before its revision could be verified: the
    rollout starts one and pauses KEDA there, and the revision once ready lifts the pause. The fake plays KEDA's
    scale to zero; the deployment stays healthy at zero (the gateway holds the next request)."""
    settings.KUBERNETES_AUTOSCALING, settings.KUBERNETES_KEDA_PROMETHEUS_URL = "keda", PROMETHEUS
    kube.custom_resources.add("scaledobjects.keda.sh")
    kube.on_apply = fake_kube.rollout_succeeds
    deployment = create(alice, autoscaling=ZERO)
    runtime = keda(cfg)
    launch = runtime.launch(deployment.revision)  # type: ignore[arg-type]
    assert kube.get(DEPLOYMENT_PATH)["spec"]["replicas"] == 1  # type: ignore[index]
    scaled = kube.get(SCALED_PATH)
    assert scaled is not None and scaled["spec"]["minReplicaCount"] == 0
    assert scaled["metadata"]["annotations"] == {manifests.KEDA_PAUSED_REPLICAS: "1"}

    assert runtime.observe(launch).state == "ready"
    scaled = kube.get(SCALED_PATH)
    assert scaled is not None and not scaled["metadata"].get("annotations")
    assert scaled["metadata"]["ownerReferences"][0]["kind"] == "Deployment"  # still goes with it

    # KEDA, no request coming: the Deployment goes to zero, and that is no failure of a deployment that scales to it.
    gone = dict(kube.get(DEPLOYMENT_PATH) or {})
    gone["spec"] = {**gone["spec"], "replicas": 0}
    kube.put(DEPLOYMENT_PATH, gone)
    fake_kube.set_deployment_status(kube, gone, updated=0, available=0)
    deployment.refresh_from_db()
    assert runtime.check(deployment, launch).ok

    # The next rollout, to a Deployment at zero, starts a pod again to verify the new revision.
    assert alice.client().patch("/api/v1/deployments/digits/", {"autoscaling": {**ZERO, "max_replicas": 2}},
                                format="json").status_code == 200
    second = runtime.launch(Revision.objects.get(deployment=deployment, number=2))
    assert kube.get(DEPLOYMENT_PATH)["spec"]["replicas"] == 1  # type: ignore[index]
    assert kube.get(SCALED_PATH)["metadata"]["annotations"] == {  # type: ignore[index]
        manifests.KEDA_PAUSED_REPLICAS: "1"}
    assert runtime.observe(second).state == "ready"
    assert not kube.get(SCALED_PATH)["metadata"].get("annotations")  # type: ignore[index]
