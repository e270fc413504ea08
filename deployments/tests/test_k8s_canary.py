"""A canary on the Kubernetes runtime, through the reconciler and a fake API server (fake_kube.py: no real cluster
can run on this machine). The canary gets a Kubernetes Deployment and Service of its own, named apart and selecting
only its pods, beside the serving ones; the gateway splits the requests between the two Services. Promote keeps
the canary's objects serving and removes the old ones; rollback removes the canary's."""

from __future__ import annotations

from typing import Any

import pytest

from deployments import canary, reconcile
from deployments.models import Deployment, Event
from deployments.runtimes.kubernetes.runtime import KubernetesRuntime
from deployments.tests import fake_kube
from deployments.tests.fake_kube import FakeKube
from deployments.tests.k8s_pools import kube_runtime
from models_registry.models import ModelVersion
from tests.support.people import Person

pytestmark = pytest.mark.kube  # every test here talks to the fake Kubernetes API server

NS = "modelport-acme"


def path(kind: str, name: str) -> str:
    group = {"deployments": "/apis/apps/v1", "services": "/api/v1"}[kind]
    return f"{group}/namespaces/{NS}/{kind}/{name}"


def settle(deployment: Deployment, done: Any, ticks: int = 20) -> Deployment:
    for _ in range(ticks):
        reconcile.reconcile(deployment.pk)
        row = Deployment.objects.select_related("serving_revision", "canary_revision").get(pk=deployment.pk)
        if done(row):
            return row
    raise AssertionError(f"not done: {row.status_message}")


def patch(person: Person, body: Any) -> Any:
    response = person.client().patch("/api/v1/deployments/digits/", body, format="json")
    assert response.status_code == 200, response.json()
    return response.json()


def serving(alice: Person) -> Deployment:
    response = alice.client().post("/api/v1/deployments/", {"name": "digits", "runtime": "kubernetes",
                                                             "models": [{"model": "digits"}]}, format="json")
    assert response.status_code == 201, response.json()
    deployment = Deployment.objects.get(name="digits")
    return settle(deployment, lambda d: d.status == Deployment.Status.READY and d.drain_until is None)


def test_a_canary_runs_in_a_deployment_and_service_of_its_own_and_promote_keeps_them(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None) -> None:
    deployment = serving(alice)
    stable_url = deployment.upstream_url
    assert stable_url == f"http://digits.{NS}.svc.cluster.local:8000"
    patch(alice, {"replicas": 2, "rollout": {"strategy": "canary", "percent": 10}})
    row = settle(deployment, lambda d: bool(d.canary_upstream_url))
    assert row.canary_upstream_url == f"http://digits-canary.{NS}.svc.cluster.local:8000"
    assert row.canary_grpc_upstream == f"digits-canary.{NS}.svc.cluster.local:8001"
    assert row.upstream_url == stable_url
    stable, canary_deployment = kube.get(path("deployments", "digits")), kube.get(path("deployments", "digits-canary"))
    assert stable is not None and canary_deployment is not None
    assert stable["spec"]["replicas"] == 1 and canary_deployment["spec"]["replicas"] == 2  # each its revision's
    assert canary_deployment["metadata"]["labels"]["modelport.io/deployment"] == "digits"
    service = kube.get(path("services", "digits-canary"))
    assert service is not None
    assert service["spec"]["selector"]["app.kubernetes.io/instance"] == "digits-canary"
    assert kube.get(path("services", "digits"))["spec"]["selector"]["app.kubernetes.io/instance"] == "digits"  # type: ignore[index]
    # Both are health-checked, each its own Deployment.
    assert KubernetesRuntime().check(row, _launch(row.canary_launch)).ok

    from deployments import actions

    actions.promote_canary(row, alice.user)
    row = settle(deployment, lambda d: d.drain_until is None)
    assert row.serving_revision.number == 2 and row.upstream_url.startswith("http://digits-canary.")
    assert kube.get(path("deployments", "digits")) is None and kube.get(path("services", "digits")) is None
    assert kube.get(path("deployments", "digits-canary")) is not None
    assert any(e.message.startswith(f"Removed the Kubernetes Deployment {NS}/digits,") for e in Event.objects.all())

    # The next canary goes to the other name, and a rollback removes it; the serving objects stay.
    patch(alice, {"replicas": 3, "rollout": {"strategy": "canary", "percent": 50}})
    row = settle(deployment, lambda d: bool(d.canary_upstream_url))
    assert row.canary_upstream_url.startswith("http://digits.")
    actions.rollback_canary(row, alice.user)
    row = settle(deployment, lambda d: d.drain_until is None)
    assert kube.get(path("deployments", "digits")) is None
    assert kube.get(path("deployments", "digits-canary"))["spec"]["replicas"] == 2  # type: ignore[index]
    # A plain change then rolls the serving Deployment (digits-canary) in place.
    patch(alice, {"replicas": 4})
    row = settle(deployment, lambda d: d.status == Deployment.Status.READY and d.serving_revision.number == 4)
    assert kube.get(path("deployments", "digits-canary"))["spec"]["replicas"] == 4  # type: ignore[index]
    assert kube.get(path("deployments", "digits")) is None


def test_a_canary_that_fails_on_the_cluster_leaves_the_serving_deployment_alone(
        alice: Person, digits: ModelVersion, kube: FakeKube, kube_runtime: None) -> None:
    deployment = serving(alice)
    kube.on_apply = fake_kube.pod_stays(fake_kube.fetch_failed_status(2))
    patch(alice, {"replicas": 2, "rollout": {"strategy": "canary", "percent": 10}})
    row = settle(deployment, lambda d: d.canary_revision_id is None)
    assert row.status == Deployment.Status.READY and row.upstream_url.startswith("http://digits.")
    assert kube.get(path("deployments", "digits"))["spec"]["replicas"] == 1  # type: ignore[index]
    assert kube.get(path("deployments", "digits-canary"))["spec"]["replicas"] == 0  # type: ignore[index]
    assert any(e.message.startswith("Canary revision 2 failed to start") for e in Event.objects.all())


def test_stop_and_delete_cover_the_canarys_objects(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                   kube_runtime: None) -> None:
    deployment = serving(alice)
    patch(alice, {"replicas": 2, "rollout": {"strategy": "canary", "percent": 10}})
    settle(deployment, lambda d: bool(d.canary_upstream_url))
    assert alice.client().post("/api/v1/deployments/digits/stop").status_code == 202
    settle(deployment, lambda d: d.status == Deployment.Status.STOPPED)
    for name in ("digits", "digits-canary"):
        assert kube.get(path("deployments", name))["spec"]["replicas"] == 0  # type: ignore[index]
    assert alice.client().delete("/api/v1/deployments/digits/").status_code == 202
    reconcile.reconcile(deployment.pk)
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    for name in ("digits", "digits-canary"):
        assert kube.get(path("deployments", name)) is None and kube.get(path("services", name)) is None


def _launch(data: Any) -> Any:
    from deployments.runtimes.base import Launch

    return Launch.from_json(data)


__all__ = ["canary", "kube_runtime"]  # kube_runtime: the fixture of k8s_pools.py
