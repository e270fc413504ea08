"""The manifests of a Kubernetes deployment revision: pure functions of the revision and the config, checked
field by field and validated offline against the OpenAPI schemas of two Kubernetes versions
(kubernetes-validate's strict schemas, which also reject unknown fields). No cluster runs here: what a real API
server and kubelet do with these objects is not proven by these tests (docs/kubernetes.md says what is)."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
import yaml

from deployments.runtimes.kubernetes import manifests
from deployments.runtimes.kubernetes.config import KubernetesConfig, parse_egress
from deployments.runtimes.kubernetes.manifests import ManifestError
from deployments.tests.manifests import CONFIG, model, target, validate_everywhere

FILES = [{"path": "digits/1/model.onnx", "size": 3, "sha256": "a" * 64,
          "url": "http://minio/models/x?X-Amz-Signature=1"}]


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in objects}


VARIANTS: dict[str, dict[str, Any]] = {
    "cpu": {},
    "gpus and replicas": {"replicas": 3, "resources": {"cpu": "4", "memory": "16Gi", "gpu": 2, "gpu_type": "a100"}},
    "mig slice": {"resources": {"gpu": 1, "mig_profile": "1g.10gb"}},
    "cpu autoscaling": {"autoscaling": {"min_replicas": 2, "max_replicas": 6, "metric": "cpu", "target": 70}},
    "queue time autoscaling": {"autoscaling": {"min_replicas": 1, "max_replicas": 4, "metric": "queue_time",
                                               "target": 5000}},
    "custom image and cache": {"image": "registry.example.com/triton:custom",
                               "models": [model(response_cache=True)]},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_generated_manifest_validates_against_two_kubernetes_versions(variant: str) -> None:
    objects = manifests.build(target(**VARIANTS[variant]), "modelport-acme", CONFIG, owner_uid="0b7a4f1e-1")
    objects += [manifests.namespace_object("modelport-acme"),
                manifests.access_secret(target(), "modelport-acme", FILES, ["pipeline/1"], "2026-12-01T10:00:00Z",
                                        owner_uid="0b7a4f1e-1")]
    for obj in objects:
        validate_everywhere(obj)


def triton_pod(**spec: Any) -> dict[str, Any]:
    return manifests.build(target(**spec), "modelport-acme", CONFIG)[0]["spec"]["template"]["spec"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_triton_pod_holds_an_s3_credential_or_a_token(variant: str) -> None:
    pod = triton_pod(**VARIANTS[variant])
    text = json.dumps(pod)
    for secret_word in ("AWS_", "S3_", "secretKeyRef", "secretRef", "modelport-s3", "envFrom"):
        assert secret_word not in text, secret_word
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert "serviceAccountName" not in pod
    # The one Secret of the pod is the revision's access Secret, and only the init container mounts it.
    secrets = [v for v in pod["volumes"] if "secret" in v]
    assert secrets == [{"name": "repository-access", "secret": {"secretName": "digits-r3-repository",
                                                                "defaultMode": 0o440}}]
    [triton] = pod["containers"]
    assert "repository-access" not in {m["name"] for m in triton["volumeMounts"]}
    assert triton["env"] == [{"name": "HOME", "value": "/tmp"}]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_container_meets_the_restricted_pod_security_standard(variant: str) -> None:
    pod = triton_pod(**VARIANTS[variant])
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    for container in pod["initContainers"] + pod["containers"]:
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                                "readOnlyRootFilesystem": True, "runAsNonRoot": True}
        assert "privileged" not in json.dumps(container) and "hostPath" not in json.dumps(pod)
    allowed_volumes = {"emptyDir", "secret"}
    assert all(set(v) - {"name"} <= allowed_volumes for v in pod["volumes"])


def test_the_init_container_fetches_the_repository_that_triton_reads_read_only() -> None:
    pod = triton_pod()
    [init] = pod["initContainers"]
    assert init["name"] == "fetch-repository"
    assert init["image"] == CONFIG.image  # the operator's Triton image has python3; never the user's custom image
    assert init["command"] == ["python3", "/etc/modelport/repository/fetch.py",
                               "/etc/modelport/repository/manifest.json", "/models"]
    assert {m["mountPath"]: m.get("readOnly", False) for m in init["volumeMounts"]} == {
        "/models": False, "/etc/modelport/repository": True}
    [triton] = pod["containers"]
    assert {m["mountPath"]: m.get("readOnly", False) for m in triton["volumeMounts"]} == {
        "/dev/shm": False, "/tmp": False, "/models": True}
    assert "--model-repository=/models" in triton["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}
    assert volumes["repository"] == {"name": "repository", "emptyDir": {}}
    custom = triton_pod(image="registry.example.com/triton:custom")
    assert custom["initContainers"][0]["image"] == CONFIG.image
    assert custom["containers"][0]["image"] == "registry.example.com/triton:custom"
    small = KubernetesConfig(**{**CONFIG.__dict__, "fetch_image": "registry.example.com/python:3.12-slim"})
    deployment = manifests.build(target(), "ns", small)[0]
    init = deployment["spec"]["template"]["spec"]["initContainers"][0]
    assert init["image"] == "registry.example.com/python:3.12-slim"


def test_the_access_secret_holds_the_fetch_script_and_the_urls_and_goes_with_the_deployment() -> None:
    secret = manifests.access_secret(target(), "modelport-acme", FILES, ["pipeline/1"], "2026-12-01T10:00:00Z",
                                     owner_uid="uid-1")
    assert secret["metadata"]["name"] == "digits-r3-repository"
    assert secret["metadata"]["annotations"] == {"modelport.io/urls-expire-at": "2026-12-01T10:00:00Z"}
    assert secret["metadata"]["labels"]["app.kubernetes.io/component"] == "repository-access"
    assert secret["metadata"]["labels"]["modelport.io/revision"] == "3"
    assert manifests.is_managed(secret, "acme", "digits") and not manifests.is_managed(secret, "globex", "digits")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    data = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    assert data["fetch.py"] == manifests.FETCH_SCRIPT.read_text()
    assert json.loads(data["manifest.json"]) == {"format": 1, "revision": 3, "expires_at": "2026-12-01T10:00:00Z",
                                                 "files": FILES, "directories": ["pipeline/1"]}


def test_the_deployment_runs_triton_from_the_revisions_s3_prefix() -> None:
    deployment = manifests.build(target(), "modelport-acme", CONFIG)[0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "nvcr.io/nvidia/tritonserver:24.10-py3"
    assert container["command"] == ["tritonserver"]
    assert container["args"][0] == "--model-repository=/models"  # the init container's verified copy
    assert deployment["metadata"]["annotations"]["modelport.io/repository"] == (
        "s3://http://minio.storage.svc:9000/models/modelport/repositories/acme/digits-7/r3")
    assert "--model-control-mode=none" in container["args"] and "--strict-readiness=true" in container["args"]
    assert [p["containerPort"] for p in container["ports"]] == [8000, 8001, 8002]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= CONFIG.ready_timeout_seconds
    assert container["resources"] == {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
    assert pod["imagePullSecrets"] == [{"name": "ngc"}]
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    assert deployment["spec"]["replicas"] == 1


def test_the_packages_python_models_need_are_named_on_the_deployment_for_the_image_to_provide() -> None:
    """The cluster installs nothing: the operator's image must have them (docs/kubernetes.md)."""
    preprocess = model("preprocess", "python", definition={"requirements": ["pillow>=10", "numpy"]})
    postprocess = model("postprocess", "python", definition={"requirements": ["numpy", "tabulate"]})
    deployment = manifests.build(target(models=[model(), preprocess, postprocess]), "modelport-acme", CONFIG)[0]
    assert deployment["metadata"]["annotations"]["modelport.io/python-requirements"] == "numpy\npillow>=10\ntabulate"
    validate_everywhere(deployment)
    plain = manifests.build(target(), "modelport-acme", CONFIG)[0]
    assert "modelport.io/python-requirements" not in plain["metadata"]["annotations"]


