"""The audit rows of what accounts signals (accounts/signals.py); connected when the audit app is ready."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from accounts.models import ApiToken
from accounts.signals import token_created, token_revoked
from audit.log import record


@receiver(token_created)
def record_token_created(sender: Any, user: Any, token: ApiToken, via: str, **kwargs: Any) -> None:
    record(user, token.team, "token.create", token.prefix, name=token.name, scopes=token.scopes, via=via)


@receiver(token_revoked)
def record_token_revoked(sender: Any, user: Any, token: ApiToken, via: str, revoked_with: str = "",
                         **kwargs: Any) -> None:
    # One row per revoked token; one revoked because the token that created it was names that token.
    detail: dict[str, Any] = {"name": token.name, "via": via}
    if revoked_with:
        detail["revoked_with"] = revoked_with
    record(user, token.team, "token.revoke", token.prefix, **detail)
