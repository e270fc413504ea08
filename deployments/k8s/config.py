"""The Kubernetes runtime's settings as one frozen dataclass, so that the manifest builder and the runtime take
plain values (and tests build a config without Django settings)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

FIELD_MANAGER = "modelport"
# The Triton image runs as this user (triton-server in NVIDIA's images).
TRITON_UID = 1000


@dataclass(frozen=True)
class KubernetesConfig:
    kubeconfig: str = ""
    context: str = ""
    in_cluster: bool = False
    namespaces: tuple[tuple[str, str], ...] = ()  # team -> namespace
    namespace_prefix: str = "modelport-"
    create_namespaces: bool = True
    image: str = "nvcr.io/nvidia/tritonserver:24.10-py3"
    custom_backend_image: str = ""
    tnn_backend_name: str = "tnn"
    image_pull_secrets: tuple[str, ...] = ()
    s3_endpoint_url: str = ""
    s3_bucket: str = ""
    s3_prefix: str = "modelport/repositories"
    s3_region: str = "us-east-1"
    s3_access_key_id: str = ""
    s3_secret_access_key: str = field(default="", repr=False)
    s3_secret_name: str = "modelport-s3"
    default_cpu: str = "1"
    default_memory: str = "4Gi"
    shm_size: str = "1Gi"
    gpu_node_label: str = "nvidia.com/gpu.product"
    gpu_types: tuple[tuple[str, str], ...] = ()
    gpu_tolerations: tuple[str, ...] = ("nvidia.com/gpu",)
    gateway_namespace: str = "modelport"
    gateway_pod_labels: tuple[tuple[str, str], ...] = (
        ("app.kubernetes.io/name", "modelport"), ("app.kubernetes.io/component", "web"))
    metrics_namespace: str = ""
    queue_time_metric: str = "triton_queue_time_us"
    cluster_domain: str = "cluster.local"
    ready_timeout_seconds: int = 1800
    unschedulable_grace_seconds: int = 120
    response_cache_bytes: int = 64 * 1024**2

    @classmethod
    def from_settings(cls, settings: Any) -> KubernetesConfig:
        return cls(
            kubeconfig=settings.KUBERNETES_KUBECONFIG,
            context=settings.KUBERNETES_CONTEXT,
            in_cluster=settings.KUBERNETES_IN_CLUSTER,
            namespaces=tuple(sorted(settings.KUBERNETES_NAMESPACES.items())),
            namespace_prefix=settings.KUBERNETES_NAMESPACE_PREFIX,
            create_namespaces=settings.KUBERNETES_CREATE_NAMESPACES,
            image=settings.KUBERNETES_TRITON_IMAGE,
            custom_backend_image=settings.KUBERNETES_TRITON_CUSTOM_IMAGE,
            tnn_backend_name=settings.KUBERNETES_TNN_BACKEND_NAME,
            image_pull_secrets=tuple(settings.KUBERNETES_IMAGE_PULL_SECRETS),
            s3_endpoint_url=settings.KUBERNETES_S3_ENDPOINT_URL,
            s3_bucket=settings.KUBERNETES_S3_BUCKET,
            s3_prefix=settings.KUBERNETES_S3_PREFIX.strip("/"),
            s3_region=settings.KUBERNETES_S3_REGION,
            s3_access_key_id=settings.KUBERNETES_S3_ACCESS_KEY_ID,
            s3_secret_access_key=settings.KUBERNETES_S3_SECRET_ACCESS_KEY,
            s3_secret_name=settings.KUBERNETES_S3_SECRET,
            default_cpu=settings.KUBERNETES_DEFAULT_CPU,
            default_memory=settings.KUBERNETES_DEFAULT_MEMORY,
            shm_size=settings.KUBERNETES_SHM_SIZE,
            gpu_node_label=settings.KUBERNETES_GPU_NODE_LABEL,
            gpu_types=tuple(sorted(settings.KUBERNETES_GPU_TYPES.items())),
            gpu_tolerations=tuple(settings.KUBERNETES_GPU_TOLERATIONS),
            gateway_namespace=settings.KUBERNETES_GATEWAY_NAMESPACE,
            gateway_pod_labels=tuple(sorted(settings.KUBERNETES_GATEWAY_POD_LABELS.items())),
            metrics_namespace=settings.KUBERNETES_METRICS_NAMESPACE,
            queue_time_metric=settings.KUBERNETES_QUEUE_TIME_METRIC,
            cluster_domain=settings.KUBERNETES_CLUSTER_DOMAIN,
            ready_timeout_seconds=settings.KUBERNETES_READY_TIMEOUT_SECONDS,
            unschedulable_grace_seconds=settings.KUBERNETES_UNSCHEDULABLE_GRACE_SECONDS,
            response_cache_bytes=settings.TRITON_RESPONSE_CACHE_BYTES,
        )

    def namespace_for(self, team: str) -> str:
        mapped = dict(self.namespaces).get(team)
        if mapped:
            return mapped
        name = f"{self.namespace_prefix}{team}"
        if len(name) > 63:  # a namespace is a DNS label: shorten it, keeping it unique with a hash
            name = f"{name[:54].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
        return name

    def gpu_label_value(self, gpu_type: str) -> str:
        return dict(self.gpu_types).get(gpu_type, gpu_type)

    # --- What is missing -------------------------------------------------------------------------------------

    @property
    def cluster_configured(self) -> bool:
        return self.in_cluster or bool(self.kubeconfig)

    @property
    def s3_configured(self) -> bool:
        return bool(self.s3_bucket)

    @property
    def s3_credentials(self) -> bool:
        """Whether the worker has S3 keys to write into the namespace's Secret for Triton."""
        return bool(self.s3_access_key_id and self.s3_secret_access_key)

    def cluster_problem(self) -> str | None:
        if self.in_cluster:
            if not os.environ.get("KUBERNETES_SERVICE_HOST"):
                return ("KUBERNETES_IN_CLUSTER is true but this process does not run in a Kubernetes pod "
                        "(KUBERNETES_SERVICE_HOST is not set): run the worker in the cluster, or set KUBECONFIG instead.")
            return None
        if not self.kubeconfig:
            return ("No Kubernetes cluster is configured: set KUBECONFIG to a kubeconfig file, or run the worker "
                    "in-cluster with KUBERNETES_IN_CLUSTER=true (see docs/kubernetes.md).")
        return None

    def s3_problem(self) -> str | None:
        if not self.s3_configured:
            return ("S3 for model repositories is not configured: Triton in the cluster loads the model repository "
                    "from S3, so set KUBERNETES_S3_BUCKET (or S3_BUCKET), and S3_ENDPOINT_URL, S3_ACCESS_KEY_ID and "
                    "S3_SECRET_ACCESS_KEY for an S3-compatible store such as MinIO (see docs/kubernetes.md).")
        return None

    def problems(self) -> list[str]:
        return [p for p in (self.cluster_problem(), self.s3_problem()) if p]

    # --- Where repositories live ---------------------------------------------------------------------------

    def repository_url(self, key_prefix: str) -> str:
        """The --model-repository URL Triton loads `key_prefix` of the bucket from.

        Triton's S3 syntax names a non-AWS endpoint inside the URL, always with a port:
        s3://http://minio.example:9000/bucket/prefix; for AWS itself it is s3://bucket/prefix.
        """
        bucket = self.s3_bucket or "s3-bucket-not-configured"
        path = f"{bucket}/{key_prefix.strip('/')}"
        if not self.s3_endpoint_url:
            return f"s3://{path}"
        parts = urlsplit(self.s3_endpoint_url)
        scheme = parts.scheme or "https"
        port = parts.port or (443 if scheme == "https" else 80)
        return f"s3://{scheme}://{parts.hostname}:{port}/{path}"
