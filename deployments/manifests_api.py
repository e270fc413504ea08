"""GET /api/v1/deployments/{name}/manifests: the Kubernetes manifests of a deployment's current revision, as
multi-document YAML, for teams that apply them through GitOps instead of letting Modelport's worker do it."""

from __future__ import annotations

from typing import Any

import yaml
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.decorators import api_view, renderer_classes
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request

from deployments.models import Deployment
from deployments.queries import get_deployment_for_user
from deployments.runtimes.base import ManifestsRefused
from deployments.runtimes.registry import kubernetes_manifests
from infra.api_errors import ConflictError
from infra.api_schema import error


class YAMLRenderer(BaseRenderer):
    """Lets clients ask for application/yaml (errors are then YAML too)."""

    media_type = "application/yaml"
    format = "yaml"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
        return text.encode("utf-8")


@extend_schema(summary="A Kubernetes deployment's manifests, for GitOps", responses={
    (200, "application/yaml"): OpenApiResponse(OpenApiTypes.STR, description=(
        "Multi-document YAML: Namespace (when Modelport may create namespaces), Deployment, Service, "
        "PodDisruptionBudget, HorizontalPodAutoscaler and NetworkPolicy, as the worker applies them.")),
    409: error("Not a Kubernetes deployment, no revision yet, a shared one (its pool's objects are not its own), or "
               "the revision cannot run on Kubernetes as configured. (Errors are JSON, or YAML when only "
               "application/yaml is accepted.)"),
})
@api_view(["GET"])
@renderer_classes([JSONRenderer, YAMLRenderer])
def deployment_manifests(request: Request, name: str) -> HttpResponse:
    deployment = get_deployment_for_user(request, name)
    if deployment.runtime != Deployment.Runtime.KUBERNETES:
        raise ConflictError(f"{deployment.name} runs on the {deployment.runtime} runtime: only deployments with "
                            "runtime 'kubernetes' have Kubernetes manifests.")
    if deployment.revision is None:
        raise ConflictError(f"{deployment.name} has no revision yet.")
    placement = deployment.revision.spec.placement
    if placement.shared:
        # Its models run in the pool's Triton, whose objects are the operator's and serve other deployments too.
        raise ConflictError(f"{deployment.name} is shared: its models are loaded in pool {placement.pool!r}, whose "
                            "Kubernetes objects the operator's Modelport manages for every deployment in it, so it "
                            "has no manifests of its own. Use placement mode 'dedicated' for a GitOps export.")
    try:
        text = kubernetes_manifests(deployment)
    except ManifestsRefused as exc:
        raise ConflictError(f"Revision {deployment.revision.number} cannot run on Kubernetes "
                            f"as configured: {exc}") from None
    response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'inline; filename="{deployment.name}-r{deployment.revision.number}.yaml"'
    return response
