"""End-to-end check of the Kubernetes runtime on a real cluster: `make e2e-k8s` (not part of `make test`: no
cluster runs on the development machine, where tests use a fake API server instead).

It needs a Modelport installed in the cluster (platform/kubernetes) and reachable from here, and a kubeconfig
for the same cluster:

    MODELPORT_URL=https://modelport.example.com MODELPORT_TOKEN=mp_... KUBECONFIG=~/.kube/config make e2e-k8s

Steps: push the digits sample model, deploy it with runtime "kubernetes", wait until it serves, check the
Deployment, Service and NetworkPolicy in the cluster, infer through the gateway (/serve/...) and compare every
answer with onnxruntime run here, export the manifests, then delete the deployment and wait until its objects are
gone from the cluster. Everything it creates is named e2e-<random>, and removed at the end even on failure.
E2E_TIMEOUT (seconds, default 1200) bounds the wait for the pods (the Triton image is large on a cold node).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import requests
import yaml


def log(message: str) -> None:
    print(f"[e2e-k8s {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Portal:
    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, expect: tuple[int, ...] = (200, 201, 202, 204), **kwargs: Any) -> Any:
        response = self.session.request(method, f"{self.url}{path}", timeout=120, **kwargs)
        if response.status_code not in expect:
            raise SystemExit(f"{method} {path} answered {response.status_code}: {response.text[:2000]}")
        return response


def wait(what: str, check: Callable[[], Any], timeout: float, interval: float = 3.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def main() -> int:
    missing = [name for name in ("MODELPORT_URL", "MODELPORT_TOKEN", "KUBECONFIG") if not os.environ.get(name)]
    if missing:
        print(__doc__)
        print(f"Set {', '.join(missing)}.", file=sys.stderr)
        return 2
    import onnxruntime as ort
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    from models_registry.samples import digits_holdout, make_digits_onnx

    timeout = float(os.environ.get("E2E_TIMEOUT", "1200"))
    portal = Portal(os.environ["MODELPORT_URL"], os.environ["MODELPORT_TOKEN"])
    k8s_config.load_kube_config()
    apps, core = k8s_client.AppsV1Api(), k8s_client.CoreV1Api()
    networking = k8s_client.NetworkingV1Api()
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    selector = f"app.kubernetes.io/managed-by=modelport,modelport.io/deployment={name}"

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "digits.onnx"
        make_digits_onnx(path)
        try:
            log(f"pushing the digits model as {name}")
            portal.call("POST", "/api/v1/models/", json={"name": name})
            with open(path, "rb") as f:
                number = portal.call("POST", f"/api/v1/models/{name}/versions/",
                                     files={"file": ("digits.onnx", f)}).json()["number"]

            def version_ready() -> bool:
                body = portal.call("GET", f"/api/v1/models/{name}/versions/{number}/").json()
                if body["status"] == "failed":
                    raise SystemExit(f"the upload failed: {body.get('error')}")
                return bool(body["status"] == "ready")

            wait("the upload to be inspected", version_ready, 300)

            log(f"deploying {name} on Kubernetes")
            portal.call("POST", "/api/v1/deployments/", json={
                "name": name, "runtime": "kubernetes", "replicas": 2, "models": [{"model": name}],
                "resources": {"cpu": "500m", "memory": "2Gi"}})
            seen = [""]

            def deployment_ready() -> dict[str, Any] | None:
                body: dict[str, Any] = portal.call("GET", f"/api/v1/deployments/{name}/").json()
                if body["status_message"] != seen[0]:
                    seen[0] = body["status_message"]
                    log(f"  {body['status']}: {body['status_message']}")
                if body["status"] == "failed":
                    raise SystemExit(f"the deployment failed: {body['status_message']}")
                return body if body["status"] == "ready" else None

            wait("the deployment to serve", deployment_ready, timeout, interval=5)

            [deployment] = apps.list_deployment_for_all_namespaces(label_selector=selector).items
            namespace = deployment.metadata.namespace
            log(f"the cluster runs Deployment {namespace}/{deployment.metadata.name}: "
                f"{deployment.status.available_replicas} of {deployment.spec.replicas} available")
            assert deployment.status.available_replicas == 2
            assert core.list_namespaced_service(namespace, label_selector=selector).items
            [policy] = networking.list_namespaced_network_policy(namespace, label_selector=selector).items
            assert policy.spec.policy_types == ["Ingress", "Egress"]
            # Issue 11: the pods that run uploaded code hold no S3 key and no token, and fetched a verified copy.
            for pod in core.list_namespaced_pod(namespace, label_selector=selector).items:
                spec = json.dumps(k8s_client.ApiClient().sanitize_for_serialization(pod.spec))
                assert "AWS_" not in spec and "secretKeyRef" not in spec, f"pod {pod.metadata.name} holds S3 keys"
                assert pod.spec.automount_service_account_token is False
                [fetched] = pod.status.init_container_statuses
                assert fetched.state.terminated is not None and fetched.state.terminated.exit_code == 0
            log("the pods hold no S3 credential; their init containers fetched and verified the repository")

            X, _ = digits_holdout()
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            expected = session.run(["label"], {"input": X})[0]
            log(f"inferring {len(X)} images through the gateway")
            for start in range(0, len(X), 60):
                batch = X[start:start + 60]
                answer = portal.call("POST", f"/serve/{name}/v2/models/{name}/infer", json={"inputs": [
                    {"name": "input", "shape": list(batch.shape), "datatype": "FP32", "data": batch.ravel().tolist()}],
                    "outputs": [{"name": "label"}]}).json()
                [output] = answer["outputs"]
                got = np.array(output["data"]).reshape(output["shape"]).ravel()
                if not np.array_equal(got, expected[start:start + 60].ravel()):
                    raise SystemExit(f"Triton's labels differ from onnxruntime's for images {start}..{start + 59}")
            log("every answer matches onnxruntime")

            documents = list(yaml.safe_load_all(portal.call("GET", f"/api/v1/deployments/{name}/manifests").text))
            exported = next(d for d in documents if d["kind"] == "Deployment")
            assert (exported["metadata"]["namespace"], exported["metadata"]["name"]) == (namespace, name)
            log("the exported manifests name the same Deployment")
        finally:
            log(f"deleting {name}")
            portal.call("DELETE", f"/api/v1/deployments/{name}/", expect=(202, 204, 404))
            wait("the deployment to be deleted", lambda: portal.call(
                "GET", f"/api/v1/deployments/{name}/", expect=(200, 404)).status_code == 404, 300)
            wait("its objects to leave the cluster", lambda: not apps.list_deployment_for_all_namespaces(
                label_selector=selector).items, 300)
            portal.call("DELETE", f"/api/v1/models/{name}/", expect=(202, 204, 404, 409))
    log("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
