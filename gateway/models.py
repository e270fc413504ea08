from __future__ import annotations

from django.db import models

from deployments.models import Deployment

# Upper bounds (milliseconds) of the latency histogram kept per time bucket; the last bucket is open-ended.
LATENCY_BUCKETS_MS: tuple[float, ...] = (
    0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 2000, 5000, 10000, float("inf"),
)

# A model's name in a deployment is a registry name (models_registry: at most 63 characters).
MODEL_KEY_MAX = 63


class RequestStats(models.Model):
    """Requests the gateway proxied for one deployment in one time bucket (written by the gateway every few
    seconds), for the dashboard's request rate and latency percentiles."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="request_stats")
    # The number of the revision that answered (a canary and its stable revision are counted apart); 0: none did
    # (refused before a revision was chosen).
    revision = models.PositiveIntegerField(default=0)
    # The model called, by its name in the deployment (the performance panel's gateway share per model); empty: none
    # named (/v2/health, the OpenAI API's model list), or a name the deployment lacks. Never the caller's text: a key
    # per name in a URL would grow the rows without bound (gateway/stats.py: model_key).
    model = models.CharField(max_length=MODEL_KEY_MAX, default="", blank=True)
    bucket_start = models.DateTimeField(db_index=True)
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    latency_sum_ms = models.FloatField(default=0)
    latency_histogram = models.JSONField(default=list)  # counts per LATENCY_BUCKETS_MS entry
    # Responses per HTTP status code, {"200": 97, "400": 2, "502": 1}: what the errors were, for the traffic panel.
    codes = models.JSONField(default=dict, blank=True)
    # Streams (issue 33, gateway/stream_figures.py): ended in the bucket, pieces sent, stream-seconds open (over a
    # window, / the window's seconds: the mean number open), time to first piece and between pieces (counts per
    # LATENCY_BUCKETS_MS entry), and {reason: streams} for how they ended.
    streams = models.PositiveIntegerField(default=0)
    stream_pieces = models.PositiveBigIntegerField(default=0)
    stream_seconds = models.FloatField(default=0)
    first_piece_histogram = models.JSONField(default=list, blank=True)
    piece_gap_histogram = models.JSONField(default=list, blank=True)
    stream_ends = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["deployment", "bucket_start"]
        constraints = [models.UniqueConstraint(fields=["deployment", "revision", "model", "bucket_start"],
                                               name="one_stats_row_per_revision_model_and_bucket")]

    def __str__(self) -> str:
        return f"{self.deployment} {self.bucket_start:%H:%M:%S}: {self.requests} requests"