def test_objects_carry_the_recommended_labels_and_the_selector_spans_revisions() -> None:
    objects = manifests.build(target(revision=3), "modelport-acme", CONFIG)
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "triton"
        assert labels["app.kubernetes.io/instance"] == "digits"
        assert labels["app.kubernetes.io/managed-by"] == "modelport"
        assert labels["app.kubernetes.io/version"] == "r3"
        assert obj["metadata"]["namespace"] == "modelport-acme"
    deployment = objects[0]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert "modelport.io/revision" not in selector  # immutable: the same for every revision
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert by_kind(objects)["Service"]["spec"]["selector"] == selector
    # Every object of the deployment (its canary's too, named apart), and those of one instance.
    assert manifests.managed_selector("acme", "digits") == (
        "app.kubernetes.io/name=triton,modelport.io/team=acme,app.kubernetes.io/managed-by=modelport,"
        "modelport.io/deployment=digits")
    assert manifests.instance_selector("acme", "digits", "digits") == (
        "app.kubernetes.io/name=triton,app.kubernetes.io/instance=digits,modelport.io/team=acme,"
        "app.kubernetes.io/managed-by=modelport,modelport.io/deployment=digits")


def test_a_canarys_objects_are_named_and_selected_apart_but_labelled_for_the_deployment() -> None:
    canary = manifests.Target(team="acme", name="digits-canary", revision=4, spec=target(revision=4).spec,
                              repository_key="k", deployment="digits")
    objects = manifests.build(canary, "modelport-acme", CONFIG)
    for obj in objects:
        assert obj["metadata"]["name"] == "digits-canary"
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "digits-canary"
        assert obj["metadata"]["labels"]["modelport.io/deployment"] == "digits"
    selector = objects[0]["spec"]["selector"]["matchLabels"]
    assert selector["app.kubernetes.io/instance"] == "digits-canary"  # not the serving pods
    assert by_kind(objects)["Service"]["spec"]["selector"] == selector
    too_long = manifests.Target(team="acme", name="d" * 57 + "-canary", revision=1, spec=canary.spec,
                                repository_key="k", deployment="d" * 57)
    assert "a canary on Kubernetes needs a deployment name of at most 56 characters" in \
        manifests.check(too_long, CONFIG)["name"][0]


