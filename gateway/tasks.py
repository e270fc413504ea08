"""The gateway's periodic tasks: a canary's guardrails, judged from the gateway's statistics, and the statistics'
retention."""

from __future__ import annotations

import logging

from celery import shared_task

log = logging.getLogger(__name__)


@shared_task
def check_canaries() -> int:
    """Periodic: judge every serving canary by its guardrails over its window (gateway/canary.py): roll it back,
    promote it, or let it run on. Returns how many were rolled back or promoted."""
    from gateway import canary

    acted = 0
    for deployment_id in canary.serving_canaries():
        try:
            acted += canary.judge(deployment_id).action != "wait"
        except Exception:  # one deployment's trouble (a promote that raced a rollback) must not stop the others
            log.exception("could not judge the canary of deployment %s", deployment_id)
    return acted


@shared_task
def prune_request_stats() -> int:
    """Periodic: delete the gateway's request buckets that no window reads any more (gateway/stats.py prune)."""
    from django.utils import timezone

    from gateway import stats

    return stats.prune(timezone.now())
