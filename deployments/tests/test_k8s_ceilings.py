"""A team's ceilings on Kubernetes: the portal refuses what is above them when a revision is planned
(test_ceilings.py), and the team's namespace holds them too, as a ResourceQuota (its totals) and a LimitRange (each
container's maximum) that the runtime applies with the revision's objects.

Against the fake API server (fake_kube.py): no Kubernetes API server can run on this machine. The objects are
validated against the real OpenAPI schemas of two Kubernetes versions, as every other manifest is."""

from __future__ import annotations

from typing import Any

import pytest

from accounts.models import TeamQuota
from deployments.models import Deployment
from deployments.runtimes.kubernetes import manifests
from deployments.runtimes.kubernetes.config import KubernetesConfig
from deployments.runtimes.kubernetes.runtime import KubernetesRuntime, team_ceilings
from deployments.tests import fake_kube
from deployments.tests.fake_kube import FakeKube
from deployments.tests.manifests import validate_everywhere
from models_registry.models import ModelVersion
from tests.support.people import Person

NS = "modelport-acme"


def create(person: Person, name: str = "digits", **body: Any) -> Deployment:
    payload = {"name": name, "runtime": "kubernetes", "models": [{"model": "digits"}], **body}
    response = person.client().post("/api/v1/deployments/", payload, format="json")
    assert response.status_code == 201, response.json()
    return Deployment.objects.select_related("team", "revision").get(team=person.team, name=name)


@pytest.mark.kube
def test_the_teams_quota_is_applied_to_its_namespace(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                     cfg: KubernetesConfig) -> None:
    TeamQuota.objects.create(team=alice.team, deployment_memory="8Gi", deployment_cpu="4", total_memory="20Gi",
                             total_cpu="10", total_gpus=2, total_replicas=6)
    deployment = create(alice, replicas=2)
    kube.on_apply = fake_kube.rollout_succeeds
    KubernetesRuntime(cfg).launch(deployment.revision)
    quota = kube.get(f"/api/v1/namespaces/{NS}/resourcequotas/{manifests.QUOTA_NAME}")
    limits = kube.get(f"/api/v1/namespaces/{NS}/limitranges/{manifests.QUOTA_NAME}")
    assert quota is not None and limits is not None
    assert quota["spec"]["hard"] == {"limits.memory": str(20 * 2**30), "requests.cpu": "10",
                                     "requests.nvidia.com/gpu": "2", "pods": "6"}
    assert limits["spec"]["limits"] == [{"type": "Container", "max": {"memory": str(8 * 2**30), "cpu": "4"}}]
    assert quota["metadata"]["labels"]["modelport.io/team"] == "acme"
    # Applied before the Deployment, whose pods the quota admits.
    calls = [r.path for r in kube.sent("apply")]
    assert calls.index(f"/api/v1/namespaces/{NS}/resourcequotas/{manifests.QUOTA_NAME}") \
        < calls.index(f"/apis/apps/v1/namespaces/{NS}/deployments/digits")


@pytest.mark.kube
def test_no_ceiling_set_applies_no_quota_object(alice: Person, digits: ModelVersion, kube: FakeKube,
                                                cfg: KubernetesConfig) -> None:
    deployment = create(alice)
    kube.on_apply = fake_kube.rollout_succeeds
    KubernetesRuntime(cfg).launch(deployment.revision)
    assert not [r for r in kube.requests if "resourcequotas" in r.path or "limitranges" in r.path]
    assert team_ceilings(alice.team) == manifests.TeamCeilings()


def test_the_ceiling_objects_validate_against_two_kubernetes_versions() -> None:
    every = manifests.TeamCeilings(max_memory="8589934592", max_cpu="0.5", total_memory="21474836480",
                                   total_cpu="10", total_gpus=2, total_pods=6)
    objects = manifests.ceiling_objects(NS, "acme", every)
    assert [obj["kind"] for obj in objects] == ["ResourceQuota", "LimitRange"]
    for obj in objects:
        validate_everywhere(obj)
    assert manifests.ceiling_objects(NS, "acme", manifests.TeamCeilings()) == []
