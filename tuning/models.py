"""A tune: the search for the serving settings of a deployment's model that give the most throughput within a p99
latency target, measured on temporary Tritons of this machine (tuning/runner.py)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q


class TuneRun(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELLED = "cancelled"

    class Sample(models.TextChoices):
        GENERATED = "generated", "the Try-it example request"
        REQUEST = "request", "a request you supply"

    ACTIVE = (Status.QUEUED, Status.RUNNING)

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE, related_name="tunes")
    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="tunes")
    model_version = models.ForeignKey("models_registry.ModelVersion", on_delete=models.CASCADE, related_name="tunes")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    p99_target_ms = models.FloatField()
    concurrency_min = models.PositiveIntegerField(default=1)
    concurrency_max = models.PositiveIntegerField(default=16)
    budget_seconds = models.PositiveIntegerField()
    sample = models.CharField(max_length=16, choices=Sample.choices, default=Sample.GENERATED)
    request_body = models.JSONField(null=True, blank=True)  # the KServe v2 request the load generator sends

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    message = models.TextField(blank=True, default="")
    cancel_requested = models.BooleanField(default=False)
    # The machine it runs on; at most one running tune per host (the constraint below is the lock).
    host = models.CharField(max_length=255, blank=True, default="")
    machine = models.JSONField(default=dict, blank=True)  # hostname, cpu model, cores, gpu
    configs_done = models.PositiveIntegerField(default=0)
    configs_planned = models.PositiveIntegerField(default=0)
    eta_seconds = models.FloatField(null=True, blank=True)
    results = models.JSONField(default=list, blank=True)  # per setting: search.ConfigResult.to_json()
    frontier = models.JSONField(default=list, blank=True)  # [{"throughput", "p99_ms", "concurrency"}], by p99
    recommendation = models.JSONField(null=True, blank=True)  # search.Config.to_json() with its figures
    partial = models.BooleanField(default=False)
    applied_revision = models.PositiveIntegerField(null=True, blank=True)
    # The recommendation was what `applied_revision` served already: applying it made no revision, and the page
    # must not say it did.
    applied_unchanged = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["host"], condition=Q(status="running"), name="tuning_one_running_per_host"),
        ]

    def __str__(self) -> str:
        return f"tune {self.pk} of {self.deployment_id}"

    @property
    def active(self) -> bool:
        return self.status in self.ACTIVE

    def recommended_settings(self) -> dict[str, Any] | None:
        return (self.recommendation or {}).get("settings")
