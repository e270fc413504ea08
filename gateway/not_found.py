"""The gateway's two 404s, worded once for HTTP and gRPC (NOT_FOUND carries the same message) and for dedicated and
shared deployments alike.

- A deployment the caller's team lacks reads as the REST API's 404 (deployments/queries.py): it names the team the
  request acts for, since a token acts for the one team it was made in and a CI token of another team is the usual
  mistake, and says where the team's deployments are listed. Another team's deployment reads exactly the same.
- A model the deployment does not serve is refused here, before Triton: a dedicated deployment's Triton would answer
  "Request for unknown model: 'x' is not found" (its words, a 400 over HTTP), a shared one's pool holds other teams'
  models under names that must not be reached. The message names the deployment's own models, which its team may
  see.
"""

from __future__ import annotations

from collections.abc import Collection

from deployments.queries import deployment_not_found
from gateway.protocol import Refusal

MAX_NAME = 100  # of a name quoted back: a caller's text, bounded
MAX_LISTED_MODELS = 10


def no_deployment(name: str, team_name: str) -> Refusal:
    return Refusal(404, deployment_not_found(name[:MAX_NAME], team_name or None))


def check_model(model: str, served: Collection[str], deployment: str, team_name: str) -> None:
    """A 404 unless `model` is empty (a request that names none) or one of `served`, the revision's models."""
    if model and model not in served:
        raise no_model(model, served, deployment, team_name)


def no_model(model: str, served: Collection[str], deployment: str, team_name: str) -> Refusal:
    names = sorted(served)
    listed = ", ".join(repr(n) for n in names[:MAX_LISTED_MODELS]) or "none"
    if len(names) > MAX_LISTED_MODELS:
        listed += f" and {len(names) - MAX_LISTED_MODELS} more (GET /api/v1/deployments/{deployment}/ lists them)"
    return Refusal(
        404,
        f"Deployment {deployment!r} in team {team_name!r} serves no model named "
        f"{model[:MAX_NAME]!r}. Its models: {listed}.",
    )
