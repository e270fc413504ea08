"""Resolving a bearer token to (user, team). Shared by the REST API and the gateway."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from accounts.models import TOKEN_PREFIX, ApiToken, Membership, hash_token

# last_used_at is informational: write it at most this often so that a busy token does not write on every request.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def parse_bearer(header: str | None) -> str | None:
    """The raw token from an Authorization header, or None when the header carries no bearer token."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def authenticate_token(raw: str) -> ApiToken | None:
    """The usable token for `raw` whose user is active and still a member of the token's team, else None."""
    if not raw.startswith(TOKEN_PREFIX):
        return None
    token = ApiToken.objects.usable().select_related("user", "team").filter(digest=hash_token(raw)).first()
    if token is None or not token.user.is_active:
        return None
    if not Membership.objects.filter(user_id=token.user_id, team_id=token.team_id).exists():
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