def test_gpus_get_the_device_resource_a_node_selector_and_tolerations() -> None:
    deployment = manifests.build(target(resources={"gpu": 2, "gpu_type": "a100", "memory": "16Gi"}),
                                 "ns", CONFIG)[0]
    pod = deployment["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["limits"] == {"memory": "16Gi", "nvidia.com/gpu": "2"}
    assert resources["requests"]["nvidia.com/gpu"] == "2"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_a_mig_profile_asks_for_a_mig_slice_instead_of_a_whole_gpu() -> None:
    deployment = manifests.build(target(resources={"mig_profile": "1g.10gb"}), "ns", CONFIG)[0]
    limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"memory": "4Gi", "nvidia.com/mig-1g.10gb": "1"}


def test_an_unmapped_gpu_type_is_used_as_the_label_value() -> None:
    deployment = manifests.build(target(resources={"gpu": 1, "gpu_type": "NVIDIA-H100-80GB-HBM3"}), "ns", CONFIG)[0]
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_a_pod_disruption_budget_only_with_more_than_one_replica() -> None:
    assert "PodDisruptionBudget" not in by_kind(manifests.build(target(replicas=1), "ns", CONFIG))
    pdb = by_kind(manifests.build(target(replicas=2), "ns", CONFIG))["PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == manifests.selector_labels("acme", "digits")


def test_autoscaling_on_cpu_leaves_the_replica_count_to_the_hpa() -> None:
    objects = by_kind(manifests.build(target(autoscaling={"min_replicas": 2, "max_replicas": 5, "metric": "cpu",
                                                          "target": 70}), "ns", CONFIG))
    assert "replicas" not in objects["Deployment"]["spec"]
    hpa = objects["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "digits"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 5)
    assert hpa["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]
    assert "PodDisruptionBudget" in objects  # at least two pods at all times


def test_autoscaling_on_tritons_queue_time_uses_a_custom_pod_metric() -> None:
    hpa = by_kind(manifests.build(target(autoscaling={"min_replicas": 1, "max_replicas": 4, "metric": "queue_time",
                                                      "target": 5000}), "ns", CONFIG))["HorizontalPodAutoscaler"]
    assert hpa["spec"]["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": "triton_queue_time_us"}, "target": {"type": "AverageValue", "averageValue": "5000"}}}]


def test_the_network_policy_lets_only_the_gateway_reach_triton() -> None:
    policy = by_kind(manifests.build(target(), "modelport-acme", CONFIG))["NetworkPolicy"]["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    rule, worker = policy["ingress"]
    assert rule["from"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "modelport"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/component": "web", "app.kubernetes.io/name": "modelport"}},
    }]
    assert [p["port"] for p in rule["ports"]] == [8000, 8001, 8002]
    # The reconcile worker reads the statistics API for the performance panel: HTTP only, and not the inspection lane.
    assert worker["from"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "modelport"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/component": "worker",
                                        "app.kubernetes.io/name": "modelport"}},
    }]
    assert worker["ports"] == [{"protocol": "TCP", "port": 8000}]


