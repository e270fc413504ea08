"""The Kubernetes runtime's settings as one frozen dataclass, so that the manifest builder and the runtime take
plain values (and tests build a config without Django settings)."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from infra import tracing

FIELD_MANAGER = "modelport"
# The Triton image runs as this user (triton-server in NVIDIA's images).
TRITON_UID = 1000

_DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# An optional ":port" or ":port/protocol" after the peer of a rule.
_PORT_SUFFIX = r"(?::(?P<port>[0-9]{1,5})(?:/(?P<protocol>[A-Za-z]+))?)?"
_CIDR_RULE_RE = re.compile(r"(?P<cidr>[0-9A-Fa-f.:]+/[0-9]{1,3})" + _PORT_SUFFIX)
_NAMESPACE_RULE_RE = re.compile(r"namespace=(?P<namespace>[^:/]+)" + _PORT_SUFFIX)


class NamespaceRefused(ValueError):
    """A team's namespace that Modelport will not use (it says why, and what the operator must change)."""


@dataclass(frozen=True)
class EgressRule:
    """A destination Triton's pods may connect to besides DNS: an IP block or every pod of a namespace, on one
    port (or all ports). Written in KUBERNETES_TRITON_EGRESS as "10.0.5.0/24:9000", "10.1.2.3/32:443/TCP",
    "namespace=storage:9000" or "192.168.0.0/16"."""

    cidr: str = ""
    namespace: str = ""
    port: int | None = None
    protocol: str = "TCP"

    def peer(self) -> dict[str, Any]:
        if self.cidr:
            return {"ipBlock": {"cidr": self.cidr}}
        return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}}}

    def to_policy(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"to": [self.peer()]}
        if self.port is not None:
            rule["ports"] = [{"protocol": self.protocol, "port": self.port}]
        return rule


