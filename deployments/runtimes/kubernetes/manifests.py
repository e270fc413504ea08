"""The Kubernetes objects that serve one deployment revision: pure functions of the revision and the config.

The same objects are applied by the worker (server-side apply) and exported for GitOps users
(GET /api/v1/deployments/{name}/manifests), so they are deterministic: same revision and config, same YAML.
Every object carries the labels that `managed_selector()` finds again, so that deletion removes all of them.

Triton runs code that team members upload, so its pod holds nothing it does not need (docs/security.md): no S3
key and no service account token; an init container fetches the revision's files through presigned GET URLs
from the revision's access Secret into an emptyDir, verifying each sha256, and Triton reads that directory
read-only; the pod runs as non-root with a read-only root filesystem, no capabilities and RuntimeDefault seccomp;
its NetworkPolicy admits only the gateway (and the reconcile worker on the HTTP port) and lets it reach DNS and the
destinations the operator lists.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deployments.revision_spec import Autoscaling, Resources, RevisionSpec
from deployments.runtimes.kubernetes.config import TRITON_UID, KubernetesConfig
from modelport.core import formats, quantity

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
CONTAINER = "triton"
APP_NAME = "triton"
MANAGED_BY = "modelport"
LABEL_TEAM = "modelport.io/team"
LABEL_DEPLOYMENT = "modelport.io/deployment"
LABEL_REVISION = "modelport.io/revision"
ANNOTATION_REPOSITORY = "modelport.io/repository"
# The packages the revision's python models list in requirements.txt, one per line: what the Triton image must have
# (docs/kubernetes.md, "Python models' requirements"); `kubectl describe` shows it beside a pod's ImportError.
ANNOTATION_PYTHON_REQUIREMENTS = "modelport.io/python-requirements"
ANNOTATION_URLS_EXPIRE = "modelport.io/urls-expire-at"
LABEL_COMPONENT = "app.kubernetes.io/component"
ACCESS_COMPONENT = "repository-access"
INIT_CONTAINER = "fetch-repository"
REPOSITORY_DIR = "/models"  # what Triton loads: the init container's verified copy, mounted read-only
ACCESS_DIR = "/etc/modelport/repository"  # the access Secret: manifest.json and fetch.py
FETCH_SCRIPT = Path(__file__).with_name("fetch_repository.py")
# Seconds Triton gets to finish in-flight requests after SIGTERM; the pod's grace period is longer.
EXIT_TIMEOUT_SECONDS = 30
PRESTOP_SLEEP_SECONDS = 5  # endpoints drop the pod before Triton stops accepting requests
STARTUP_PERIOD_SECONDS = 10

# A label value, checked with fullmatch: with match(), "$" also matches before a trailing newline.
_LABEL_VALUE_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


class ManifestError(ValueError):
    """The revision cannot be turned into manifests; `errors` maps spec fields to messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{key}: {' '.join(messages)}" for key, messages in sorted(errors.items())))


@dataclass(frozen=True)
class Target:
    """What to render: one revision of one deployment."""

    team: str
    name: str
    revision: int
    spec: RevisionSpec
    repository_key: str  # the S3 key prefix of the revision's model repository
    # The Modelport deployment's name when the objects are named otherwise: a canary's are `{name}-canary`, a
    # Deployment and Service of their own beside the serving ones (the gateway splits the requests).
    deployment: str = ""

    @property
    def deployment_name(self) -> str:
        return self.deployment or self.name

    @property
    def replicas(self) -> int:
        return self.spec.replicas

    @property
    def autoscaling(self) -> Autoscaling | None:
        return self.spec.autoscaling


# --- Names and labels ---------------------------------------------------------------------------------------

