from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.utils import timezone

from accounts.names import validate_name

if TYPE_CHECKING:
    from django.contrib.auth.models import User

TOKEN_PREFIX = "mp_"


class Team(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[validate_name])
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        ADMIN = "admin", "Team admin"
        MEMBER = "member", "Member"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="one_membership_per_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


def hash_token(raw: str) -> str:
    # Tokens carry 256 bits of randomness, so a plain SHA-256 is enough (no slow password hash needed).
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def usable(self) -> ApiTokenQuerySet:
        now = timezone.now()
        return self.filter(revoked_at__isnull=True).filter(models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now))


class ApiToken(models.Model):
    """A bearer token for one user acting in one team (what a CI job needs, nothing more)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, db_index=True)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user}, {self.team})"

    @classmethod
    def issue(cls, user: User, team: Team, name: str = "", expires_in: timedelta | None = None) -> tuple[ApiToken, str]:
        """Create a token; the raw value is returned once and never stored."""
        prefix = secrets.token_hex(4)
        raw = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
        expires_at = timezone.now() + expires_in if expires_in else None
        token = cls.objects.create(
            user=user, team=team, name=name, prefix=prefix, digest=hash_token(raw), expires_at=expires_at
        )
        return token, raw

    @property
    def is_usable(self) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()

    def revoke(self) -> None:
        ApiToken.objects.filter(pk=self.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.refresh_from_db(fields=["revoked_at"])


class IdempotencyRecord(models.Model):
    """The response to a create call sent with an Idempotency-Key, replayed when a client (a retried CI step)
    sends the same request with the same key again."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)  # None while the first request runs
    response_body = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="one_record_per_idempotency_key")]

    def __str__(self) -> str:
        return f"{self.key} ({self.status_code})"
