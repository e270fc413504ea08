"""A canary's judge: reads the window's figures of the canary and of the stable revision from the statistics the
gateway processes write (gateway/stats.py, one row per deployment, revision and 10 s bucket, so every gateway process
counts), asks the guardrails for their verdict (deployments/canary.py: `decide`, a pure function of the figures) and
acts on it through the same promote and rollback actions as a user, with the figures as the reason. Beat runs it
every CANARY_CHECK_SECONDS (gateway.tasks.check_canaries)."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from deployments import actions
from deployments.canary import Figures, Verdict, decide
from deployments.models import Deployment
from gateway.models import RequestStats
from gateway.stats import BUCKET_SECONDS, summarize


def figures(deployment_id: int, revision: int, since: timedelta | None = None, *, after: object = None) -> Figures:
    rows = RequestStats.objects.filter(deployment_id=deployment_id, revision=revision)
    if since is not None:
        rows = rows.filter(bucket_start__gte=timezone.now() - since)
    if after is not None:
        rows = rows.filter(bucket_start__gte=after)
    summary = summarize(list(rows), since or timedelta(seconds=1))
    return Figures(summary["requests"], summary["errors"], summary["p99_ms"])


def judge(deployment_id: int) -> Verdict:
    """Look at a serving canary's window and roll it back or promote it when its guardrails say so."""
    deployment = Deployment.objects.select_related("team", "canary_revision", "serving_revision").filter(
        pk=deployment_id).first()
    if (deployment is None or deployment.canary_revision is None or deployment.serving_revision is None
            or not deployment.canary_upstream_url or deployment.canary_serving_since is None):
        return Verdict("wait")
    canary, stable, serving_for = window_figures(deployment)
    verdict = decide(deployment, canary, stable, serving_for)
    canary_number = deployment.canary_revision.number
    if verdict.action == "rollback":
        actions.rollback_canary(deployment, None, reason=verdict.reason, expect_revision=canary_number)
    elif verdict.action == "promote":
        actions.promote_canary(deployment, None, reason=verdict.reason, expect_revision=canary_number)
    return verdict


def window_figures(deployment: Deployment) -> tuple[Figures, Figures, float]:
    """The canary's and the stable revision's figures the guardrails judge, and the seconds the canary has served (the
    deployment page shows what they judge from the same)."""
    assert deployment.canary_revision is not None and deployment.serving_revision is not None
    assert deployment.canary_serving_since is not None
    window = timedelta(seconds=deployment.canary_window_seconds)
    # Both revisions over the same interval: the window, and only since the canary serves. The stable revision's
    # figures from before the canary (a quieter machine) are no yardstick for the canary's.
    since = deployment.canary_serving_since
    bucket_of_start = since - timedelta(seconds=since.timestamp() % BUCKET_SECONDS)
    canary = figures(deployment.pk, deployment.canary_revision.number, window, after=bucket_of_start)
    stable = figures(deployment.pk, deployment.serving_revision.number, window, after=bucket_of_start)
    return canary, stable, (timezone.now() - since).total_seconds()


def serving_canaries() -> list[int]:
    return list(Deployment.objects.filter(canary_revision__isnull=False, desired_state=Deployment.Desired.RUNNING)
                .exclude(canary_upstream_url="").order_by("pk").values_list("pk", flat=True))
