from __future__ import annotations

from typing import Any

from rest_framework import exceptions, permissions

from accounts.context import current_membership, is_team_admin
from accounts.models import SCOPE_TOKENS, ApiToken


class IsTeamMember(permissions.BasePermission):
    """Authenticated and acting in one of the user's teams."""

    def has_permission(self, request: Any, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated:
            raise exceptions.NotAuthenticated("Authentication required: send 'Authorization: Bearer <token>'.")
        if current_membership(request) is None:
            raise exceptions.PermissionDenied("You are not a member of any team. Ask a team admin to add you.")
        return True


class IsTeamAdmin(IsTeamMember):
    def has_permission(self, request: Any, view: Any) -> bool:
        super().has_permission(request, view)
        if not is_team_admin(request):
            raise exceptions.PermissionDenied("Only team admins can do this.")
        return True


class CanManageTokens(IsTeamMember):
    """People (browser sessions) manage their tokens; a token only when it was created with the "tokens" scope."""

    def has_permission(self, request: Any, view: Any) -> bool:
        super().has_permission(request, view)
        auth = getattr(request, "auth", None)
        if isinstance(auth, ApiToken) and not auth.has_scope(SCOPE_TOKENS):
            raise exceptions.PermissionDenied(
                "This API token cannot manage tokens: sign in to the portal and use its Tokens page, or use a token "
                f"created with the '{SCOPE_TOKENS}' scope."
            )
        return True
