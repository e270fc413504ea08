"""The performance panel's periodic task: snapshots of the serving Tritons' statistics (performance/snapshots.py)."""

from __future__ import annotations

from celery import shared_task


@shared_task
def take_snapshots() -> int:
    from performance import snapshots

    return snapshots.take_snapshots()