def selector_labels(team: str, name: str) -> dict[str, str]:
    """The pods of a deployment (every revision): the Deployment's selector and the Service's."""
    return {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/instance": name, LABEL_TEAM: team}


CANARY_SUFFIX = "-canary"


def canary_name(name: str) -> str:
    """The objects of a deployment's canary (a Deployment, Service, ... of their own)."""
    return name + CANARY_SUFFIX


def managed_labels(team: str, name: str, instance: str | None = None) -> dict[str, str]:
    """The labels of the objects of deployment `name` named `instance` (default: `name`; its canary's:
    canary_name(name))."""
    return {**selector_labels(team, instance or name), "app.kubernetes.io/managed-by": MANAGED_BY,
            LABEL_DEPLOYMENT: name}


def managed_selector(team: str, name: str) -> str:
    """A label selector for every object Modelport made for the deployment, its canary's included."""
    labels = managed_labels(team, name)
    del labels["app.kubernetes.io/instance"]
    return ",".join(f"{k}={v}" for k, v in labels.items())


def instance_selector(team: str, name: str, instance: str) -> str:
    """The objects of one instance of the deployment (the serving one's, or its canary's)."""
    return ",".join(f"{k}={v}" for k, v in managed_labels(team, name, instance).items())


def revision_selector(team: str, name: str, revision: int) -> str:
    return ",".join(f"{k}={v}" for k, v in {**selector_labels(team, name), LABEL_REVISION: str(revision)}.items())


def labels(target: Target) -> dict[str, str]:
    return {
        **managed_labels(target.team, target.deployment_name, target.name),
        "app.kubernetes.io/version": f"r{target.revision}",
        "app.kubernetes.io/part-of": "modelport",
        LABEL_REVISION: str(target.revision),
    }


def access_secret_name(name: str, revision: int) -> str:
    """The Secret holding a revision's presigned URLs (one per revision: a rollback or a restarting pod of the
    previous revision still finds its own)."""
    return f"{name}-r{revision}-repository"


def access_selector(team: str, name: str) -> str:
    return f"{managed_selector(team, name)},{LABEL_COMPONENT}={ACCESS_COMPONENT}"


def is_managed(obj: Mapping[str, Any], team: str, name: str, instance: str | None = None) -> bool:
    """Whether `obj` is one Modelport made for deployment `name` of `team` (and so may be applied over)."""
    theirs = (obj.get("metadata") or {}).get("labels") or {}
    return all(theirs.get(key) == value for key, value in managed_labels(team, name, instance).items())


def service_url(target_name: str, namespace: str, config: KubernetesConfig) -> str:
    """What the gateway proxies to: the Service's cluster DNS name."""
    return f"http://{target_name}.{namespace}.svc.{config.cluster_domain}:{HTTP_PORT}"


def service_grpc_target(target_name: str, namespace: str, config: KubernetesConfig) -> str:
    """What the gRPC gateway forwards to: the same Service's gRPC port (host:port, as grpc channels take it)."""
    return f"{target_name}.{namespace}.svc.{config.cluster_domain}:{GRPC_PORT}"


# --- Checks -------------------------------------------------------------------------------------------------


def image_for(target: Target, config: KubernetesConfig) -> str:
    if target.spec.image:
        return target.spec.image
    if any(formats.get(m.format).native.custom for m in target.spec.models):
        return config.custom_backend_image
    return config.image


def check(target: Target, config: KubernetesConfig) -> dict[str, list[str]]:
    """Why the revision cannot run on the cluster as configured (empty when it can)."""
    errors: dict[str, list[str]] = {}

    def add(key: str, message: str) -> None:
        errors.setdefault(key, []).append(message)

    if not image_for(target, config):
        add("image", "TNN models need a Triton image with the TNN backend: set KUBERNETES_TRITON_CUSTOM_IMAGE "
                     "to such an image (built FROM the Triton image), or give the deployment an image")
    resources = target.spec.resources
    for key, bounds in (("cpu", quantity.CPU), ("memory", quantity.MEMORY)):
        value = getattr(resources, key)
        if value:
            try:
                quantity.check_quantity(str(value), bounds)
            except quantity.QuantityError as exc:
                add(f"resources.{key}", str(exc))
    gpu_type = resources.gpu_type
    if gpu_type:
        value = config.gpu_label_value(gpu_type)
        if len(value) > 63 or not _LABEL_VALUE_RE.fullmatch(value):
            add("resources.gpu_type", f"{gpu_type!r} is not a node label value: use letters, digits, '-', '_' "
                                      "or '.' (or map it in KUBERNETES_GPU_TYPES)")
    if any(m.instance_group.kind == "gpu" for m in target.spec.models) and not _gpu_request(resources):
        add("resources.gpu", "a model runs on GPU (instance_group kind 'gpu') but the deployment asks for no GPU: "
                             "set resources.gpu (or mig_profile), or use kind 'cpu'")
    autoscaling = target.autoscaling
    if autoscaling and autoscaling.min_replicas > autoscaling.max_replicas:
        add("autoscaling.max_replicas", "max_replicas must be at least min_replicas")
    refusal = scale_to_zero_refusal(target.spec, config)
    if refusal:
        add("autoscaling.min_replicas", refusal)
    if autoscaling and config.autoscaling == "keda" and not config.keda_prometheus_url:
        add("autoscaling", "this cluster autoscales with KEDA (KUBERNETES_AUTOSCALING=keda) but "
                           "KUBERNETES_KEDA_PROMETHEUS_URL is empty: an operator must set it to the Prometheus that "
                           "records the queue-to-compute ratio, or the deployment must do without autoscaling")
    if len(target.name) > 63:  # a Service's name is a DNS label
        add("name", f"the objects of this revision would be named {target.name!r}, over Kubernetes' 63 characters: "
                    f"a canary on Kubernetes needs a deployment name of at most {63 - len(CANARY_SUFFIX)} characters")
    return errors


def scale_to_zero_refusal(spec: RevisionSpec, config: KubernetesConfig) -> str:
    """Why this cluster cannot scale `spec` to zero ("" when it does not ask to, or can). Only KEDA activates a
    Deployment from zero replicas: an HPA never scales one at zero up (and refuses minReplicas 0 unless the cluster
    enables the HPAScaleToZero feature gate), so min_replicas 0 with an HPA would stay down for good."""
    autoscaling = spec.autoscaling
    if autoscaling is None or not autoscaling.scales_to_zero or config.autoscaling == "keda":
        return ""
    return (f"min_replicas 0 (scale to zero) needs KEDA, which starts a pod when a request comes, but this cluster "
            f"autoscales with {config.autoscaling!r} (KUBERNETES_AUTOSCALING), whose HorizontalPodAutoscaler never "
            "scales up from zero: use min_replicas 1 or more, or ask the operator for KUBERNETES_AUTOSCALING=keda")


# --- The objects --------------------------------------------------------------------------------------------


def build(target: Target, namespace: str, config: KubernetesConfig, *,
          owner_uid: str | None = None, paused_replicas: int | None = None) -> list[dict[str, Any]]:
    """The namespaced objects serving `target`: Deployment, Service, [PodDisruptionBudget], [HPA or KEDA
    ScaledObject], NetworkPolicy.

    `owner_uid` (the applied Deployment's uid) adds owner references to the others, so Kubernetes' garbage
    collector removes them with the Deployment. `paused_replicas`: a scale-to-zero ScaledObject's pause during a
    rollout (scaled_object). Raises ManifestError.
    """
    errors = check(target, config)
    if errors:
        raise ManifestError(errors)
    objects = [deployment(target, namespace, config), service(target, namespace)]
    autoscaling = target.autoscaling
    lowest = autoscaling.min_replicas if autoscaling else target.replicas
    if lowest > 1:
        objects.append(pod_disruption_budget(target, namespace))
    if autoscaling:
        objects.append(scaled_object(target, namespace, config, paused_replicas) if config.autoscaling == "keda"
                       else horizontal_pod_autoscaler(target, namespace, config))
    objects.append(network_policy(target, namespace, config))
    if owner_uid:
        for obj in objects[1:]:
            obj["metadata"]["ownerReferences"] = [owner_reference(target.name, owner_uid)]
    return objects


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    """Makes an object go with the Deployment `name` (Kubernetes' garbage collector deletes it then)."""
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": uid, "blockOwnerDeletion": True}


def _metadata(target: Target, namespace: str, **extra: Any) -> dict[str, Any]:
    return {"name": target.name, "namespace": namespace, "labels": labels(target), **extra}


def _gpu_request(resources: Resources) -> tuple[str, int] | None:
    """(resource name, count): a MIG slice ("nvidia.com/mig-1g.10gb") or whole GPUs."""
    gpu = resources.gpu
    mig = resources.mig_profile
    if mig:
        return f"nvidia.com/mig-{mig}", max(gpu, 1)
    if gpu:
        return "nvidia.com/gpu", gpu
    return None


def _resources(target: Target, config: KubernetesConfig) -> dict[str, Any]:
    resources = target.spec.resources
    cpu = resources.cpu or config.default_cpu
    memory = resources.memory or config.default_memory
    # No CPU limit (throttling adds latency spikes); a memory limit equal to the request, so that a model that
    # needs more is OOMKilled with a clear message instead of starving its neighbours.
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    limits: dict[str, str] = {"memory": memory}
    gpu = _gpu_request(resources)
    if gpu:
        requests[gpu[0]] = limits[gpu[0]] = str(gpu[1])
    return {"requests": requests, "limits": limits}


def triton_args(target: Target, config: KubernetesConfig) -> list[str]:
    args = [
        f"--model-repository={REPOSITORY_DIR}",
        # The repository is complete when the pod starts and never changes: load everything, never poll.
        "--model-control-mode=none",
        "--strict-readiness=true",
        "--exit-on-error=true",
        "--disable-auto-complete-config",
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        f"--metrics-port={METRICS_PORT}",
        f"--exit-timeout-secs={EXIT_TIMEOUT_SECONDS}",
    ]
    if any(m.response_cache for m in target.spec.models):
        args.append(f"--cache-config=local,size={config.response_cache_bytes}")
    if config.pod_traces_url:
        args += trace_args(config.pod_traces_url, {"modelport.deployment": target.deployment_name,
                                                   "modelport.revision": str(target.revision)})
    return args


# The pod's own name, for its spans' resource (the kubelet expands $(VAR) in args from the container's env).
POD_NAME_ENV = "MODELPORT_POD_NAME"
POD_NAMESPACE_ENV = "MODELPORT_POD_NAMESPACE"


def trace_args(url: str, resource: Mapping[str, str]) -> list[str]:
    """Triton's OpenTelemetry tracing in a pod, as the local runtime's (deployments/runtimes/local/triton.py): the
    requests that carry a traceparent traced (rate 0; the gateway sends one for its sampled spans only), with the
    timestamps that split queue from compute, to the portal's collector; the spans' resource says which pod of which
    deployment sent them.
    Triton's trace API stays an admin API no caller reaches."""
    attributes = {"k8s.namespace.name": f"$({POD_NAMESPACE_ENV})", "k8s.pod.name": f"$({POD_NAME_ENV})",
                  **resource}
    args = ["--trace-config", "mode=opentelemetry", "--trace-config", "rate=0", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", f"opentelemetry,url={url}"]
    for key, value in attributes.items():
        args += ["--trace-config", f"opentelemetry,resource={key}={value}"]
    return args


def trace_env(config: KubernetesConfig) -> list[dict[str, Any]]:
    """The container's env that trace_args() reads (none when the pods are untraced)."""
    if not config.pod_traces_url:
        return []
    return [{"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": POD_NAMESPACE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]


# What every container of a Triton pod runs with: the "restricted" Pod Security Standard, and a root filesystem
# nothing can write to (what must be written goes to an emptyDir).
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
}


def init_container(target: Target, config: KubernetesConfig) -> dict[str, Any]:
    """Fetches the revision's repository through the presigned URLs of its access Secret, verifying each file."""
    return {
        "name": INIT_CONTAINER,
        "image": config.init_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", f"{ACCESS_DIR}/fetch.py", f"{ACCESS_DIR}/manifest.json", REPOSITORY_DIR],
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": dict(CONTAINER_SECURITY),
        "volumeMounts": [
            {"name": "repository", "mountPath": REPOSITORY_DIR},
            {"name": "repository-access", "mountPath": ACCESS_DIR, "readOnly": True},
        ],
    }


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "timeoutSeconds": 5,
            "failureThreshold": failures}


def pod_security_context() -> dict[str, Any]:
    """Every Triton pod's (dedicated and pool): non-root as Triton's user, the runtime's default seccomp profile."""
    return {"runAsNonRoot": True, "runAsUser": TRITON_UID, "runAsGroup": TRITON_UID, "fsGroup": TRITON_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def deployment(target: Target, namespace: str, config: KubernetesConfig) -> dict[str, Any]:
    repository = config.repository_url(target.repository_key)
    resources = target.spec.resources
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image_for(target, config),
        "imagePullPolicy": "IfNotPresent",
        "command": ["tritonserver"],
        "args": triton_args(target, config),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        # The root filesystem is read-only: libraries that keep caches under $HOME write to the /tmp emptyDir.
        "env": [{"name": "HOME", "value": "/tmp"}, *trace_env(config)],
        "resources": _resources(target, config),
        # Big models take minutes to download from S3 and load: the startup probe allows the whole ready
        # timeout before liveness starts counting.
        "startupProbe": _probe("/v2/health/ready", STARTUP_PERIOD_SECONDS,
                               max(1, math.ceil(config.ready_timeout_seconds / STARTUP_PERIOD_SECONDS))),
        "readinessProbe": _probe("/v2/health/ready", 5, 3),
        "livenessProbe": _probe("/v2/health/live", 15, 4),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_SECONDS)]}}},
        "securityContext": dict(CONTAINER_SECURITY),
        "volumeMounts": [
            # The python backend passes tensors through shared memory; the container default (64 MiB) is too small.
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
            # Read-only: uploaded model code cannot change what it serves, nor what a restart loads.
            {"name": "repository", "mountPath": REPOSITORY_DIR, "readOnly": True},
        ],
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # Triton never talks to the Kubernetes API
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": EXIT_TIMEOUT_SECONDS + PRESTOP_SLEEP_SECONDS + 10,
        "initContainers": [init_container(target, config)],
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": config.shm_size}},
            {"name": "tmp", "emptyDir": {"sizeLimit": config.tmp_size}},
            {"name": "repository", "emptyDir": {}},
            # Only the init container mounts it; Triton's container never sees the URLs.
            {"name": "repository-access", "secret": {"secretName": access_secret_name(target.name, target.revision),
                                                     "defaultMode": 0o440}},
        ],
    }
    if config.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in config.image_pull_secrets]
    if resources.gpu_type:
        pod_spec["nodeSelector"] = {config.gpu_node_label: config.gpu_label_value(resources.gpu_type)}
    if _gpu_request(resources) and config.gpu_tolerations:
        pod_spec["tolerations"] = [{"key": key, "operator": "Exists", "effect": "NoSchedule"}
                                   for key in config.gpu_tolerations]

    spec: dict[str, Any] = {}
    if not target.autoscaling:  # with an HPA, the HPA owns the replica count
        spec["replicas"] = target.replicas
    spec.update({
        "revisionHistoryLimit": 3,
        "progressDeadlineSeconds": config.ready_timeout_seconds + 60,
        "selector": {"matchLabels": selector_labels(target.team, target.name)},
        # Zero downtime: a new pod must be ready before an old one goes.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "template": {
            "metadata": {
                "labels": labels(target),
                "annotations": {
                    ANNOTATION_REPOSITORY: repository,
                    "prometheus.io/scrape": "true",
                    "prometheus.io/port": str(METRICS_PORT),
                },
            },
            "spec": pod_spec,
        },
    })
    annotations = {ANNOTATION_REPOSITORY: repository}
    requirements = sorted({line for entry in target.spec.models for line in entry.requirements})
    if requirements:
        annotations[ANNOTATION_PYTHON_REQUIREMENTS] = "\n".join(requirements)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(target, namespace, annotations=annotations),
        "spec": spec,
    }


