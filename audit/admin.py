from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ["time", "team", "username", "action", "target"]
    list_filter = ["action", "team"]
    search_fields = ["username", "action", "target"]
    list_select_related = ["team"]
    date_hierarchy = "time"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # an audit log is not edited

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
