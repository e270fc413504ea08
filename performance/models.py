from __future__ import annotations

from django.db import models

from deployments.models import Deployment


class TritonSnapshot(models.Model):
    """A revision's Triton counters at one moment (performance/figures.py: ModelCounters.to_json per model name),
    taken every PERFORMANCE_SNAPSHOT_SECONDS by a periodic task, never per request. Kept for the longest window the
    API offers (performance/windows.py): at most that window / the interval rows per serving revision."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="triton_snapshots")
    revision = models.PositiveIntegerField()  # the revision's number
    taken_at = models.DateTimeField(db_index=True)
    counters = models.JSONField(default=dict)

    class Meta:
        ordering = ["deployment", "revision", "taken_at"]
        indexes = [models.Index(fields=["deployment", "revision", "taken_at"], name="snapshot_by_revision_time")]

    def __str__(self) -> str:
        return f"{self.deployment} r{self.revision} {self.taken_at:%H:%M:%S}"
