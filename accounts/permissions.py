from __future__ import annotations

from typing import Any

from rest_framework import exceptions, permissions

from accounts.context import current_membership, is_team_admin


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
