"""System checks for production settings that cannot fail at import time without breaking development."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

MIN_METRICS_TOKEN_LENGTH = 20


def metrics_token(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """/metrics tells whoever reads it every team's deployment names and traffic. Without METRICS_TOKEN it is
    closed unless METRICS_OPEN opens it, which production refuses: there it takes a token. An error here stops
    `manage.py migrate` (run before every start: `make run`, compose, the Kubernetes init container) and
    `manage.py check`."""
    if not settings.PRODUCTION:
        return []
    token: str = settings.METRICS_TOKEN
    hint = ("Set METRICS_TOKEN (or METRICS_TOKEN_FILE) to a random secret, e.g. "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`, and configure Prometheus to send it "
            "as 'Authorization: Bearer <token>' (docs/configuration.md).")
    if not token and settings.METRICS_OPEN:
        return [checks.Error("METRICS_OPEN is true without METRICS_TOKEN: /metrics would be open to anyone who "
                             "reaches the portal.", hint=hint, id="modelport.E001")]
    if token and len(token) < MIN_METRICS_TOKEN_LENGTH:
        return [checks.Error(f"METRICS_TOKEN is too short to be secret: use at least {MIN_METRICS_TOKEN_LENGTH} "
                             "random characters.", hint=hint, id="modelport.E002")]
    return []


def register() -> None:
    checks.register(metrics_token, checks.Tags.security)
