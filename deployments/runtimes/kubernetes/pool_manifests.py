"""The Kubernetes objects of a shared pool (issue 24): pure functions of the pool and the config, like manifests.py.

A pool is one Kubernetes Deployment of Triton in explicit model-control mode (with Service, PodDisruptionBudget,
HorizontalPodAutoscaler and NetworkPolicy), whose every pod has two containers:

- `triton`, which starts with no model, reads the repository emptyDir read-only, and holds no S3 key and no
  service account token; its repository API is restricted to the pool's admin key;
- `pool-agent` (pool_agent.py, standard library only), which alone mounts the pool's loads Secret (one entry per
  revision, with presigned URLs), fetches each revision's files into the emptyDir with their sha256 checked, and
  loads and unloads them through Triton's repository API on localhost.

Both run with the dedicated pods' security (manifests.CONTAINER_SECURITY, non-root, RuntimeDefault seccomp); the
NetworkPolicy admits the gateway and lets the pod reach DNS and the operator's egress list (the S3 endpoint).
What each pod gets of the GPUs is the pool's share class (deployments.pool_models.GpuShare).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from deployments.runtimes.kubernetes import manifests, pool_agent
from deployments.runtimes.kubernetes.config import KubernetesConfig
from modelport.core.quantity import QuantityError, parse_quantity

APP_NAME = "triton-pool"
LABEL_POOL = "modelport.io/pool"
AGENT_CONTAINER = "pool-agent"
LOADS_DIR = "/etc/modelport/loads"
AGENT_DIR = "/etc/modelport/agent"
AGENT_STATE_DIR = "/run/modelport"
AGENT_READY_FILE = f"{AGENT_STATE_DIR}/ready"
# The agent's code, and what Triton's container runs from the same ConfigMap: its start script, which puts the stub
# wrapper in the python backend's place (pool_triton.sh, pool_stub.py).
AGENT_SCRIPTS = tuple(Path(__file__).with_name(name) for name in (
    "pool_agent.py", "fetch_repository.py", "pool_stub.py", "pool_triton.sh"))
# Each model's memory limit, one file per model written by the agent (read-only in Triton's container), and each
# model instance's peak resident memory, written by the generated models (read-only in the agent's).
LIMITS_DIR = "/run/modelport-limits"
USAGE_DIR = "/run/modelport-usage"
BACKEND_DIR = "/run/modelport-backends"  # the backend directory pool_triton.sh assembles
ADMIN_KEY_ENV = pool_agent.ADMIN_KEY_ENV
ADMIN_KEY_FIELD = "admin-key"
HPA_CPU_UTILIZATION = 80
# Triton's admin APIs that only the agent may call (what the dedicated local servers restrict too).
RESTRICTED_APIS = ("model-repository", "logging", "trace", "shared-memory")
ADMIN_HEADER = pool_agent.ADMIN_HEADER


@dataclass(frozen=True)
class PoolTarget:
    """What to render: one pool, as the operator set it (deployments.pool_models.Pool)."""

    name: str
    team: str  # "" for a pool open to every team
    memory_budget_bytes: int
    gpu_requests: tuple[tuple[str, str], ...] = ()  # the extended resources each pod requests
    gpu_node_selector: tuple[tuple[str, str], ...] = ()
    gpu_load_fraction: Decimal | None = None
    gpu_count: int = 0
    min_replicas: int = 1
    max_replicas: int = 1

    @property
    def object_name(self) -> str:
        return f"pool-{self.name}"


def labels(target: PoolTarget) -> dict[str, str]:
    found = {**selector_labels(target), "app.kubernetes.io/managed-by": manifests.MANAGED_BY,
             "app.kubernetes.io/part-of": "modelport"}
    if target.team:
        found[manifests.LABEL_TEAM] = target.team
    return found


def selector_labels(target: PoolTarget) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/instance": target.object_name,
            LABEL_POOL: target.name}


def pool_selector(target: PoolTarget) -> str:
    return ",".join(f"{k}={v}" for k, v in labels(target).items())


def is_managed(obj: Mapping[str, Any], target: PoolTarget) -> bool:
    """Whether `obj` is one Modelport made for this pool (and so may be applied over, or edited)."""
    theirs = (obj.get("metadata") or {}).get("labels") or {}
    return all(theirs.get(key) == value for key, value in labels(target).items())


def loads_secret_name(target: PoolTarget) -> str:
    return f"{target.object_name}-loads"


def admin_secret_name(target: PoolTarget) -> str:
    return f"{target.object_name}-admin"


def agent_config_map_name(target: PoolTarget) -> str:
    return f"{target.object_name}-agent"


def entry_key(deployment_id: int, revision: int) -> str:
    """The loads Secret's key of one revision (the agent's revision key, and its model names' prefix)."""
    return f"d{deployment_id}-r{revision}.json"


