"""Create what a Modelport on this machine needs under MODELPORT_VAR_DIR before its processes start: var/, the static
files' folder and, in development without SECRET_KEY, var/secret_key. `make run` and bin/run-portal run it first."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from infra.var_dir import ensure_dirs, ensure_secret_key


class Command(BaseCommand):
    help = "Create var/ (MODELPORT_VAR_DIR) and, in development, the secret key under it."
    # It runs before anything exists: the checks would report the secret key it is about to write.
    requires_system_checks: list[str] = []

    def handle(self, *args: Any, **options: Any) -> None:
        for directory in ensure_dirs():
            self.stdout.write(f"Created {directory}")
        key = ensure_secret_key()
        if key is not None:
            self.stdout.write(f"Wrote a new development secret key to {key}")
