"""Kubernetes deployments through the API: the manifests export (GitOps), the render_manifests command, and the
autoscaling settings. No cluster is involved: exporting works without one."""

from __future__ import annotations

import io
from typing import Any

import kubernetes_validate
import pytest
import yaml
from django.core.management import CommandError, call_command

from deployments.models import Deployment
from models_registry.models import ModelVersion
from tests.support.people import Person
from tests.support.versions import make_ready_version

KUBERNETES_VERSIONS = ("1.31", "1.33")
AUTOSCALING = {"min_replicas": 2, "max_replicas": 5, "metric": "queue_time", "target": 2000}


def create(person: Person, name: str = "digits-prod", **body: Any) -> Any:
    payload = {"name": name, "runtime": "kubernetes", "models": [{"model": "digits"}], **body}
    return person.client().post("/api/v1/deployments/", payload, format="json")


def manifests_of(person: Person, name: str = "digits-prod", **headers: str) -> Any:
    return person.client().get(f"/api/v1/deployments/{name}/manifests", **headers)


@pytest.fixture(autouse=True)
def _cluster_settings(settings: Any) -> None:
    settings.KUBERNETES_KUBECONFIG = ""
    settings.KUBERNETES_S3_BUCKET = "models"
    settings.KUBERNETES_S3_ENDPOINT_URL = "http://minio.storage.svc:9000"
    settings.KUBERNETES_S3_PREFIX = "modelport/repositories"
    settings.KUBERNETES_NAMESPACES = {}
    settings.KUBERNETES_CREATE_NAMESPACES = True


def test_the_manifests_of_the_current_revision_are_multi_document_yaml(alice: Person, digits: ModelVersion) -> None:
    assert create(alice, replicas=2, resources={"gpu": 1, "memory": "8Gi"}).status_code == 201
    response = manifests_of(alice)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/yaml; charset=utf-8"
    text = response.content.decode()
    assert text.startswith("# Modelport deployment acme/digits-prod, revision 1.\n")
    assert "No Kubernetes cluster is configured" in text  # said in a comment, the export works anyway
    documents = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in documents] == ["Namespace", "Deployment", "Service", "PodDisruptionBudget",
                                              "NetworkPolicy"]
    assert "Secret" not in {d["kind"] for d in documents}
    deployment = documents[1]
    assert deployment["metadata"]["namespace"] == "modelport-acme"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    pk = Deployment.objects.get().pk
    assert container["args"][0] == "--model-repository=/models"
    assert deployment["metadata"]["annotations"]["modelport.io/repository"] == (
        f"s3://http://minio.storage.svc:9000/models/modelport/repositories/acme/digits-prod-{pk}/r1")
    # The access Secret holds presigned URLs: named in the header and the pod, never exported.
    assert "presigned URLs from the Secret digits-prod-r1-repository," in text
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "repository-access", "secret": {"secretName": "digits-prod-r1-repository",
                                                    "defaultMode": 0o440}} in volumes
    assert container["resources"]["limits"] == {"memory": "8Gi", "nvidia.com/gpu": "1"}
    for document in documents:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)


def test_a_new_revision_changes_the_export(alice: Person, digits: ModelVersion) -> None:
    create(alice)
    alice.client().patch("/api/v1/deployments/digits-prod/", {"replicas": 3}, format="json")
    documents = list(yaml.safe_load_all(manifests_of(alice).content))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["metadata"]["labels"]["app.kubernetes.io/version"] == "r2"


def test_clients_may_ask_for_yaml(alice: Person, digits: ModelVersion) -> None:
    create(alice)
    response = manifests_of(alice, HTTP_ACCEPT="application/yaml")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/yaml; charset=utf-8"
    kinds = {d["kind"] for d in yaml.safe_load_all(response.content) if d}
    assert {"Deployment", "Service", "NetworkPolicy"} <= kinds