def test_no_worker_labels_admit_no_worker() -> None:
    config = KubernetesConfig(**{**CONFIG.__dict__, "worker_pod_labels": ()})
    policy = by_kind(manifests.build(target(), "modelport-acme", config))["NetworkPolicy"]["spec"]
    assert [rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
            for rule in policy["ingress"]] == ["web"]


def test_the_network_policy_lets_triton_reach_dns_and_what_the_operator_lists_only() -> None:
    policy = by_kind(manifests.build(target(), "modelport-acme", CONFIG))["NetworkPolicy"]["spec"]
    assert policy["podSelector"] == {"matchLabels": manifests.selector_labels("acme", "digits")}
    assert policy["egress"] == [
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}],
         "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {"to": [{"ipBlock": {"cidr": "10.0.5.0/24"}}], "ports": [{"protocol": "TCP", "port": 9000}]},
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "storage"}}}],
         "ports": [{"protocol": "TCP", "port": 9000}]},
    ]
    # Nothing listed, no DNS namespace: the pods reach nothing at all (deny all egress).
    closed = KubernetesConfig(dns_namespace="", egress=())
    assert by_kind(manifests.build(target(), "ns", closed))["NetworkPolicy"]["spec"]["egress"] == []


@pytest.mark.parametrize(("entry", "rule"), [
    ("10.0.5.0/24:9000", {"to": [{"ipBlock": {"cidr": "10.0.5.0/24"}}], "ports": [{"protocol": "TCP", "port": 9000}]}),
    ("10.0.5.7/24", {"to": [{"ipBlock": {"cidr": "10.0.5.0/24"}}]}),  # all ports; host bits dropped
    ("169.254.20.10/32:53/udp", {"to": [{"ipBlock": {"cidr": "169.254.20.10/32"}}],
                                 "ports": [{"protocol": "UDP", "port": 53}]}),
    ("fd00::/8:9000", {"to": [{"ipBlock": {"cidr": "fd00::/8"}}], "ports": [{"protocol": "TCP", "port": 9000}]}),
    ("namespace=storage", {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "storage"}}}]}),
])
def test_egress_entries_become_network_policy_rules(entry: str, rule: dict[str, Any]) -> None:
    assert parse_egress(entry).to_policy() == rule


@pytest.mark.parametrize(("entry", "message"), [
    ("minio.storage.svc:9000", "is neither CIDR[:PORT[/PROTOCOL]]"),  # a NetworkPolicy cannot name hosts
    ("10.0.0.1", "is neither CIDR"),
    ("10.0.0.0/33:9000", "is not a CIDR block"),
    ("10.0.0.0/8:70000", "the port must be between 1 and 65535"),
    ("10.0.0.0/8:0", "the port must be between 1 and 65535"),
    ("10.0.0.0/8:53/icmp", "the protocol must be TCP, UDP or SCTP"),
    ("namespace=Storage_1", "is not a namespace name"),
    ("namespace=", "is neither"),
])
def test_bad_egress_entries_are_refused_saying_why(entry: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_egress(entry)


def test_namespaces_modelport_creates_enforce_the_restricted_standard() -> None:
    labels = manifests.namespace_object("modelport-acme")["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"


def test_owner_references_point_at_the_applied_deployment() -> None:
    objects = manifests.build(target(replicas=2), "ns", CONFIG, owner_uid="uid-1")
    assert "ownerReferences" not in objects[0]["metadata"]
    for obj in objects[1:]:
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "digits", "uid": "uid-1",
             "blockOwnerDeletion": True}]


