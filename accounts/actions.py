"""Issuing and revoking API tokens: the one way every caller does it (the API, the tokens page, the admin,
create_api_token), each change atomic with its audit rows (sent as accounts.signals, written by audit/receivers.py).

One audit row per token: "token.create" for each new token, "token.revoke" for each token a revocation stopped,
with "revoked_with" naming the token whose revocation took it along when it was not the one asked for."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.db import transaction

from accounts import signals
from accounts.models import ApiToken, Team


class CreatorRevoked(Exception):
    """The token asking for a new token was revoked (or expired) meanwhile: it may not create one."""


def issue_token(user: Any, team: Team, *, by: Any, via: str, name: str = "", expires_in: timedelta | None = None,
                scopes: Iterable[str] = (), created_by: ApiToken | None = None) -> tuple[ApiToken, str]:
    """Create a token (ApiToken.issue: its errors are its own) and its audit row; the raw value, once.

    `by`: who acted (None: the system, create_api_token); `via`: how. A token that creates a
    token is locked and checked again first: revoking it locks its row too, so either the revocation sees the new
    token and revokes it, or the creation sees the revocation and is refused."""
    with transaction.atomic():
        if created_by is not None:
            if not ApiToken.objects.select_for_update().filter(pk=created_by.pk).usable().exists():
                raise CreatorRevoked(f"token {created_by.prefix} is revoked or expired")
        token, raw = ApiToken.issue(user, team, name=name, expires_in=expires_in, scopes=scopes,
                                    created_by=created_by)
        signals.token_created.send(ApiToken, user=by, token=token, via=via)
    return token, raw


def revoke_token(token: ApiToken, *, by: Any, via: str) -> list[ApiToken]:
    """Revoke `token` and every token it created, transitively (ApiToken.revoke), with an audit row for each token
    this stopped; the tokens this revoked. Revoking a revoked token again still revokes what it created."""
    with transaction.atomic():
        revoked = token.revoke()
        for each in revoked:
            signals.token_revoked.send(ApiToken, user=by, token=each, via=via,
                                       revoked_with=token.prefix if each.pk != token.pk else "")
    return revoked


def revoke_tokens(tokens: Iterable[ApiToken], *, by: Any, via: str) -> list[ApiToken]:
    """revoke_token for each of `tokens` (the admin's action), in one transaction; every token this revoked."""
    revoked: list[ApiToken] = []
    with transaction.atomic():
        for token in tokens:
            revoked.extend(revoke_token(token, by=by, via=via))
    return revoked