def test_bob_may_export_and_charlie_sees_nothing(alice: Person, bob: Person, charlie: Person,
                                                  digits: ModelVersion) -> None:
    create(alice)
    assert manifests_of(bob).status_code == 200
    assert manifests_of(charlie).status_code == 404


def test_a_local_deployment_has_no_manifests(alice: Person, digits: ModelVersion) -> None:
    create(alice, runtime="local")
    response = manifests_of(alice)
    assert response.status_code == 409
    assert "only deployments with runtime 'kubernetes'" in response.json()["error"]["message"]


def test_the_command_prints_the_same_yaml(alice: Person, digits: ModelVersion) -> None:
    create(alice)
    out = io.StringIO()
    call_command("render_manifests", "digits-prod", stdout=out)
    assert out.getvalue() == manifests_of(alice).content.decode()


def test_the_command_needs_the_team_when_a_name_is_ambiguous(alice: Person, charlie: Person,
                                                             digits: ModelVersion) -> None:
    create(alice)
    make_ready_version(charlie)
    assert create(charlie).status_code == 201
    with pytest.raises(CommandError, match=r"Several teams have a deployment named 'digits-prod' \(acme, globex\)"):
        call_command("render_manifests", "digits-prod")
    out = io.StringIO()
    call_command("render_manifests", "digits-prod", "--team", "globex", stdout=out)
    assert "namespace: modelport-globex" in out.getvalue()
    with pytest.raises(CommandError, match="No deployment named 'nope'"):
        call_command("render_manifests", "nope")


def test_namespaces_follow_the_team_mapping(alice: Person, digits: ModelVersion, settings: Any) -> None:
    settings.KUBERNETES_NAMESPACES = {"acme": "ml-serving"}
    settings.KUBERNETES_CREATE_NAMESPACES = False
    create(alice)
    documents = list(yaml.safe_load_all(manifests_of(alice).content))
    assert {d["metadata"]["namespace"] for d in documents} == {"ml-serving"}  # and no Namespace object


def test_autoscaling_is_kept_in_the_revision_and_exported_as_an_hpa(alice: Person, digits: ModelVersion) -> None:
    response = create(alice, autoscaling=AUTOSCALING)
    assert response.status_code == 201, response.json()
    assert response.json()["autoscaling"] == AUTOSCALING
    assert Deployment.objects.get().revision.spec.to_json()["autoscaling"] == AUTOSCALING  # type: ignore[union-attr]
    documents = {d["kind"]: d for d in yaml.safe_load_all(manifests_of(alice).content)}
    assert documents["HorizontalPodAutoscaler"]["spec"]["maxReplicas"] == 5
    assert "replicas" not in documents["Deployment"]["spec"]

    patched = alice.client().patch("/api/v1/deployments/digits-prod/", {"replicas": 1}, format="json").json()
    assert patched["autoscaling"] == AUTOSCALING  # a PATCH that does not mention it keeps it
    cleared = alice.client().patch("/api/v1/deployments/digits-prod/", {"autoscaling": None}, format="json").json()
    assert cleared["autoscaling"] is None


def test_autoscaling_is_validated(alice: Person, digits: ModelVersion) -> None:
    response = create(alice, autoscaling={"min_replicas": 4, "max_replicas": 2, "target": 70})
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["autoscaling.max_replicas"] == ["max_replicas must be at least "
                                                                              "min_replicas"]
    response = create(alice, autoscaling={"min_replicas": 1, "max_replicas": 2, "metric": "gpu", "target": 70})
    assert response.status_code == 400
    assert "autoscaling.metric" in response.json()["error"]["fields"]
    response = create(alice, runtime="local", autoscaling={"min_replicas": 1, "max_replicas": 2, "target": 70})
    assert response.status_code == 400
    assert "needs runtime 'kubernetes'" in response.json()["error"]["fields"]["autoscaling"][0]
    assert not Deployment.objects.exists()

