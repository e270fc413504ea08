"""platform/kubernetes: the manifests that run Modelport itself on Kubernetes.

No kustomize binary is needed: `build()` below renders a kustomization the way `kustomize build` does for the
features these files use (resources, namespace, images, strategic-merge patches), and every object it yields is
validated offline against the OpenAPI schemas of two Kubernetes versions. Whether the Role is enough (and no more
than enough) for what the runtime does is tested in test_k8s_isolation.py, against the fake API server.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from deployments.revision_spec import RevisionSpec
from deployments.runtimes.kubernetes.config import KubernetesConfig

PLATFORM = Path(__file__).resolve().parents[2] / "platform"
KUSTOMIZE = PLATFORM / "kubernetes"
KUBERNETES_VERSIONS = ("1.31", "1.33")
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
SUPPORTED = {"apiVersion", "kind", "namespace", "resources", "images", "patches"}


def _merge(base: Any, patch: Any) -> Any:
    """Strategic merge as kustomize applies it to these files: maps merge, lists of named items merge by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = _merge(base[key], value) if key in base else value
        return merged
    if isinstance(base, list) and isinstance(patch, list) and all(isinstance(i, dict) and "name" in i
                                                                  for i in base + patch):
        merged_list = list(base)
        for item in patch:
            index = next((i for i, old in enumerate(merged_list) if old["name"] == item["name"]), None)
            if index is None:
                merged_list.append(item)
            else:
                merged_list[index] = _merge(merged_list[index], item)
        return merged_list
    return patch


def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def build(directory: Path) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    assert not unknown, f"{directory}: the test's renderer does not implement {sorted(unknown)}"
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        objects += build(path) if path.is_dir() else _load(path)
    objects = copy.deepcopy(objects)
    for patch_entry in kustomization.get("patches", []):
        for patch in _load(directory / patch_entry["path"]):
            targets = [o for o in objects if (o["kind"], o["metadata"]["name"]) ==
                       (patch["kind"], patch["metadata"]["name"])]
            assert len(targets) == 1, f"patch {patch_entry['path']} matches {len(targets)} objects"
            targets[0].update(_merge(targets[0], patch))
    namespace = kustomization.get("namespace")
    for obj in objects:
        if namespace and obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = namespace
        if namespace and obj["kind"] == "Namespace":  # kustomize renames Namespace objects too
            obj["metadata"]["name"] = namespace
        if namespace and obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for subject in obj.get("subjects", []):
                if subject["name"] == "default":  # kustomize moves only subjects named "default"
                    subject["namespace"] = namespace
        for image in kustomization.get("images", []):
            pod = obj.get("spec", {}).get("template", {}).get("spec", {})
            for container in pod.get("containers", []) + pod.get("initContainers", []):
                if container["image"] == image["name"]:
                    container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return objects


def test_there_is_no_python_package_under_platform() -> None:
    assert list(PLATFORM.rglob("__init__.py")) == []


@pytest.mark.parametrize("directory", ["base", "overlays/example", "team-namespace", "cluster-wide"])
def test_every_object_validates_against_two_kubernetes_versions(directory: str) -> None:
    objects = build(KUSTOMIZE / directory)
    assert objects
    for obj in objects:
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                raise AssertionError(f"{directory}: {obj['kind']}/{obj['metadata']['name']} is invalid for "
                                     f"Kubernetes {version} at {where}: {exc.message}") from None


def test_every_yaml_file_is_used_by_a_kustomization() -> None:
    used: set[Path] = set()
    for kustomization in KUSTOMIZE.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kustomization.read_text())
        used.add(kustomization)
        used.update((kustomization.parent / entry).resolve() for entry in spec.get("resources", []))
        used.update((kustomization.parent / p["path"]).resolve() for p in spec.get("patches", []))
    assert sorted(p.resolve() for p in KUSTOMIZE.rglob("*.yaml")) == sorted(p for p in used if p.is_file())


def test_the_example_overlay_runs_web_worker_and_beat_from_the_built_image() -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in build(KUSTOMIZE / "overlays/example")}
    commands = {}
    for name in ("modelport-web", "modelport-worker", "modelport-beat"):
        deployment = objects[("Deployment", name)]
        assert deployment["metadata"]["namespace"] == "modelport"
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == "registry.example.com/modelport:0.1.0"
        assert {e["configMapRef"]["name"] for e in container["envFrom"] if "configMapRef" in e} == {"modelport-config"}
        assert {e["secretRef"]["name"] for e in container["envFrom"] if "secretRef" in e} == {"modelport-secrets"}
        commands[name] = container["command"]
    assert commands["modelport-worker"][:4] == ["celery", "-A", "portal", "worker"]
    assert commands["modelport-beat"][:4] == ["celery", "-A", "portal", "beat"]
    assert objects[("Deployment", "modelport-worker")]["spec"]["replicas"] == 2  # the overlay's patch
    assert objects[("Deployment", "modelport-beat")]["spec"]["strategy"] == {"type": "Recreate"}
    config = objects[("ConfigMap", "modelport-config")]["data"]
    assert config["KUBERNETES_IN_CLUSTER"] == "true" and config["S3_BUCKET"] == "modelport"
    assert config["MODELPORT_ENV"] == "production"  # the base's value survives the merge