def service(target: Target, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(target, namespace),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(target.team, target.name),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def pod_disruption_budget(target: Target, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(target, namespace),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(target.team, target.name)}},
    }


# NVIDIA's reference autoscaling signal, time queued over time computing (platform/observability: the recording rule,
# and the Prometheus Adapter's external metric served from it), for KUBERNETES_AUTOSCALING queue-ratio-hpa and keda.
QUEUE_RATIO_SERIES = "modelport:triton_queue_compute:ratio1m"
QUEUE_RATIO_METRIC = "modelport_triton_queue_compute_ratio"
# A ratio swings with each batch: scale up at once, down only after five quiet minutes.
SCALE_DOWN_WINDOW_SECONDS = 300
KEDA_API_VERSION = "keda.sh/v1alpha1"
KEDA_KIND = "ScaledObject"


def _promql_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def queue_ratio_query(namespace: str, team: str, deployment: str) -> str:
    """The deployment's queue-to-compute ratio in PromQL: the largest of its models' and revisions' (the busiest model
    of a pipeline decides; a canary's pods count with the serving ones), as the adapter's rule serves it."""
    matchers = ",".join(f"{key}={_promql_string(value)}" for key, value in (
        ("namespace", namespace), ("team", team), ("deployment", deployment)))
    return f"max({QUEUE_RATIO_SERIES}{{{matchers}}})"