def test_tnn_models_run_on_the_custom_backend_image_and_need_one() -> None:
    tnn = target(models=[model(fmt="tnn")])
    with pytest.raises(ManifestError) as caught:
        manifests.build(tnn, "ns", CONFIG)
    assert "KUBERNETES_TRITON_CUSTOM_IMAGE" in caught.value.errors["image"][0]
    config = KubernetesConfig(**{**CONFIG.__dict__, "custom_backend_image": "registry.example.com/triton-tnn:1"})
    container = manifests.build(tnn, "ns", config)[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/triton-tnn:1"


def test_it_refuses_gpu_instances_without_a_gpu_and_bad_quantities() -> None:
    errors = manifests.check(target(models=[model(instance_group={"count": 1, "kind": "gpu", "gpus": []})],
                                    resources={"memory": "lots"}), CONFIG)
    assert "instance_group kind 'gpu'" in errors["resources.gpu"][0]
    assert "'lots' is not a Kubernetes quantity" in errors["resources.memory"][0]


def test_the_repository_url_follows_tritons_s3_syntax() -> None:
    assert CONFIG.repository_url("p/r1/") == "s3://http://minio.storage.svc:9000/models/p/r1"
    https = KubernetesConfig(s3_bucket="b", s3_endpoint_url="https://s3.example.com")
    assert https.repository_url("p/r1/") == "s3://https://s3.example.com:443/b/p/r1"
    assert KubernetesConfig(s3_bucket="b").repository_url("p/r1/") == "s3://b/p/r1"  # AWS itself


def test_namespaces_follow_the_mapping_then_the_prefix_and_stay_dns_labels() -> None:
    config = KubernetesConfig(namespaces=(("acme", "ml-serving"),))
    assert config.namespace_for("acme") == "ml-serving"
    assert config.namespace_for("globex") == "modelport-globex"
    long = config.namespace_for("t" * 63)
    assert len(long) <= 63 and long.startswith("modelport-ttt")
    assert long == config.namespace_for("t" * 63)


def test_the_yaml_is_deterministic_multi_document_and_loads_back() -> None:
    objects = manifests.build(target(replicas=2), "modelport-acme", CONFIG)
    text = manifests.to_yaml(objects, ["a header"])
    assert text == manifests.to_yaml(manifests.build(target(replicas=2), "modelport-acme", CONFIG), ["a header"])
    assert text.startswith("# a header\n---\napiVersion: apps/v1\nkind: Deployment\n")
    assert list(yaml.safe_load_all(text)) == objects


def test_the_service_url_is_the_cluster_dns_name() -> None:
    assert manifests.service_url("digits", "modelport-acme", CONFIG) == \
        "http://digits.modelport-acme.svc.cluster.local:8000"
    other = KubernetesConfig(cluster_domain="corp.internal")
    assert manifests.service_url("digits", "ns", other) == "http://digits.ns.svc.corp.internal:8000"


AUTOSCALED: dict[str, Any] = {"autoscaling": {"min_replicas": 2, "max_replicas": 6, "metric": "cpu", "target": 70}}
QUEUE_RATIO = KubernetesConfig(**{**CONFIG.__dict__, "autoscaling": "queue-ratio-hpa",
                                  "autoscaling_target_ratio": 0.5})
KEDA = KubernetesConfig(**{**CONFIG.__dict__, "autoscaling": "keda", "autoscaling_target_ratio": 1.5,
                           "keda_prometheus_url": "http://prometheus.observability.svc:9090"})


def test_the_queue_ratio_hpa_scales_on_the_adapters_external_metric_whatever_the_deployments_metric() -> None:
    objects = by_kind(manifests.build(target(**AUTOSCALED), "modelport-acme", QUEUE_RATIO))
    hpa = objects["HorizontalPodAutoscaler"]
    validate_everywhere(hpa)
    assert hpa["metadata"]["name"] == "digits"  # the same object as the "hpa" setting's: a switch replaces it
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "digits"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert hpa["spec"]["metrics"] == [{"type": "External", "external": {
        "metric": {"name": "modelport_triton_queue_compute_ratio",
                   "selector": {"matchLabels": {"team": "acme", "deployment": "digits"}}},
        "target": {"type": "Value", "value": "0.5"}}}]
    assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 300}}
    assert "replicas" not in objects["Deployment"]["spec"] and "ScaledObject" not in objects


def test_a_canarys_queue_ratio_hpa_selects_the_deployments_ratio() -> None:
    canary = manifests.Target(team="acme", name="digits-canary", revision=4, deployment="digits",
                              spec=target(**AUTOSCALED).spec, repository_key="k/")
    hpa = by_kind(manifests.build(canary, "ns", QUEUE_RATIO))["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "digits-canary"
    assert hpa["metrics"][0]["external"]["metric"]["selector"]["matchLabels"]["deployment"] == "digits"


def test_keda_gets_a_scaled_object_on_the_same_ratio_and_no_hpa() -> None:
    objects = by_kind(manifests.build(target(**AUTOSCALED), "modelport-acme", KEDA))
    assert "HorizontalPodAutoscaler" not in objects and "replicas" not in objects["Deployment"]["spec"]
    scaled = objects["ScaledObject"]
    assert (scaled["apiVersion"], scaled["metadata"]["name"]) == ("keda.sh/v1alpha1", "digits")
    assert scaled["metadata"]["labels"] == objects["Deployment"]["metadata"]["labels"]
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "digits"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 6)
    [trigger] = spec["triggers"]
    assert trigger == {"type": "prometheus", "metricType": "Value", "metadata": {
        "serverAddress": "http://prometheus.observability.svc:9090",
        "query": 'max(modelport:triton_queue_compute:ratio1m{namespace="modelport-acme",team="acme",'
                 'deployment="digits"})',
        "threshold": "1.5", "activationThreshold": "0"}}
    assert "PodDisruptionBudget" in objects  # at least two pods, as with an HPA


