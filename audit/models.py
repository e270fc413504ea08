from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from accounts.models import Team


class AuditEntry(models.Model):
    """Who created, changed, stopped or deleted what, and when. Written in the same transaction as the change."""

    time = models.DateTimeField(default=timezone.now, db_index=True)
    team = models.ForeignKey(Team, null=True, on_delete=models.SET_NULL, related_name="audit_entries")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    # Kept as text too, so the log still reads right after a user or team is deleted.
    username = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=64)  # "deployment.stop", "model_version.create", ...
    target = models.CharField(max_length=200)  # "digits-prod", "digits:3"
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        verbose_name_plural = "audit entries"  # not Django's "audit entrys"
        ordering = ["-time", "-id"]
        # action: /metrics counts each deployment's rollbacks at every scrape (deployments/portal_metrics.py),
        # reading only those rows rather than the whole log.
        indexes = [models.Index(fields=["team", "-time"]), models.Index(fields=["action"], name="audit_action")]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.username} {self.action} {self.target}"