def parse_egress(entry: str) -> EgressRule:
    """One KUBERNETES_TRITON_EGRESS entry; ValueError saying what is wrong."""
    match = _CIDR_RULE_RE.fullmatch(entry) or _NAMESPACE_RULE_RE.fullmatch(entry)
    if match is None:
        raise ValueError(f"{entry!r} is neither CIDR[:PORT[/PROTOCOL]] (e.g. 10.0.5.0/24:9000) nor "
                         "namespace=NAME[:PORT[/PROTOCOL]] (e.g. namespace=storage:9000)")
    groups = match.groupdict()
    port = int(groups["port"]) if groups.get("port") else None
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{entry!r}: the port must be between 1 and 65535")
    protocol = (groups.get("protocol") or "TCP").upper()
    if protocol not in ("TCP", "UDP", "SCTP"):
        raise ValueError(f"{entry!r}: the protocol must be TCP, UDP or SCTP")
    if groups.get("cidr"):
        try:
            network = ipaddress.ip_network(groups["cidr"], strict=False)
        except ValueError:
            raise ValueError(f"{entry!r}: {groups['cidr']!r} is not a CIDR block such as 10.0.5.0/24") from None
        return EgressRule(cidr=str(network), port=port, protocol=protocol)
    namespace = groups["namespace"]
    if not _DNS_LABEL_RE.fullmatch(namespace):
        raise ValueError(f"{entry!r}: {namespace!r} is not a namespace name")
    return EgressRule(namespace=namespace, port=port, protocol=protocol)


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
    # How long the presigned GET URLs of a revision's repository live; the worker renews them at half-life.
    repository_url_seconds: int = 24 * 3600
    # The image of the init container that fetches the repository (needs python3); empty: the Triton image.
    fetch_image: str = ""
    # Where Triton's pods may connect (besides DNS): the S3 endpoint must be listed, for the init container.
    egress: tuple[EgressRule, ...] = ()
    dns_namespace: str = "kube-system"
    # Tracing (docs/observability.md): where Triton's pods send their spans (the portal's OTLP/HTTP traces URL, ""
    # when tracing is off), and the one egress rule that lets them reach it (KUBERNETES_TRACE_EGRESS: a NetworkPolicy
    # cannot name a host, so the operator says where the collector is, with its port). Pods are traced only with both.
    traces_url: str = ""
    trace_egress: EgressRule | None = None
    default_cpu: str = "1"
    default_memory: str = "4Gi"
    shm_size: str = "1Gi"
    tmp_size: str = "1Gi"
    gpu_node_label: str = "nvidia.com/gpu.product"
    gpu_types: tuple[tuple[str, str], ...] = ()
    gpu_tolerations: tuple[str, ...] = ("nvidia.com/gpu",)
    gateway_namespace: str = "modelport"
    gateway_pod_labels: tuple[tuple[str, str], ...] = (
        ("app.kubernetes.io/name", "modelport"), ("app.kubernetes.io/component", "web"))
    # The reconcile worker's pods (platform/kubernetes/base/worker.yaml), in the gateway's namespace: the performance
    # panel's snapshot pass reads Triton's statistics from there, on the HTTP port only. Never the inspection lane's
    # (component worker-inspection), which runs uploaded code's inspection; empty: not admitted.
    worker_pod_labels: tuple[tuple[str, str], ...] = (
        ("app.kubernetes.io/name", "modelport"), ("app.kubernetes.io/component", "worker"))
    metrics_namespace: str = ""
    queue_time_metric: str = "triton_queue_time_us"
    # What a deployment's "autoscaling" renders: "hpa" (its own metric), "queue-ratio-hpa" (an HPA on the adapter's
    # external queue-to-compute ratio) or "keda" (a ScaledObject on the same ratio, read from keda_prometheus_url).
    autoscaling: str = "hpa"
    autoscaling_target_ratio: float = 1.0
    keda_prometheus_url: str = ""
    cluster_domain: str = "cluster.local"
    ready_timeout_seconds: int = 1800
    unschedulable_grace_seconds: int = 120
    response_cache_bytes: int = 64 * 1024**2
    # Where the pools open to every team run (a team's own pool runs in the team's namespace).
    pool_namespace: str = "modelport-pools"
    # A pool's Triton image (empty: `image`): it must have onnxruntime for the generated models (docs/pools.md).
    pool_image: str = ""
    # The most bytes one answer of a pool's model may hold (POOL_MAX_OUTPUT_BYTES; 0: no bound).
    pool_max_output_bytes: int = 16 * 2**20

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
            repository_url_seconds=settings.KUBERNETES_REPOSITORY_URL_SECONDS,
            fetch_image=settings.KUBERNETES_FETCH_IMAGE,
            egress=tuple(parse_egress(entry) for entry in settings.KUBERNETES_TRITON_EGRESS),
            dns_namespace=settings.KUBERNETES_DNS_NAMESPACE,
            traces_url=tracing.traces_url() or "",
            trace_egress=parse_egress(settings.KUBERNETES_TRACE_EGRESS) if settings.KUBERNETES_TRACE_EGRESS else None,
            default_cpu=settings.KUBERNETES_DEFAULT_CPU,
            default_memory=settings.KUBERNETES_DEFAULT_MEMORY,
            shm_size=settings.KUBERNETES_SHM_SIZE,
            tmp_size=settings.KUBERNETES_TMP_SIZE,
            gpu_node_label=settings.KUBERNETES_GPU_NODE_LABEL,
            gpu_types=tuple(sorted(settings.KUBERNETES_GPU_TYPES.items())),
            gpu_tolerations=tuple(settings.KUBERNETES_GPU_TOLERATIONS),
            gateway_namespace=settings.KUBERNETES_GATEWAY_NAMESPACE,
            gateway_pod_labels=tuple(sorted(settings.KUBERNETES_GATEWAY_POD_LABELS.items())),
            worker_pod_labels=tuple(sorted(settings.KUBERNETES_WORKER_POD_LABELS.items())),
            metrics_namespace=settings.KUBERNETES_METRICS_NAMESPACE,
            queue_time_metric=settings.KUBERNETES_QUEUE_TIME_METRIC,
            autoscaling=settings.KUBERNETES_AUTOSCALING,
            autoscaling_target_ratio=settings.KUBERNETES_AUTOSCALING_TARGET_RATIO,
            keda_prometheus_url=settings.KUBERNETES_KEDA_PROMETHEUS_URL,
            cluster_domain=settings.KUBERNETES_CLUSTER_DOMAIN,
            ready_timeout_seconds=settings.KUBERNETES_READY_TIMEOUT_SECONDS,
            unschedulable_grace_seconds=settings.KUBERNETES_UNSCHEDULABLE_GRACE_SECONDS,
            response_cache_bytes=settings.TRITON_RESPONSE_CACHE_BYTES,
            pool_namespace=settings.KUBERNETES_POOL_NAMESPACE,
            pool_image=settings.KUBERNETES_POOL_TRITON_IMAGE,
            pool_max_output_bytes=settings.POOL_MAX_OUTPUT_BYTES,
        )

    def namespace_for(self, team: str) -> str:
        """The team's namespace; NamespaceRefused when it is KUBERNETES_POOL_NAMESPACE (a team named `pools`,
        with the default prefix): the team's objects and Roles would sit beside the pools open to every team."""
        name = self.team_namespace(team)
        if name == self.pool_namespace:
            raise NamespaceRefused(
                f"Team {team!r} would get the namespace {name}, which is KUBERNETES_POOL_NAMESPACE, where the pools "
                "open to every team run: nothing of the team is placed there. An operator must map the team to "
                "another namespace in KUBERNETES_NAMESPACES, or set KUBERNETES_POOL_NAMESPACE to one no team has.")
        return name

    def team_namespace(self, team: str) -> str:
        """The team's namespace as configured, unchecked: only to find and remove the team's own objects."""
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

    def cluster_problem(self) -> str | None:
        if self.in_cluster:
            if not os.environ.get("KUBERNETES_SERVICE_HOST"):
                return ("KUBERNETES_IN_CLUSTER is true but this process does not run in a Kubernetes pod "
                        "(KUBERNETES_SERVICE_HOST is not set): run the worker in the cluster, "
                        "or set KUBECONFIG instead.")
            return None
        if not self.kubeconfig:
            return ("No Kubernetes cluster is configured: set KUBECONFIG to a kubeconfig file, or run the worker "
                    "in-cluster with KUBERNETES_IN_CLUSTER=true (see docs/kubernetes.md).")
        return None

    def s3_problem(self) -> str | None:
        if not self.s3_configured:
            return ("S3 for model repositories is not configured: Triton's pods fetch the model repository from "
                    "S3, so set KUBERNETES_S3_BUCKET (or S3_BUCKET), and S3_ENDPOINT_URL, S3_ACCESS_KEY_ID and "
                    "S3_SECRET_ACCESS_KEY for an S3-compatible store such as MinIO (see docs/kubernetes.md).")
        return None

    def egress_problem(self) -> str | None:
        if not self.egress:
            return ("KUBERNETES_TRITON_EGRESS is empty: Triton's pods may connect to nothing but DNS, so their init "
                    "container cannot download the model repository from S3. List the S3 endpoint as the pods reach "
                    "it, e.g. namespace=storage:9000 for an in-cluster MinIO or 10.0.5.0/24:443 (docs/kubernetes.md).")
        return None

    @property
    def pod_traces_url(self) -> str | None:
        """The URL Triton's pods export their spans to, or None (untraced): tracing is off, or no trace egress is
        set, or it does not match the URL (trace_problem())."""
        if self.traces_url and self.trace_egress is not None and self.trace_problem() is None:
            return self.traces_url
        return None

    def trace_problem(self) -> str | None:
        """Why Triton's pods are not traced although the portal is (None: they are, or tracing is off)."""
        if not self.traces_url:
            return None
        if self.trace_egress is None:
            return ("tracing is on (OTEL_EXPORTER_OTLP_ENDPOINT) but KUBERNETES_TRACE_EGRESS is not set: Triton's "
                    "pods start untraced, since their NetworkPolicy could not let them reach the collector. Set it to "
                    "the collector as the pods reach it, e.g. namespace=observability:4318 (docs/observability.md).")
        parts = urlsplit(self.traces_url)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            port = 0
        if parts.scheme not in ("http", "https") or not parts.hostname or not port:
            return f"the trace endpoint {self.traces_url!r} is not an http(s) URL with a host: pods start untraced."
        if self.trace_egress.port != port or self.trace_egress.protocol != "TCP":
            return (f"KUBERNETES_TRACE_EGRESS must name the collector's TCP port, {port} (from {self.traces_url}), "
                    "and only that one: Triton's pods start untraced until it does.")
        return None

    def problems(self) -> list[str]:
        return [p for p in (self.cluster_problem(), self.s3_problem(), self.egress_problem()) if p]

    # --- Where repositories live ---------------------------------------------------------------------------

    @property
    def init_image(self) -> str:
        return self.fetch_image or self.image

    @property
    def pool_triton_image(self) -> str:
        return self.pool_image or self.image

    def repository_url(self, key_prefix: str) -> str:
        """Where a revision's repository lives, in Triton's S3 syntax (recorded on the revision and in an
        annotation; Triton itself loads the copy the init container fetched).

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