def _metadata(target: PoolTarget, namespace: str, name: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name or target.object_name, "namespace": namespace, "labels": labels(target), **extra}


def triton_args(target: PoolTarget, config: KubernetesConfig) -> list[str]:
    args = [
        f"--model-repository={manifests.REPOSITORY_DIR}",
        # Nothing is loaded at start: the agent loads each revision when its files are in place.
        "--model-control-mode=explicit",
        # One deployment's model failing to load must not make the pod unready for every other team.
        "--strict-readiness=false",
        "--exit-on-error=false",
        "--disable-auto-complete-config",
        f"--http-port={manifests.HTTP_PORT}",
        f"--grpc-port={manifests.GRPC_PORT}",
        f"--metrics-port={manifests.METRICS_PORT}",
        f"--exit-timeout-secs={manifests.EXIT_TIMEOUT_SECONDS}",
        # The key comes from the admin Secret through the environment (the kubelet expands $(VAR) in args).
        f"--http-restricted-api={','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}=$({ADMIN_KEY_ENV})",
        f"--grpc-restricted-protocol={','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}=$({ADMIN_KEY_ENV})",
    ]
    if target.gpu_load_fraction is not None and target.gpu_count:
        # Triton refuses a load that would take more than this fraction of a GPU's memory (per GPU the pod sees).
        args += [f"--model-load-gpu-limit={device}:{target.gpu_load_fraction:f}" for device in range(target.gpu_count)]
    if config.pod_traces_url:
        # Its spans name each model by its pool name (docs/pools.md), as a local pool's do.
        args += manifests.trace_args(config.pod_traces_url, {"modelport.pool": target.name})
    return args


def _admin_key_env(target: PoolTarget) -> dict[str, Any]:
    return {"name": ADMIN_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": admin_secret_name(target),
                                                                  "key": ADMIN_KEY_FIELD}}}