def _target_ratio(config: KubernetesConfig) -> str:
    return f"{config.autoscaling_target_ratio:g}"


def horizontal_pod_autoscaler(target: Target, namespace: str, config: KubernetesConfig) -> dict[str, Any]:
    autoscaling = target.autoscaling
    assert autoscaling is not None
    target_value = autoscaling.target
    behavior: dict[str, Any] | None = None
    if config.autoscaling == "queue-ratio-hpa":
        # The operator's choice over the deployment's metric and target: the deployment's ratio (Value, not
        # AverageValue: it is the deployment's, not a sum over its pods), selected by the labels the scrape gives it.
        metric: dict[str, Any] = {"type": "External", "external": {
            "metric": {"name": QUEUE_RATIO_METRIC, "selector": {"matchLabels": {
                "team": target.team, "deployment": target.deployment_name}}},
            "target": {"type": "Value", "value": _target_ratio(config)},
        }}
        behavior = {"scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW_SECONDS}}
    elif autoscaling.metric == "queue_time":
        # Triton's queue time per request, in microseconds, per pod: a Prometheus adapter rule exposes it as a
        # custom metric (docs/kubernetes.md).
        metric = {"type": "Pods", "pods": {
            "metric": {"name": config.queue_time_metric},
            "target": {"type": "AverageValue", "averageValue": str(target_value)},
        }}
    else:
        metric = {"type": "Resource", "resource": {
            "name": "cpu", "target": {"type": "Utilization", "averageUtilization": target_value},
        }}
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target.name},
        "minReplicas": autoscaling.min_replicas,
        "maxReplicas": autoscaling.max_replicas,
        "metrics": [metric],
    }
    if behavior:
        spec["behavior"] = behavior
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(target, namespace),
        "spec": spec,
    }


