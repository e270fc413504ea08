"""Kubernetes manifests' inputs and their checks, shared by the manifest and ceiling tests (a fixture module: nothing
here is collected)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate

from deployments.revision_spec import RevisionSpec
from deployments.runtimes.kubernetes.config import KubernetesConfig, parse_egress
from deployments.runtimes.kubernetes.manifests import Target

# Two supported minor versions shipped by kubernetes-validate 1.37 (it ships 1.25 to 1.37).
KUBERNETES_VERSIONS = ("1.31", "1.33")


CONFIG = KubernetesConfig(
    kubeconfig="/dev/null",
    s3_endpoint_url="http://minio.storage.svc:9000",
    s3_bucket="models",
    s3_prefix="modelport/repositories",
    s3_access_key_id="key",
    s3_secret_access_key="secret",
    gpu_types=(("a100", "NVIDIA-A100-SXM4-80GB"),),
    image_pull_secrets=("ngc",),
    egress=(parse_egress("10.0.5.0/24:9000"), parse_egress("namespace=storage:9000")),
)


def model(name: str = "digits", fmt: str = "onnx", **extra: Any) -> dict[str, Any]:
    return {"name": name, "model": name, "version": 1, "format": fmt, "max_batch_size": 8,
            "instance_group": {"count": 1, "kind": "cpu", "gpus": []}, "response_cache": False, **extra}


def target(revision: int = 3, **spec: Any) -> Target:
    full = {"runtime": "kubernetes", "replicas": 1, "resources": {}, "models": [model()], **spec}
    return Target(team="acme", name="digits", revision=revision, spec=RevisionSpec.from_json(full),
                  repository_key=f"modelport/repositories/acme/digits-7/r{revision}/")


def validate_everywhere(obj: dict[str, Any]) -> None:
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            raise AssertionError(f"{obj['kind']} is invalid for Kubernetes {version} at {where}: "
                                 f"{exc.message}") from None
