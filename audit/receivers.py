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
def record_token_revoked(sender: Any, user: Any, token: ApiToken, via: str, **kwargs: Any) -> None:
    record(user, token.team, "token.revoke", token.prefix, name=token.name, via=via)