def pool_deployment(target: PoolTarget, namespace: str, config: KubernetesConfig) -> dict[str, Any]:
    memory = str(target.memory_budget_bytes + _OVERHEAD_BYTES)
    key_env = _admin_key_env(target)
    requests: dict[str, str] = {"cpu": config.default_cpu, "memory": memory}
    limits: dict[str, str] = {"memory": memory}
    for resource, count in target.gpu_requests:
        requests[resource] = limits[resource] = count
    triton: dict[str, Any] = {
        "name": manifests.CONTAINER,
        "image": config.pool_triton_image,
        "imagePullPolicy": "IfNotPresent",
        # The start script runs tritonserver with these arguments, every model's stub confined (pool_stub.py).
        "command": ["sh", f"{AGENT_DIR}/pool_triton.sh"],
        "args": triton_args(target, config),
        "ports": [
            {"name": "http", "containerPort": manifests.HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": manifests.GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": manifests.METRICS_PORT, "protocol": "TCP"},
        ],
        "env": [{"name": "HOME", "value": "/tmp"}, key_env, *confinement_env(config), *manifests.trace_env(config)],
        "resources": {"requests": requests, "limits": limits},
        "startupProbe": _probe("/v2/health/live", manifests.STARTUP_PERIOD_SECONDS, 30),
        "readinessProbe": _probe("/v2/health/ready", 5, 3),
        "livenessProbe": _probe("/v2/health/live", 15, 4),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(manifests.PRESTOP_SLEEP_SECONDS)]}}},
        "securityContext": dict(manifests.CONTAINER_SECURITY),
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
            # Read-only: what is loaded is what the agent verified.
            {"name": "repository", "mountPath": manifests.REPOSITORY_DIR, "readOnly": True},
            {"name": "agent", "mountPath": AGENT_DIR, "readOnly": True},
            # Read-only: a model's limit is the agent's to write, never its own.
            {"name": "limits", "mountPath": LIMITS_DIR, "readOnly": True},
            {"name": "usage", "mountPath": USAGE_DIR},
            {"name": "backends", "mountPath": BACKEND_DIR},
        ],
    }
    agent: dict[str, Any] = {
        "name": AGENT_CONTAINER,
        "image": config.init_image,
        "imagePullPolicy": "IfNotPresent",
        # -I: no user site, no PYTHON* variables, no current directory on the path.
        "command": ["python3", "-I", f"{AGENT_DIR}/pool_agent.py", "--desired", LOADS_DIR,
                    "--repository", manifests.REPOSITORY_DIR, "--triton", f"http://127.0.0.1:{manifests.HTTP_PORT}",
                    "--max-revision-bytes", str(target.memory_budget_bytes),
                    "--max-file-bytes", str(target.memory_budget_bytes), "--ready-file", AGENT_READY_FILE,
                    "--limits-dir", LIMITS_DIR, "--usage-dir", USAGE_DIR],
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}, key_env],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        # A pod is Ready (in the Service) only once its agent has loaded what the loads Secret listed when it
        # started: a pod the autoscaler adds never answers "unknown model" for what the other pods serve.
        "readinessProbe": {"exec": {"command": ["cat", AGENT_READY_FILE]}, "periodSeconds": 5,
                           "failureThreshold": 1},
        "securityContext": dict(manifests.CONTAINER_SECURITY),
        "volumeMounts": [
            {"name": "agent-state", "mountPath": AGENT_STATE_DIR},
            {"name": "repository", "mountPath": manifests.REPOSITORY_DIR},
            {"name": "loads", "mountPath": LOADS_DIR, "readOnly": True},
            {"name": "agent", "mountPath": AGENT_DIR, "readOnly": True},
            {"name": "limits", "mountPath": LIMITS_DIR},
            {"name": "usage", "mountPath": USAGE_DIR, "readOnly": True},
        ],
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # neither container talks to the Kubernetes API
        "enableServiceLinks": False,
        "securityContext": manifests.pod_security_context(),
        "terminationGracePeriodSeconds": manifests.EXIT_TIMEOUT_SECONDS + manifests.PRESTOP_SLEEP_SECONDS + 10,
        "containers": [triton, agent],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": config.shm_size}},
            {"name": "tmp", "emptyDir": {"sizeLimit": config.tmp_size}},
            # The files of the loaded revisions: no bigger than the pool's memory budget (a model's file is no
            # bigger than what it takes loaded); the kubelet evicts a pod that writes more.
            {"name": "repository", "emptyDir": {"sizeLimit": str(target.memory_budget_bytes)}},
            # Only the agent mounts it: Triton's container never sees the URLs.
            {"name": "loads", "secret": {"secretName": loads_secret_name(target), "defaultMode": 0o440}},
            {"name": "agent", "configMap": {"name": agent_config_map_name(target), "defaultMode": 0o444}},
            {"name": "agent-state", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            {"name": "limits", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            {"name": "usage", "emptyDir": {"medium": "Memory", "sizeLimit": "4Mi"}},
            {"name": "backends", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        ],
    }
    if config.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in config.image_pull_secrets]
    if target.gpu_node_selector:
        pod_spec["nodeSelector"] = dict(target.gpu_node_selector)
    if target.gpu_requests and config.gpu_tolerations:
        pod_spec["tolerations"] = [{"key": key, "operator": "Exists", "effect": "NoSchedule"}
                                   for key in config.gpu_tolerations]
    spec: dict[str, Any] = {}
    if target.max_replicas <= target.min_replicas:
        spec["replicas"] = target.min_replicas
    spec.update({
        "revisionHistoryLimit": 3,
        "selector": {"matchLabels": selector_labels(target)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "template": {
            "metadata": {"labels": labels(target), "annotations": {
                "prometheus.io/scrape": "true", "prometheus.io/port": str(manifests.METRICS_PORT)}},
            "spec": pod_spec,
        },
    })
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _metadata(target, namespace), "spec": spec}


