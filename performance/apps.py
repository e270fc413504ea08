from __future__ import annotations

from django.apps import AppConfig


class PerformanceConfig(AppConfig):
    name = "performance"
    default_auto_field = "django.db.models.BigAutoField"