# Scale to zero: how often KEDA asks Prometheus whether a deployment at zero has a request waiting (KEDA's default is
# 30 s; a held request waits this, plus a scrape of the gateway, plus its pod's start).
ACTIVATION_POLL_SECONDS = 5
# The gateway's own series (gateway/stats.py): requests answered, and requests held for a deployment scaled to zero.
GATEWAY_REQUESTS_SERIES = "modelport_gateway_requests_total"
GATEWAY_HELD_SERIES = "modelport_gateway_held_requests"
# KEDA's annotation that holds a ScaledObject's target at this many replicas and stops autoscaling it (KEDA 2.8+).
KEDA_PAUSED_REPLICAS = "autoscaling.keda.sh/paused-replicas"


def demand_query(team: str, deployment: str) -> str:
    """Whether the deployment is wanted, in PromQL, between 0 and 1: its requests over the last two minutes and the
    requests the gateway holds for it while it is at zero, clamped at 1. KEDA activates it (0 to 1) above 0 and keeps
    it while it stays above 0, for the cooldown after; at 1 against a threshold of 1 it never asks for more replicas
    than there are (the queue-to-compute ratio does that). The gateway's series carry no Kubernetes namespace (the
    portal's pods export them): team and deployment are the gateway's own labels, never a caller's words."""
    matchers = ",".join(f"{key}={_promql_string(value)}" for key, value in (("team", team),
                                                                             ("deployment", deployment)))
    return (f"clamp_max((sum(rate({GATEWAY_REQUESTS_SERIES}{{{matchers}}}[2m])) or vector(0)) + "
            f"(sum({GATEWAY_HELD_SERIES}{{{matchers}}}) or vector(0)), 1)")