def test_without_autoscaling_no_setting_renders_an_autoscaler() -> None:
    for config in (CONFIG, QUEUE_RATIO, KEDA):
        kinds = set(by_kind(manifests.build(target(replicas=2), "ns", config)))
        assert not kinds & {"HorizontalPodAutoscaler", "ScaledObject"}


def test_keda_without_a_prometheus_url_is_refused_when_the_deployment_autoscales() -> None:
    config = KubernetesConfig(**{**CONFIG.__dict__, "autoscaling": "keda"})
    with pytest.raises(ManifestError) as raised:
        manifests.build(target(**AUTOSCALED), "ns", config)
    assert "KUBERNETES_KEDA_PROMETHEUS_URL" in " ".join(raised.value.errors["autoscaling"])
    assert manifests.build(target(), "ns", config)  # without autoscaling nothing needs it


def test_promql_strings_are_quoted() -> None:
    assert manifests.queue_ratio_query("ns", 'a"b', "c\\d") == (
        'max(modelport:triton_queue_compute:ratio1m{namespace="ns",team="a\\"b",deployment="c\\\\d"})')


SCALES_TO_ZERO: dict[str, Any] = {"autoscaling": {"min_replicas": 0, "max_replicas": 4, "metric": "cpu", "target": 70}}


def test_scale_to_zero_renders_a_scaled_object_that_the_gateways_demand_activates() -> None:
    objects = by_kind(manifests.build(target(**SCALES_TO_ZERO), "modelport-acme", KEDA))
    spec = objects["ScaledObject"]["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (0, 4)
    assert spec["pollingInterval"] == manifests.ACTIVATION_POLL_SECONDS
    ratio, demand = spec["triggers"]
    assert ratio["metadata"]["activationThreshold"] == "0"
    assert demand == {"type": "prometheus", "metricType": "Value", "metadata": {
        "serverAddress": "http://prometheus.observability.svc:9090",
        "query": 'clamp_max((sum(rate(modelport_gateway_requests_total{team="acme",deployment="digits"}[2m])) '
                 'or vector(0)) + (sum(modelport_gateway_held_requests{team="acme",deployment="digits"}) '
                 'or vector(0)), 1)',
        # Clamped at 1 against 1: it activates (above 0) and never asks for more replicas than there are.
        "threshold": "1", "activationThreshold": "0"}}
    assert "annotations" not in objects["ScaledObject"]["metadata"]
    assert "PodDisruptionBudget" not in objects and "replicas" not in objects["Deployment"]["spec"]


def test_a_scale_to_zero_rollout_pauses_keda_at_its_replicas() -> None:
    paused = by_kind(manifests.build(target(**SCALES_TO_ZERO), "ns", KEDA, paused_replicas=2))["ScaledObject"]
    assert paused["metadata"]["annotations"] == {"autoscaling.keda.sh/paused-replicas": "2"}
    # A deployment that never goes to zero is never paused: KEDA keeps it at its minimum by itself.
    kept = by_kind(manifests.build(target(**AUTOSCALED), "ns", KEDA, paused_replicas=2))["ScaledObject"]
    assert "annotations" not in kept["metadata"] and len(kept["spec"]["triggers"]) == 1


def test_scale_to_zero_is_refused_unless_the_cluster_autoscales_with_keda() -> None:
    for config in (CONFIG, QUEUE_RATIO):
        with pytest.raises(ManifestError) as raised:
            manifests.build(target(**SCALES_TO_ZERO), "ns", config)
        [message] = raised.value.errors["autoscaling.min_replicas"]
        assert "KUBERNETES_AUTOSCALING=keda" in message and "never scales up from zero" in message
    assert manifests.scale_to_zero_refusal(target(**AUTOSCALED).spec, CONFIG) == ""
    assert manifests.scale_to_zero_refusal(target(**SCALES_TO_ZERO).spec, KEDA) == ""