def confinement_env(config: KubernetesConfig) -> list[dict[str, str]]:
    """What Triton's container passes to every model's stub: where its limit is (pool_stub.py), where it reports its
    peak, the answer bound, and the cores a model's threads share (the pod's CPU request: a framework starting a
    thread per core of the node would map a stack per thread past its memory limit, and fight over the CPU)."""
    return [
        {"name": "MODELPORT_MODEL_LIMITS_DIR", "value": LIMITS_DIR},
        {"name": "MODELPORT_REPOSITORY", "value": manifests.REPOSITORY_DIR},
        {"name": "MODELPORT_USAGE_DIR", "value": USAGE_DIR},
        {"name": "MODELPORT_MAX_OUTPUT_BYTES", "value": str(config.pool_max_output_bytes)},
        {"name": "MODELPORT_CPUS", "value": str(_cores(config.default_cpu))},
    ]


def _cores(quantity: str) -> int:
    try:
        return max(1, math.ceil(parse_quantity(quantity)))
    except QuantityError:
        return 1


_OVERHEAD_BYTES = 512 * 1024**2  # Triton itself and the agent's share of the pod, above the models' budget


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "timeoutSeconds": 5,
            "failureThreshold": failures}


def pool_service(target: PoolTarget, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(target, namespace),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(target),
            "ports": [
                {"name": "http", "port": manifests.HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "grpc", "port": manifests.GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
                {"name": "metrics", "port": manifests.METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def pool_disruption_budget(target: PoolTarget, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(target, namespace),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(target)}},
    }


def pool_autoscaler(target: PoolTarget, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(target, namespace),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target.object_name},
            "minReplicas": target.min_replicas,
            "maxReplicas": target.max_replicas,
            "metrics": [{"type": "Resource", "resource": {
                "name": "cpu", "target": {"type": "Utilization", "averageUtilization": HPA_CPU_UTILIZATION}}}],
        },
    }


def pool_network_policy(target: PoolTarget, namespace: str, config: KubernetesConfig) -> dict[str, Any]:
    return manifests.triton_network_policy(_metadata(target, namespace), selector_labels(target), config)


def agent_config_map(target: PoolTarget, namespace: str) -> dict[str, Any]:
    """The agent's code (no secret in it): the agent and the fetch checks it shares with the init container."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _metadata(target, namespace, agent_config_map_name(target)),
            "data": {path.name: path.read_text() for path in AGENT_SCRIPTS}}


def admin_secret(target: PoolTarget, namespace: str, key: str) -> dict[str, Any]:
    """The key of the pool Triton's repository API, shared by its two containers (made once, kept after)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _metadata(target, namespace, admin_secret_name(target)),
            "data": {ADMIN_KEY_FIELD: base64.b64encode(key.encode()).decode()}}


def loads_secret(target: PoolTarget, namespace: str, entries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The pool's loads Secret: one key per revision to be loaded (entry_key), as the agent reads them."""
    data = {key: base64.b64encode(json.dumps(entry, sort_keys=True).encode()).decode()
            for key, entry in sorted(entries.items())}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _metadata(target, namespace, loads_secret_name(target)), "data": data}


def load_entry(revision_key: str, models: list[str], files: list[dict[str, Any]], directories: list[str],
               expires_at: str, memory_limits: Mapping[str, int] | None = None) -> dict[str, Any]:
    """One revision's entry: its model names in load order, its files with presigned URLs, and the memory limit of
    each process of each model that runs in processes of its own (pool_stub.py)."""
    return {"format": 1, "revision": revision_key, "models": models, "files": files,
            "directories": sorted(directories), "expires_at": expires_at,
            "memory_limits": dict(sorted((memory_limits or {}).items()))}


def build(target: PoolTarget, namespace: str, config: KubernetesConfig) -> list[dict[str, Any]]:
    """The pool's serving objects: Deployment, Service, [PodDisruptionBudget], [HPA], NetworkPolicy, and the
    agent's ConfigMap (the Secrets are written by the runtime: the admin key once, the loads at every change)."""
    objects = [pool_deployment(target, namespace, config), pool_service(target, namespace)]
    if target.min_replicas > 1:
        objects.append(pool_disruption_budget(target, namespace))
    if target.max_replicas > target.min_replicas:
        objects.append(pool_autoscaler(target, namespace))
    objects.append(pool_network_policy(target, namespace, config))
    objects.append(agent_config_map(target, namespace))
    return objects


def service_url(target: PoolTarget, namespace: str, config: KubernetesConfig) -> str:
    return manifests.service_url(target.object_name, namespace, config)


def service_grpc_target(target: PoolTarget, namespace: str, config: KubernetesConfig) -> str:
    return manifests.service_grpc_target(target.object_name, namespace, config)
