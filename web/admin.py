"""The operators' console: admin pages of the registry and deployments (registered here rather than in those apps),
the operator actions, a user action to disable accounts, and the overview page at /admin/overview/."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, URLResolver, path

from audit.log import record as audit
from deployments import actions
from deployments.models import Deployment, Event, Revision, TritonServer
from deployments.runtimes.registry import runtime_named
from models_registry import quota
from models_registry.models import Blob, Model, ModelVersion, TeamSources, TeamStorageQuota, Upload
from web import overview

# The console's name in its title bar and page titles (templates/admin/base_site.html draws the header itself);
# "View site" goes to the portal's dashboard.
admin.site.site_header = "Modelport admin"
admin.site.site_title = "Modelport admin"
admin.site.index_title = "Operators' console"
admin.site.site_url = "/"

# --- Registry ------------------------------------------------------------------------------------------------


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "last_version", "created_by", "created_at", "updated_at"]
    list_filter = ["team"]
    search_fields = ["name", "team__name", "description"]
    list_select_related = ["team", "created_by"]
    readonly_fields = ["last_version", "created_by", "created_at", "updated_at"]


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ["__str__", "format", "status", "size", "created_by", "created_at"]
    list_filter = ["status", "format", "model__team"]
    search_fields = ["model__name", "model__team__name", "sha256", "original_filename"]
    list_select_related = ["model__team", "created_by"]
    readonly_fields = ["model", "number", "format", "declared_format", "staged_key", "blob", "original_filename",
                       "size",
                       "sha256", "signature", "declared_signature", "max_batch_size", "declared_max_batch_size",
                       "definition", "created_by", "created_at", "validated_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # versions come from uploads, which check and inspect the file


@admin.register(Blob)
class BlobAdmin(admin.ModelAdmin):
    list_display = ["sha256", "size", "key", "created_at"]
    search_fields = ["sha256", "key"]
    readonly_fields = ["sha256", "size", "key", "created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Upload)
class UploadAdmin(admin.ModelAdmin):
    list_display = ["id", "team", "created_by", "offset", "length", "created_at", "expires_at", "completed_at"]
    list_filter = ["team", ("completed_at", admin.EmptyFieldListFilter)]
    search_fields = ["id", "team__name", "created_by__username"]
    list_select_related = ["team", "created_by"]
    readonly_fields = ["team", "created_by", "length", "offset", "metadata", "storage_state", "created_at",
                       "completed_at",
                       "busy_until"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(TeamStorageQuota)
class TeamStorageQuotaAdmin(admin.ModelAdmin):
    """An operator's storage quota for one team, in place of TEAM_STORAGE_QUOTA_BYTES; the list shows what each
    team uses against it."""

    list_display = ["team", "bytes", "used", "updated_at"]
    search_fields = ["team__name"]
    list_select_related = ["team"]

    @admin.display(description="used (bytes)")
    def used(self, obj: TeamStorageQuota) -> int:
        return quota.usage_of(obj.team)


@admin.register(TeamSources)
class TeamSourcesAdmin(admin.ModelAdmin):
    """What one team may import versions from (issue 35): MLflow registered models, Hugging Face repositories, S3
    buckets, https hosts; a team without a row gets the settings' defaults (IMPORT_MLFLOW_MODELS,
    IMPORT_HUGGINGFACE_REPOS, nothing else)."""

    list_display = ["team", "huggingface_token", "updated_at"]
    search_fields = ["team__name"]
    list_select_related = ["team"]


# --- Deployments ---------------------------------------------------------------------------------------------


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "runtime", "desired_state", "status", "revision_number", "serving_number",
                    "allow_egress", "updated_at"]
    list_filter = ["status", "runtime", "desired_state", "team", "allow_egress"]
    search_fields = ["name", "team__name", "status_message"]
    list_select_related = ["team", "revision", "serving_revision"]
    # What the reconciler records between its ticks is its own: shown, never edited by hand.
    readonly_fields = ["revision", "serving_revision", "upstream_url", "serving_launch", "launch", "launch_deadline",
                       "drain_until", "lease_until", "reconcile_due_at", "created_by", "created_at", "updated_at",
                       "status_changed_at"]
    actions = ["stop_deployments", "start_deployments", "rerender_deployments"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # deployments are made through the deploy form or the API, which validate the spec

    def save_model(self, request: HttpRequest, obj: Deployment, form: Any, change: bool) -> None:
        egress_changed = change and "allow_egress" in form.changed_data
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if egress_changed:
                # The audit entry, the event and the restart that applies it (only staff reach this page).
                actions.set_egress(obj, request.user, obj.allow_egress)

    @admin.display(description="revision")
    def revision_number(self, obj: Deployment) -> str:
        return f"r{obj.revision.number}" if obj.revision else "–"

    @admin.display(description="serving")
    def serving_number(self, obj: Deployment) -> str:
        return f"r{obj.serving_revision.number}" if obj.serving_revision else "–"

    def _each(self, request: HttpRequest, queryset: QuerySet[Deployment], verb: str, action: Any) -> None:
        done, skipped = [], []
        for deployment in queryset.exclude(desired_state=Deployment.Desired.DELETED):
            try:
                action(deployment, request.user)
            except actions.Conflict as exc:
                skipped.append(f"{deployment.name} ({exc})")
            else:
                done.append(deployment.name)
        if done:
            self.message_user(request, f"{verb}: {', '.join(done)}.", messages.SUCCESS)
        if skipped:
            self.message_user(request, f"Skipped: {'; '.join(skipped)}", messages.WARNING)

    @admin.action(description="Stop selected deployments")
    def stop_deployments(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        self._each(request, queryset, "Stopping", actions.stop_deployment)

    @admin.action(description="Start (or retry) selected deployments")
    def start_deployments(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        self._each(request, queryset, "Starting", actions.start_deployment)

    @admin.action(description="Re-render: a new revision with the same spec")
    def rerender_deployments(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        self._each(request, queryset, "Re-rendering", actions.rerender_deployment)


@admin.register(Revision)
class RevisionAdmin(admin.ModelAdmin):
    list_display = ["__str__", "deployment", "number", "created_by", "created_at", "repository"]
    list_filter = ["deployment__team"]
    search_fields = ["deployment__name", "deployment__team__name"]
    list_select_related = ["deployment__team", "created_by"]
    readonly_fields = ["deployment", "number", "spec", "versions", "repository", "created_by", "created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # revisions are immutable snapshots made by the deployment actions


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["time", "deployment", "kind", "short_message"]
    list_filter = ["kind", "deployment__team"]
    search_fields = ["message", "deployment__name"]
    list_select_related = ["deployment__team"]
    date_hierarchy = "time"
    readonly_fields = ["deployment", "time", "kind", "message", "reason", "count", "first_time"]

    @admin.display(description="message")
    def short_message(self, obj: Event) -> str:
        return obj.message if len(obj.message) <= 120 else obj.message[:119] + "…"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(TritonServer)
class TritonServerAdmin(admin.ModelAdmin):
    list_display = ["pid", "deployment", "revision_number", "state", "alive", "sandboxed", "allow_egress", "http_port",
                    "grpc_port", "metrics_port", "started_at", "stopped_at"]
    list_filter = ["state", "sandboxed", "deployment__team"]
    search_fields = ["deployment__name", "pid"]
    list_select_related = ["deployment__team", "revision"]
    readonly_fields = ["deployment", "revision", "pid", "http_port", "grpc_port", "metrics_port", "log_path", "state",
                       "started_at", "stopped_at", "sandboxed", "sandbox_note", "sandbox_id", "cgroups", "allow_egress"]
    exclude = ["admin_key"]  # a secret of the running server; nobody needs to read it here

    @admin.display(description="revision")
    def revision_number(self, obj: TritonServer) -> str:
        return f"r{obj.revision.number}"

    @admin.display(description="alive", boolean=True)
    def alive(self, obj: TritonServer) -> bool:
        return runtime_named(Deployment.Runtime.LOCAL).server_alive(obj.pid)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


# --- Users ---------------------------------------------------------------------------------------------------

User = get_user_model()
if admin.site.is_registered(User):
    admin.site.unregister(User)


@admin.register(User)
class ModelportUserAdmin(UserAdmin):
    actions = ["disable_users"]

    @admin.action(description="Disable selected users (they can no longer sign in or use their tokens)")
    def disable_users(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        with transaction.atomic():
            users = list(queryset.exclude(pk=request.user.pk).filter(is_active=True))
            queryset.filter(pk__in=[u.pk for u in users]).update(is_active=False)
            for user in users:
                audit(request.user, None, "user.disable", user.get_username())
        self.message_user(request, f"Disabled {len(users)} user(s).")
        if queryset.filter(pk=request.user.pk).exists():
            self.message_user(request, "You cannot disable yourself.", messages.WARNING)


# --- Overview ------------------------------------------------------------------------------------------------


def overview_view(request: HttpRequest) -> HttpResponse:
    context = {
        **admin.site.each_context(request),
        "title": "Operator overview",
        "servers": overview.triton_servers(),
        "sandbox": overview.sandbox(),
        "runtimes": overview.deployments_by_runtime(),
        "gpus": overview.gpus_per_team(),
        "pools": overview.pools(),
        "queue": overview.queue_depth(),
        "workers": overview.worker_ping(),
        "failures": overview.recent_failures(),
    }
    return TemplateResponse(request, "admin/overview.html", context)


_site_urls = admin.site.get_urls


def _get_urls() -> list[URLResolver | URLPattern]:
    # portal/urls.py mounts admin.site.urls as it is (and its catch-all would answer /admin/overview/ with a 404),
    # so the overview joins the site's own URLs; admin_view() makes it staff-only.
    return [path("overview/", admin.site.admin_view(overview_view), name="overview"), *_site_urls()]


admin.site.get_urls = _get_urls  # type: ignore[method-assign]