def scaled_object(target: Target, namespace: str, config: KubernetesConfig,
                  paused_replicas: int | None = None) -> dict[str, Any]:
    """KUBERNETES_AUTOSCALING=keda: a KEDA ScaledObject with a Prometheus trigger on the deployment's queue-to-compute
    ratio, read from Prometheus directly (no adapter). KEDA makes the HPA itself (keda-hpa-<name>, with these
    labels: the runtime leaves it to KEDA).

    min_replicas 0 (scale to zero) adds a second trigger on the gateway's demand (demand_query), polled every
    ACTIVATION_POLL_SECONDS: the queue ratio has no series while no pod runs, so it could never activate the
    deployment; a request the gateway holds does. `paused_replicas` (a rollout of such a deployment) holds it at that
    many replicas until the new revision is ready: KEDA would otherwise scale the rollout's pod back to zero before
    it could be verified (KubernetesRuntime.observe lifts the pause)."""
    autoscaling = target.autoscaling
    assert autoscaling is not None
    triggers: list[dict[str, Any]] = [{
        "type": "prometheus",
        "metricType": "Value",
        "metadata": {
            "serverAddress": config.keda_prometheus_url,
            "query": queue_ratio_query(namespace, target.team, target.deployment_name),
            "threshold": _target_ratio(config),
            "activationThreshold": "0",
        },
    }]
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target.name},
        "minReplicaCount": autoscaling.min_replicas,
        "maxReplicaCount": autoscaling.max_replicas,
        "cooldownPeriod": SCALE_DOWN_WINDOW_SECONDS,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
            "scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW_SECONDS}}}},
        "triggers": triggers,
    }
    metadata = _metadata(target, namespace)
    if autoscaling.scales_to_zero:
        spec["pollingInterval"] = ACTIVATION_POLL_SECONDS
        triggers.append({
            "type": "prometheus",
            "metricType": "Value",
            "metadata": {
                "serverAddress": config.keda_prometheus_url,
                "query": demand_query(target.team, target.deployment_name),
                "threshold": "1",
                "activationThreshold": "0",
            },
        })
        if paused_replicas is not None:
            metadata["annotations"] = {KEDA_PAUSED_REPLICAS: str(paused_replicas)}
    return {"apiVersion": KEDA_API_VERSION, "kind": KEDA_KIND, "metadata": metadata, "spec": spec}