def test_the_gateway_pods_are_the_ones_triton_lets_in() -> None:
    """The NetworkPolicy of every Triton deployment admits pods with KUBERNETES_GATEWAY_POD_LABELS in
    KUBERNETES_GATEWAY_NAMESPACE: the web pods must carry exactly those."""
    objects = {(o["kind"], o["metadata"]["name"]): o for o in build(KUSTOMIZE / "base")}
    web = objects[("Deployment", "modelport-web")]
    config = objects[("ConfigMap", "modelport-config")]["data"]
    labels = dict(pair.split("=") for pair in config["KUBERNETES_GATEWAY_POD_LABELS"].split(","))
    assert labels.items() <= web["spec"]["template"]["metadata"]["labels"].items()
    assert config["KUBERNETES_GATEWAY_NAMESPACE"] == web["metadata"]["namespace"]
    defaults = KubernetesConfig()
    assert dict(defaults.gateway_pod_labels) == labels and defaults.gateway_namespace == "modelport"


def test_the_reconcile_workers_pods_reach_tritons_http_port_and_the_inspection_lanes_do_not() -> None:
    """The performance panel's snapshot pass runs in the reconcile lane (infra/queues.py): the default
    KUBERNETES_WORKER_POD_LABELS select those pods of worker.yaml, and no pod of a lane that runs uploaded code."""
    from deployments.runtimes.kubernetes import manifests
    from infra.queues import ROUTES, Queue

    assert ROUTES["performance.tasks.take_snapshots"] == {"queue": Queue.RECONCILE}
    labels = dict(KubernetesConfig().worker_pod_labels)
    workers = {o["metadata"]["name"]: o for o in build(KUSTOMIZE / "base")
               if o["kind"] == "Deployment" and "worker" in o["metadata"]["name"]}
    admitted = {name for name, obj in workers.items()
                if labels.items() <= obj["spec"]["template"]["metadata"]["labels"].items()}
    assert admitted == {"modelport-worker"}
    command = workers["modelport-worker"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("-Q") + 1] == "reconcile"
    assert "modelport-worker-inspection" in workers
    spec = RevisionSpec.from_json({"runtime": "kubernetes", "replicas": 1, "resources": {}, "models": [{
        "name": "digits", "model": "digits", "version": 1, "format": "onnx", "max_batch_size": 8,
        "instance_group": {"count": 1, "kind": "cpu", "gpus": []}, "response_cache": False}]})
    target = manifests.Target(team="acme", name="digits", revision=1, repository_key="p/r1/", spec=spec)
    policy = {o["kind"]: o for o in manifests.build(target, "modelport-acme", KubernetesConfig())}["NetworkPolicy"]
    [worker_rule] = [rule for rule in policy["spec"]["ingress"]
                     if rule["from"][0].get("podSelector", {}).get("matchLabels") == labels]
    assert worker_rule["ports"] == [{"protocol": "TCP", "port": manifests.HTTP_PORT}]


def rules_of(directory: str, kind: str) -> set[tuple[str, str, str]]:
    [role] = [o for o in build(KUSTOMIZE / directory) if o["kind"] == kind]
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_no_cluster_wide_permission_unless_the_operator_adds_it() -> None:
    for directory in ("base", "overlays/example"):
        kinds = {o["kind"] for o in build(KUSTOMIZE / directory)}
        assert not kinds & {"ClusterRole", "ClusterRoleBinding"}, directory
    # The opt-in grants the namespaced Role's rules everywhere, plus creating namespaces; nothing else.
    cluster = rules_of("cluster-wide", "ClusterRole")
    namespaced = rules_of("team-namespace", "Role")
    assert cluster - namespaced == {("", "namespaces", "get"), ("", "namespaces", "create"),
                                    ("", "namespaces", "patch")}
    assert namespaced <= cluster
    assert base_config()["KUBERNETES_CREATE_NAMESPACES"] == "false"


def base_config() -> dict[str, str]:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in build(KUSTOMIZE / "base")}
    return objects[("ConfigMap", "modelport-config")]["data"]  # type: ignore[no-any-return]


def test_each_team_namespace_binds_the_role_to_modelports_account_there_only() -> None:
    objects = build(KUSTOMIZE / "overlays/example")
    for team in ("acme", "globex", "pools"):  # pools: KUBERNETES_POOL_NAMESPACE, where the open pools run
        namespace = f"modelport-{team}"
        [ns] = [o for o in objects if o["kind"] == "Namespace" and o["metadata"]["name"] == namespace]
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        [binding] = [o for o in objects if o["kind"] == "RoleBinding" and o["metadata"]["namespace"] == namespace]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "modelport"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "modelport", "namespace": "modelport"}]
        [role] = [o for o in objects if o["kind"] == "Role" and o["metadata"]["namespace"] == namespace]
        assert role["metadata"]["name"] == "modelport"
    assert {o["metadata"]["namespace"] for o in objects if o["kind"] == "Deployment"} == {"modelport"}
    assert {o["metadata"]["namespace"] for o in objects if o["kind"] == "Ingress"} == {"modelport"}


