from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit log"

    def ready(self) -> None:
        from audit import receivers  # noqa: F401  (connects the receivers of accounts' signals)