def network_policy(target: Target, namespace: str, config: KubernetesConfig) -> dict[str, Any]:
    return triton_network_policy(_metadata(target, namespace), selector_labels(target.team, target.name), config)


def triton_network_policy(metadata: dict[str, Any], pod_labels: dict[str, str],
                          config: KubernetesConfig) -> dict[str, Any]:
    """The NetworkPolicy of a Triton pod, a deployment's or a pool's: its ports open only to the gateway (its HTTP
    port also to the reconcile worker, and the metrics port to the metrics namespace)."""
    ports = [{"protocol": "TCP", "port": port} for port in (HTTP_PORT, GRPC_PORT, METRICS_PORT)]
    ingress: list[dict[str, Any]] = [{
        "from": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": config.gateway_namespace}},
            "podSelector": {"matchLabels": dict(config.gateway_pod_labels)},
        }],
        "ports": ports,
    }]
    if config.worker_pod_labels:
        # The reconcile worker's snapshot pass (performance/snapshots.py) reads GET /v2/models/stats: HTTP only, and
        # from the lane that runs no uploaded code (docs/security.md, "Network").
        ingress.append({
            "from": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": config.gateway_namespace}},
                "podSelector": {"matchLabels": dict(config.worker_pod_labels)},
            }],
            "ports": [{"protocol": "TCP", "port": HTTP_PORT}],
        })
    if config.metrics_namespace:
        ingress.append({
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": config.metrics_namespace}}}],
            "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
        })
    # Egress: nothing but DNS and what the operator lists (the S3 endpoint, for the init container or a pool's
    # agent; a NetworkPolicy holds for every container of the pod). Uploaded code reaches no portal, database or
    # other team.
    egress: list[dict[str, Any]] = []
    if config.dns_namespace:
        egress.append({
            "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": config.dns_namespace}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        })
    egress += [rule.to_policy() for rule in config.egress]
    if config.pod_traces_url and config.trace_egress is not None:
        # The collector, on its port only (config.trace_problem() refuses a rule without it): Triton's spans.
        egress.append(config.trace_egress.to_policy())
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": {"matchLabels": pod_labels},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }


