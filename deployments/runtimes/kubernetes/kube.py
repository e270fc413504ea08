"""A thin layer over the official `kubernetes` client: configuration from a kubeconfig or the pod's service
account, server-side apply through `ApiClient.call_api` (PATCH, application/apply-patch+yaml, fieldManager
"modelport"), plain GET/LIST/DELETE returning the API's JSON as dicts, pod logs, and watches through
`kubernetes.watch.Watch`.

Objects stay dicts (the JSON the API server sends) rather than the client's models, so that the manifest builder
and the status functions work on exactly what `kubectl get -o json` shows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

import urllib3

from deployments.runtimes.kubernetes.config import FIELD_MANAGER, KubernetesConfig

# (connect, read) seconds for ordinary requests.
REQUEST_TIMEOUT = (5.0, 30.0)

# apiVersion/kind -> (API prefix, plural, namespaced): the kinds Modelport manages.
KINDS: dict[tuple[str, str], tuple[str, str, bool]] = {
    ("v1", "Namespace"): ("/api/v1", "namespaces", False),
    ("v1", "Secret"): ("/api/v1", "secrets", True),
    ("v1", "ConfigMap"): ("/api/v1", "configmaps", True),
    ("v1", "Service"): ("/api/v1", "services", True),
    ("v1", "Pod"): ("/api/v1", "pods", True),
    ("v1", "ResourceQuota"): ("/api/v1", "resourcequotas", True),
    ("v1", "LimitRange"): ("/api/v1", "limitranges", True),
    ("apps/v1", "Deployment"): ("/apis/apps/v1", "deployments", True),
    ("policy/v1", "PodDisruptionBudget"): ("/apis/policy/v1", "poddisruptionbudgets", True),
    ("autoscaling/v2", "HorizontalPodAutoscaler"): ("/apis/autoscaling/v2", "horizontalpodautoscalers", True),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("/apis/networking.k8s.io/v1", "networkpolicies", True),
    # A custom resource (KEDA's CRD): the API server answers 404 for it where KEDA is not installed.
    ("keda.sh/v1alpha1", "ScaledObject"): ("/apis/keda.sh/v1alpha1", "scaledobjects", True),
}
# Kinds that exist only where a CRD is installed.
CUSTOM_KINDS = frozenset({("keda.sh/v1alpha1", "ScaledObject")})


class KubeError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{status} {reason}: {message}")


def explain(exc: KubeError, what: str) -> str:
    """A refusal as the deployment's status says it: what Modelport tried, and what to grant or fix."""
    if exc.status == 401:
        return (f"The Kubernetes API server did not accept Modelport's credentials while trying to {what} "
                f"({exc.message}): check the user of KUBECONFIG, or the service account token in-cluster.")
    if exc.status == 403:
        return (f"Kubernetes refused to let Modelport {what}: {exc.message}. Give the worker's service account the "
                "Role of platform/kubernetes/team-namespace in that namespace (or, for cluster-wide management, "
                "platform/kubernetes/cluster-wide).")
    return f"Kubernetes refused to {what} ({exc.status} {exc.reason}): {exc.message}"


class Unreachable(Exception):
    """No answer from the API server (connection refused, timeout, TLS failure)."""


class ConfigError(Exception):
    """The kubeconfig or in-cluster configuration cannot be loaded."""


def path_for(api_version: str, kind: str, namespace: str | None = None, name: str | None = None) -> str:
    prefix, plural, namespaced = KINDS[(api_version, kind)]
    path = f"{prefix}/namespaces/{namespace}/{plural}" if namespaced else f"{prefix}/{plural}"
    return f"{path}/{name}" if name else path


@lru_cache(maxsize=8)
def _api_client(config: KubernetesConfig) -> Any:
    # Imported here: the client takes a noticeable time to import, and only the Kubernetes runtime needs it.
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    configuration = k8s_client.Configuration()
    try:
        if config.in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(config_file=config.kubeconfig, context=config.context or None,
                                        client_configuration=configuration, persist_config=False)
    except (k8s_config.ConfigException, OSError, ValueError, TypeError) as exc:
        source = "the pod's service account" if config.in_cluster else f"KUBECONFIG={config.kubeconfig}"
        raise ConfigError(f"The Kubernetes configuration from {source} cannot be loaded: {exc}") from None
    return k8s_client.ApiClient(configuration)