def test_only_the_pods_that_call_the_kubernetes_api_get_a_token() -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in build(KUSTOMIZE / "base")}
    assert objects[("ServiceAccount", "modelport")]["automountServiceAccountToken"] is False
    pods = {name: objects[("Deployment", name)]["spec"]["template"]["spec"]
            for name in ("modelport-web", "modelport-worker", "modelport-beat")}
    assert pods["modelport-web"]["automountServiceAccountToken"] is True  # DELETE and logs act at once
    assert pods["modelport-worker"]["automountServiceAccountToken"] is True
    assert pods["modelport-beat"]["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pods["modelport-beat"]
    for name in ("modelport-web", "modelport-worker"):
        assert pods[name]["serviceAccountName"] == "modelport"


def test_modelports_own_pods_run_restricted() -> None:
    objects = build(KUSTOMIZE / "base")
    [namespace] = [o for o in objects if o["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod.get("initContainers", []) + pod["containers"]:
            assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                    "capabilities": {"drop": ["ALL"]}}


def test_the_example_lets_triton_reach_its_s3_endpoint() -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in build(KUSTOMIZE / "overlays/example")}
    config = objects[("ConfigMap", "modelport-config")]["data"]
    assert config["S3_ENDPOINT_URL"] == "http://minio.storage.svc.cluster.local:9000"
    assert config["KUBERNETES_TRITON_EGRESS"] == "namespace=storage:9000"  # MinIO's namespace and port


def test_the_grpc_gateway_runs_beside_the_web_server_in_the_pods_triton_lets_in() -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in build(KUSTOMIZE / "overlays/example")}
    pod = objects[("Deployment", "modelport-web")]["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    grpc = containers["grpc"]
    assert grpc["image"] == containers["web"]["image"] == "registry.example.com/modelport:0.1.0"
    assert grpc["command"] == ["python", "manage.py", "grpc_gateway", "--host", "0.0.0.0", "--port", "8001",
                               "--metrics-port", "8002"]
    assert grpc["envFrom"] == containers["web"]["envFrom"]
    assert grpc["readinessProbe"]["grpc"] == {"port": 8001}  # grpc.health.v1, which the gateway answers
    service = objects[("Service", "modelport-web")]
    assert {"name": "grpc", "port": 8001, "targetPort": "grpc", "protocol": "TCP",
            "appProtocol": "kubernetes.io/h2c"} in service["spec"]["ports"]
    ingress = objects[("Ingress", "modelport-grpc")]
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPC"
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "modelport-web", "port": {"name": "grpc"}}
    config = objects[("ConfigMap", "modelport-config")]["data"]
    assert config["GATEWAY_GRPC_PUBLIC_ADDRESS"] == "grpc.modelport.example.com:443"


def test_triton_serves_grpc_to_the_pods_where_the_grpc_gateway_runs() -> None:
    """What the gRPC gateway forwards to on Kubernetes (Deployment.grpc_upstream): the Triton Service's grpc port,
    which the Triton NetworkPolicy opens to the web pods, where the gateway's container runs."""
    from deployments.runtimes.kubernetes import manifests

    config = KubernetesConfig()
    spec = RevisionSpec.from_json({"runtime": "kubernetes", "replicas": 1, "resources": {}, "models": [{
        "name": "digits", "model": "digits", "version": 1, "format": "onnx", "max_batch_size": 8,
        "instance_group": {"count": 1, "kind": "cpu", "gpus": []}, "response_cache": False}]})
    target = manifests.Target(team="acme", name="digits", revision=1, repository_key="p/r1/", spec=spec)
    triton = {o["kind"]: o for o in manifests.build(target, "modelport-acme", config)}
    assert manifests.service_grpc_target("digits", "modelport-acme", config) == (
        f"{triton['Service']['metadata']['name']}.modelport-acme.svc.cluster.local:8001")
    assert {"name": "grpc", "port": 8001, "targetPort": "grpc", "protocol": "TCP"} in triton["Service"]["spec"]["ports"]
    [rule] = triton["NetworkPolicy"]["spec"]["ingress"][:1]
    assert {"protocol": "TCP", "port": 8001} in rule["ports"]
    admitted = rule["from"][0]["podSelector"]["matchLabels"]
    web = {(o["kind"], o["metadata"]["name"]): o for o in build(KUSTOMIZE / "base")}[("Deployment", "modelport-web")]
    assert admitted.items() <= web["spec"]["template"]["metadata"]["labels"].items()
    assert "grpc" in {c["name"] for c in web["spec"]["template"]["spec"]["containers"]}
