from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from accounts import actions
from accounts.models import ApiToken, Membership, Team, TeamQuota


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class TeamQuotaInline(admin.StackedInline):
    """The operator raises (or lowers) a team's resource ceilings here; refusals name this place."""

    model = TeamQuota
    extra = 1  # shown empty, so that the place to raise a ceiling is in sight; saved only when filled in
    max_num = 1
    can_delete = True
    verbose_name = verbose_name_plural = "quota"


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "created_at"]
    search_fields = ["name"]
    inlines = [MembershipInline, TeamQuotaInline]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "name", "user", "team", "scopes", "created_by", "created_at", "last_used_at",
                    "expires_at", "revoked_at"]
    list_filter = ["team", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "name", "user__username", "team__name"]
    list_select_related = ["user", "team", "created_by"]
    # Revoked with the action only, so that what a token created goes with it and each revocation is in the audit log.
    readonly_fields = ["prefix", "digest", "created_by", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke_tokens"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tokens are created by their users (shown once) or by create_api_token

    @admin.action(description="Revoke selected tokens (and the tokens they created)")
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked = actions.revoke_tokens(queryset.select_related("team"), by=request.user, via="admin")
        self.message_user(request, f"Revoked {len(revoked)} token(s).")