class Kube:
    def __init__(self, api_client: Any) -> None:
        self.api = api_client

    @classmethod
    def connect(cls, config: KubernetesConfig) -> Kube:
        return cls(_api_client(config))

    @property
    def host(self) -> str:
        return str(self.api.configuration.host)

    # --- Requests ---------------------------------------------------------------------------------------------

    def request(self, method: str, path: str, *, query: Iterable[tuple[str, str]] = (), body: Any = None,
                content_type: str = "application/json", accept: str = "application/json",
                timeout: Any = REQUEST_TIMEOUT, max_bytes: int | None = None) -> bytes:
        """The answer's body; with `max_bytes`, at most that much of a successful one is read (the connection is
        then dropped rather than drained)."""
        from kubernetes.client.exceptions import ApiException

        headers: dict[str, str | None] = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, header_params, serialized, post_params = self.api.param_serialize(
            method=method, resource_path=path, query_params=list(query), header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api.call_api(method, url, header_params, serialized, post_params, _request_timeout=timeout)
            if max_bytes is not None and 200 <= response.status < 300:
                data = _read_at_most(response.response, max_bytes)
            else:
                data = response.read()
        except ApiException as exc:  # the client raises these with status 0 for TLS and protocol failures
            raise Unreachable(f"{self.host}: {exc.reason}") from None
        except urllib3.exceptions.HTTPError as exc:
            raise Unreachable(f"{self.host}: {_reason(exc)}") from None
        if not 200 <= response.status < 300:
            raise _error(response.status, response.reason or "", data)
        return bytes(data or b"")

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        data = self.request(method, path, **kwargs)
        return json.loads(data) if data else None

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply: Modelport's field manager owns the fields it sends (forced: it is the controller)."""
        meta = obj["metadata"]
        path = path_for(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        result: dict[str, Any] = self.json("PATCH", path, body=dict(obj), content_type="application/apply-patch+yaml",
                                           query=[("fieldManager", FIELD_MANAGER), ("force", "true")])
        return result

    def replace(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """PUT: update an existing object, failing with 409 when its metadata.resourceVersion is not the current
        one and with 404 when it is gone (it never creates one)."""
        meta = obj["metadata"]
        path = path_for(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        result: dict[str, Any] = self.json("PUT", path, body=dict(obj), query=[("fieldManager", FIELD_MANAGER)])
        return result

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = self.json("GET", path_for(api_version, kind, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    def list(self, api_version: str, kind: str, namespace: str, selector: str) -> dict[str, Any]:
        result: dict[str, Any] = self.json("GET", path_for(api_version, kind, namespace),
                                           query=[("labelSelector", selector)])
        return result

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        """False when it was gone already."""
        try:
            self.request("DELETE", path_for(api_version, kind, namespace, name),
                         body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        self.request("PATCH", path_for("apps/v1", "Deployment", namespace, name) + "/scale",
                     body={"spec": {"replicas": replicas}}, content_type="application/merge-patch+json",
                     query=[("fieldManager", FIELD_MANAGER)])

    def pod_log(self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int,
                previous: bool = False, timestamps: bool = False) -> bytes:
        """The container's last `tail_lines` lines, at most `limit_bytes` of them: the kubelet stops after that many
        (limitBytes, counted from the start of the tail), and no more than that is read whatever the server sends.
        With `timestamps`, each line starts with the RFC 3339 time the kubelet received it and a space."""
        query = [("container", container), ("tailLines", str(tail_lines)), ("limitBytes", str(limit_bytes))]
        if previous:
            query.append(("previous", "true"))
        if timestamps:
            query.append(("timestamps", "true"))
        return self.request("GET", path_for("v1", "Pod", namespace, pod) + "/log", query=query, accept="*/*",
                            max_bytes=limit_bytes)


def _read_at_most(raw: Any, max_bytes: int) -> bytes:
    """Up to `max_bytes` of a urllib3 response that was not preloaded, then the connection is closed."""
    try:
        return bytes(raw.read(max_bytes) or b"")
    finally:
        raw.close()
        raw.release_conn()


def _reason(exc: Exception) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason or exc)


def _error(status: int, reason: str, data: bytes | None) -> KubeError:
    message = ""
    try:
        body = json.loads(data or b"")
        message = body.get("message", "") if isinstance(body, dict) else ""
    except ValueError:
        message = (data or b"").decode("utf-8", errors="replace")[:500]
    return KubeError(status, reason, message or reason)
