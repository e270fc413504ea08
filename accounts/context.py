"""Which team a request acts in: the API token's team, or the team chosen in the browser session."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.http import HttpRequest
from rest_framework.exceptions import NotAuthenticated

from accounts.models import ApiToken, Membership, Team

if TYPE_CHECKING:
    from django.contrib.auth.models import User

SESSION_TEAM_KEY = "team_id"


def acting_user(request: HttpRequest) -> User:
    """The authenticated user a request acts as. API views are behind IsTeamMember and web views behind
    login_required/team_required, so this raises only for a view wired without them."""
    user = request.user
    if not user.is_authenticated:
        raise NotAuthenticated("Authentication required: send 'Authorization: Bearer <token>'.")
    return user


def current_membership(request: Any) -> Membership | None:
    if hasattr(request, "_modelport_membership"):
        cached: Membership | None = request._modelport_membership
        return cached
    membership = _resolve(request)
    request._modelport_membership = membership
    return membership


def _resolve(request: Any) -> Membership | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    memberships = Membership.objects.select_related("team").filter(user=user)
    auth = getattr(request, "auth", None)
    if isinstance(auth, ApiToken):
        return memberships.filter(team_id=auth.team_id).first()
    session = getattr(request, "session", None)
    team_id = session.get(SESSION_TEAM_KEY) if session is not None else None
    if team_id is not None:
        chosen = memberships.filter(team_id=team_id).first()
        if chosen is not None:
            return chosen
    return memberships.order_by("team__name").first()


def current_team(request: Any) -> Team | None:
    membership = current_membership(request)
    return membership.team if membership else None


def is_team_admin(request: Any) -> bool:
    membership = current_membership(request)
    return membership is not None and membership.role == Membership.Role.ADMIN
