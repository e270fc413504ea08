from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.utils import timezone

from infra.names import validate_name

if TYPE_CHECKING:
    from django.contrib.auth.models import User

TOKEN_PREFIX = "mp_"

# What a token may do beyond the normal API (models, deployments, inference). Token management is for people
# signed in to the portal; a token needs the "tokens" scope to list, create or revoke tokens (of its own team).
SCOPE_TOKENS = "tokens"
TOKEN_SCOPES = {SCOPE_TOKENS: "list, create and revoke its user's API tokens in its own team"}

# However long a token lives, its expiry date must stay a date: ten years is the bound when no maximum is set.
ABSOLUTE_MAX_LIFETIME_DAYS = 3650


class TokenLifetimeError(ValueError):
    """A requested token lifetime longer than the configured maximum."""


def max_token_lifetime_days() -> int:
    """The longest lifetime a new token may have, in days (API_TOKEN_MAX_LIFETIME_DAYS; 0 there: ten years)."""
    configured: int = settings.API_TOKEN_MAX_LIFETIME_DAYS
    return min(configured, ABSOLUTE_MAX_LIFETIME_DAYS) if configured else ABSOLUTE_MAX_LIFETIME_DAYS


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
        return self.filter(revoked_at__isnull=True).filter(models.Q(expires_at__isnull=True)
                                                           | models.Q(expires_at__gt=now))


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
    scopes = models.JSONField(default=list, blank=True, help_text=f"Beyond the normal API: {', '.join(TOKEN_SCOPES)}")
    # The token that created this one through the API; None when a person, the admin or create_api_token did.
    # Revoking a token revokes what it created, transitively (revoke()), so that a leaked CI token cannot outlive
    # its revocation through tokens it minted; deleting one deletes them for the same reason.
    created_by = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE,
                                   related_name="created_tokens")

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"  # not Django's "api token" from the class name (the admin read "Api tokens")

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user}, {self.team})"

    @classmethod
    def issue(cls, user: User, team: Team, name: str = "", expires_in: timedelta | None = None,
              scopes: Iterable[str] = (), created_by: ApiToken | None = None) -> tuple[ApiToken, str]:
        """Create a token; the raw value is returned once and never stored.

        Without `expires_in` the token lives as long as API_TOKEN_MAX_LIFETIME_DAYS allows (forever when that is 0);
        a longer `expires_in` raises TokenLifetimeError. A token created by another token (`created_by`) never
        outlives it, so that a leaked token cannot keep itself alive by minting successors."""
        unknown = set(scopes) - set(TOKEN_SCOPES)
        if unknown:
            raise ValueError(f"unknown token scopes {sorted(unknown)}: use {sorted(TOKEN_SCOPES)}")
        now = timezone.now()
        expires_at = _expiry(now, expires_in)
        if created_by is not None and created_by.expires_at is not None:
            expires_at = created_by.expires_at if expires_at is None else min(expires_at, created_by.expires_at)
        prefix = secrets.token_hex(4)
        raw = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
        token = cls.objects.create(user=user, team=team, name=name, prefix=prefix, digest=hash_token(raw),
                                   created_at=now, expires_at=expires_at, scopes=sorted(set(scopes)),
                                   created_by=created_by)
        return token, raw

    def has_scope(self, scope: str) -> bool:
        return scope in (self.scopes or [])

    @property
    def is_usable(self) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()

    def revoke(self) -> list[ApiToken]:
        """Revoke this token and every token it created, transitively; the ones this call revoked, this one first
        when it was not revoked already. Its descendants are revoked even when it was (tokens of a version that
        did not cascade). Call in a transaction: accounts/actions.revoke_token does, and writes the audit rows."""
        now = timezone.now()
        revoked: list[ApiToken] = []
        if ApiToken.objects.filter(pk=self.pk, revoked_at__isnull=True).update(revoked_at=now):
            revoked.append(self)
        self.refresh_from_db(fields=["revoked_at"])
        # One query per generation, after this token's row is written (and so locked): a creation that locked this
        # row first has committed by now, and is seen here (accounts/actions.issue_token).
        seen = {self.pk}
        generation = [self.pk]
        while generation:
            children = list(ApiToken.objects.filter(created_by_id__in=generation).exclude(pk__in=seen)
                            .select_related("team").order_by("pk"))
            live = [child for child in children if child.revoked_at is None]
            if live:
                ApiToken.objects.filter(pk__in=[child.pk for child in live]).update(revoked_at=now)
                for child in live:
                    child.revoked_at = now
                revoked.extend(live)
            seen.update(child.pk for child in children)
            generation = [child.pk for child in children]
        return revoked


def _expiry(now: datetime, expires_in: timedelta | None) -> datetime | None:
    limit_days = max_token_lifetime_days()
    if expires_in is None:
        return now + timedelta(days=limit_days) if settings.API_TOKEN_MAX_LIFETIME_DAYS else None
    if expires_in > timedelta(days=limit_days):
        raise TokenLifetimeError(f"a token may live at most {limit_days} days (API_TOKEN_MAX_LIFETIME_DAYS)")
    return now + expires_in


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


def validate_quantity(value: str) -> None:
    """A Kubernetes quantity ("8Gi", "4", "500m"): the same grammar the planner reads resources with."""
    from django.core.exceptions import ValidationError

    from modelport.core import quantity  # plain code, no model: the one parser of quantities

    try:
        quantity.parse_quantity(value)
    except quantity.QuantityError as exc:
        raise ValidationError(str(exc)) from None


class TeamQuota(models.Model):
    """An operator's ceilings for one team, over the defaults in settings (DEPLOYMENT_MAX_*, TEAM_MAX_*); a field
    left blank keeps the default. `deployment_*` bound each deployment (per server or pod), `total_*` the sum over
    the team's deployments that are not stopped, canaries counted, on each runtime (deployments/ceilings.py)."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="quota")
    deployment_memory = models.CharField(max_length=32, blank=True, validators=[validate_quantity],
                                         help_text='Per server or pod, e.g. "16Gi"; blank: DEPLOYMENT_MAX_MEMORY')
    deployment_cpu = models.CharField(max_length=32, blank=True, validators=[validate_quantity],
                                      help_text='Cores per server or pod, e.g. "4"; blank: DEPLOYMENT_MAX_CPU')
    deployment_instances = models.PositiveIntegerField(
        null=True, blank=True, help_text="Model instances per server; blank: DEPLOYMENT_MAX_INSTANCES")
    deployment_replicas = models.PositiveIntegerField(
        null=True, blank=True, help_text="Replicas (autoscaling's maximum); blank: DEPLOYMENT_MAX_REPLICAS")
    deployment_gpus = models.PositiveIntegerField(null=True, blank=True,
                                                  help_text="GPUs per replica; blank: DEPLOYMENT_MAX_GPUS")
    total_memory = models.CharField(max_length=32, blank=True, validators=[validate_quantity],
                                    help_text="The team's memory on each runtime; blank: TEAM_MAX_MEMORY")
    total_cpu = models.CharField(max_length=32, blank=True, validators=[validate_quantity],
                                 help_text="The team's cores on each runtime; blank: TEAM_MAX_CPU")
    total_gpus = models.PositiveIntegerField(null=True, blank=True,
                                             help_text="The team's GPUs on each runtime; blank: TEAM_MAX_GPUS")
    total_replicas = models.PositiveIntegerField(
        null=True, blank=True, help_text="The team's servers or pods on each runtime; blank: TEAM_MAX_REPLICAS")

    def __str__(self) -> str:
        return f"quota of {self.team}"
