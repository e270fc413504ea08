"""Lookups of deployments that other apps' views need (the gateway's metrics, tuning, the manifests): here rather
than in deployments/api.py, so that they depend on the deployments app and not on its API module."""

from __future__ import annotations

from django.db.models import Prefetch
from django.http import HttpRequest

from accounts.context import current_team
from deployments.models import Deployment, TritonServer
from infra.api_errors import not_found, not_found_message

# The servers shown beside a deployment (its serializer reads `live_servers`).
LIVE_SERVERS = Prefetch("servers", to_attr="live_servers", queryset=TritonServer.objects.filter(
    state__in=[TritonServer.State.STARTING, TritonServer.State.READY]).order_by("-started_at"))

# Each deployment's revisions in pools (shared placement), read by its serializer as `loads`.
POOL_LOADS = Prefetch("pool_loads", to_attr="loads")


def get_deployment_for_user(request: HttpRequest, name: str) -> Deployment:
    """The caller's team's deployment of that name; 404 for anything it may not see (another team's, a deleted one)."""
    deployment = (Deployment.objects.select_related("revision", "serving_revision", "canary_revision", "created_by")
                  .prefetch_related(LIVE_SERVERS, POOL_LOADS)
                  .filter(team=current_team(request), name=name)
                  .exclude(desired_state=Deployment.Desired.DELETED).first())
    if deployment is None:
        raise not_found("deployment", name, current_team(request), LIST_DEPLOYMENTS)
    return deployment


# What to do about a deployment that is not found, in the API's 404 and the gateway's (HTTP and gRPC).
LIST_DEPLOYMENTS = "GET /api/v1/deployments/ lists the team's deployments."


def deployment_not_found(name: str, team_name: str | None) -> str:
    """The API's 404 message for a deployment, for callers that have no request (the gateway)."""
    return not_found_message("deployment", name, team_name, LIST_DEPLOYMENTS)