def namespace_object(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/managed-by": MANAGED_BY,
                # Triton's pods meet the "restricted" Pod Security Standard; nothing less runs here.
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
                "pod-security.kubernetes.io/audit": "restricted",
                "pod-security.kubernetes.io/warn": "restricted",
            },
        },
    }


@dataclass(frozen=True)
class TeamCeilings:
    """An operator's ceilings for a team's namespace (deployments/ceilings.py), as Kubernetes quantities; "" or 0:
    none. The portal refuses what is above them when a revision is planned; the cluster holds them too."""

    max_memory: str = ""  # per container
    max_cpu: str = ""
    total_memory: str = ""  # the namespace's sum of limits.memory
    total_cpu: str = ""  # the sum of requests.cpu
    total_gpus: int = 0
    total_pods: int = 0


QUOTA_NAME = "modelport-team-ceilings"


def ceiling_objects(namespace: str, team: str, ceilings: TeamCeilings) -> list[dict[str, Any]]:
    """The team namespace's ResourceQuota (its totals) and LimitRange (each container's maximum): none of either
    when the operator set none. Every container Modelport makes sets limits.memory and requests.cpu, as a quota
    on them requires."""
    metadata = {"name": QUOTA_NAME, "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": MANAGED_BY, LABEL_TEAM: team}}
    hard = {key: value for key, value in (
        ("limits.memory", ceilings.total_memory), ("requests.cpu", ceilings.total_cpu),
        ("requests.nvidia.com/gpu", str(ceilings.total_gpus) if ceilings.total_gpus else ""),
        ("pods", str(ceilings.total_pods) if ceilings.total_pods else "")) if value}
    maximum = {key: value for key, value in (("memory", ceilings.max_memory), ("cpu", ceilings.max_cpu)) if value}
    objects: list[dict[str, Any]] = []
    if hard:
        objects.append({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": metadata, "spec": {"hard": hard}})
    if maximum:
        objects.append({"apiVersion": "v1", "kind": "LimitRange", "metadata": dict(metadata),
                        "spec": {"limits": [{"type": "Container", "max": maximum}]}})
    return objects


def access_secret(target: Target, namespace: str, files: list[dict[str, Any]], directories: Iterable[str],
                  expires_at: str, *, owner_uid: str | None = None) -> dict[str, Any]:
    """The revision's access Secret: the fetch script and the manifest with a presigned GET URL per file.

    A Secret rather than the init container's args or a ConfigMap: pod specs and ConfigMaps are readable by
    anyone with the namespace's "view" role and end up in `kubectl describe` and audit logs, while the URLs are
    read credentials; and a Secret's content can be renewed without changing the pod template (no rollout),
    the kubelet mounting the current one into every new or retried init container. Never exported."""
    manifest = {"format": 1, "revision": target.revision, "expires_at": expires_at, "files": files,
                "directories": sorted(directories)}
    data = {"manifest.json": json.dumps(manifest, sort_keys=True), "fetch.py": FETCH_SCRIPT.read_text()}
    metadata = _metadata(target, namespace, annotations={ANNOTATION_URLS_EXPIRE: expires_at})
    metadata["name"] = access_secret_name(target.name, target.revision)
    metadata["labels"][LABEL_COMPONENT] = ACCESS_COMPONENT
    if owner_uid:
        metadata["ownerReferences"] = [owner_reference(target.name, owner_uid)]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()},
    }


def to_yaml(objects: Iterable[Mapping[str, Any]], header: Iterable[str] = ()) -> str:
    """A multi-document YAML stream, each document introduced by "---"; `header` lines become comments."""
    lines = "".join(f"# {line}\n" if line else "#\n" for line in header)
    return lines + "".join("---\n" + yaml.safe_dump(dict(obj), sort_keys=False, default_flow_style=False)
                           for obj in objects)
