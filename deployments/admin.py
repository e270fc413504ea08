"""The admin console's pages for shared servers (issue 24): pools are the operator's, their servers and loads are
shown, never edited by hand (the runtime records them)."""

from __future__ import annotations

from typing import TypeVar

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

from deployments import pools
from deployments.pool_models import ModelMemory, Pool, PoolLoad, PoolPod, PoolServer


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin[Pool]):
    list_display = ["name", "runtime", "open_to", "budget", "used", "models_loaded", "idle_unload_seconds",
                    "isolation"]
    list_filter = ["runtime", "gpu_share"]
    fieldsets = [
        (None, {"fields": ["name", "runtime", "team", "memory_budget_bytes", "idle_unload_seconds"]}),
        ("On a cluster: GPUs and pods", {"fields": [
            "gpu_share", "gpus", "mig_profile", "gpu_memory_mib", "gpu_cores_percent", "gpu_type",
            "gpu_load_fraction", "min_replicas", "max_replicas"],
            "description": "What each of the pool's Triton pods gets of the GPUs (docs/pools.md, GPU share classes)."}),
    ]
    search_fields = ["name", "team__name"]
    list_select_related = ["team"]

    @admin.display(description="teams")
    def open_to(self, obj: Pool) -> str:
        return "every team (ONNX only)" if obj.open_to_all else f"{obj.team} only"

    @admin.display(description="GPU isolation")
    def isolation(self, obj: Pool) -> str:
        return obj.isolation

    @admin.display(description="budget")
    def budget(self, obj: Pool) -> str:
        return pools.format_bytes(obj.memory_budget_bytes)

    @admin.display(description="used")
    def used(self, obj: Pool) -> str:
        return pools.format_bytes(pools.memory_used(obj)[0])

    @admin.display(description="models loaded")
    def models_loaded(self, obj: Pool) -> int:
        return pools.memory_used(obj)[1]


_M = TypeVar("_M", bound=Model)


class _ReadOnly(admin.ModelAdmin[_M]):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(PoolServer)
class PoolServerAdmin(_ReadOnly[PoolServer]):
    list_display = ["pool", "pid", "http_port", "state", "sandboxed", "started_at", "stopped_at"]
    list_filter = ["state", "pool"]
    exclude = ["admin_key"]  # the key of its model repository API: never shown


@admin.register(PoolPod)
class PoolPodAdmin(_ReadOnly[PoolPod]):
    list_display = ["pool", "name", "restart_count", "gone", "seen_at"]
    list_filter = ["gone", "pool"]


@admin.register(PoolLoad)
class PoolLoadAdmin(_ReadOnly[PoolLoad]):
    list_display = ["pool", "deployment", "revision", "state", "memory_bytes", "cold_start_seconds", "last_used_at"]
    list_filter = ["state", "pool"]
    list_select_related = ["pool", "deployment", "revision", "revision__deployment"]


@admin.register(ModelMemory)
class ModelMemoryAdmin(_ReadOnly[ModelMemory]):
    list_display = ["version", "fingerprint", "memory_bytes", "measured_at"]
