"""Inspection slots, fair between teams: at most INSPECTION_MAX_ACTIVE_PER_TEAM of a team's uploads are queued or
running for inspection at once. The others wait in the database (status validating, `inspection_queued_at` unset)
and are queued, oldest first, as the team's own inspections end; so one team's many uploads occupy at most that
many places in the inspection queue, and another team's upload is inspected after at most that many of theirs.

The count and the claim happen under the team's row lock (as tune requests do, tuning/actions.py), so two uploads at
once cannot both take the last slot. The state lives in the database, not the broker, so it works the same on the
filesystem broker and on Redis; the periodic `sweep` (beat, on the reconcile queue) repairs what the broker lost:
a queued inspection that never started is queued again, and one whose worker child was killed at the hard time
limit is marked invalid, which frees its slot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

import kombu.exceptions
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts.models import Team
from models_registry.models import ModelVersion

log = logging.getLogger(__name__)

V = ModelVersion.Status
# A queued inspection not started within this long was lost with the broker (a Redis restart): queue it again. Far
# above what a backlog of every team's slots can wait, since a duplicate would inspect the same bytes twice.
QUEUED_LOST_AFTER = timedelta(hours=1)
BROKER_DOWN = (kombu.exceptions.OperationalError, OSError)
# Queues one version's inspection (models_registry.tasks.send_inspection): this module decides which and when,
# the tasks module, which imports it, sends.
Send = Callable[[int], object]


def time_limit_message() -> str:
    return (f"The inspection did not finish within {settings.INSPECTION_TIME_LIMIT_SECONDS:g} s "
            "(INSPECTION_TIME_LIMIT_SECONDS) and was stopped. Check that the model loads and runs quickly on zeros, "
            "then upload it again.")


def dispatch(team_id: int, send: Send) -> list[int]:
    """Queue the team's oldest waiting inspections while it holds fewer slots than its limit, through `send` (the
    task's `delay`, passed by the layer that owns the tasks), after commit; the ids queued."""
    limit = settings.INSPECTION_MAX_ACTIVE_PER_TEAM
    with transaction.atomic():
        # NO KEY: rows that merely reference the team (a new version's model, an audit entry) are not held up.
        Team.objects.select_for_update(no_key=True).filter(pk=team_id).first()
        validating = ModelVersion.objects.filter(model__team_id=team_id, status=V.VALIDATING)
        free = limit - validating.filter(inspection_queued_at__isnull=False).count()
        if free <= 0:
            return []
        ids = list(validating.filter(inspection_queued_at__isnull=True).order_by("created_at", "pk")
                   .values_list("pk", flat=True)[:free])
        if ids:
            ModelVersion.objects.filter(pk__in=ids).update(inspection_queued_at=timezone.now())
            transaction.on_commit(lambda: _send(ids, send))
    return ids


def _send(ids: list[int], send: Send) -> None:
    for version_id in ids:
        try:
            send(version_id)
        except BROKER_DOWN as exc:
            # The slot is given back; the sweep queues it again once the broker is back.
            log.warning("could not queue the inspection of version %s (broker unreachable: %s)", version_id, exc)
            ModelVersion.objects.filter(pk=version_id, inspection_started_at__isnull=True).update(
                inspection_queued_at=None)


def started(version_id: int) -> bool:
    """Claim the inspection and mark it begun (the time-limit sweep counts from here); False when there is nothing to
    inspect or another inspection of it has begun. Only one inspection may run per version: two at once (a message
    delivered twice, a sample inspected in the web process while the worker takes its queued task) raced, the
    second finding the bytes the first had moved to their blob and marking a good upload invalid. A claimed
    inspection that never ends is the sweep's (marked invalid past the hard time limit), never a second run's."""
    return bool(ModelVersion.objects.filter(pk=version_id, status=V.VALIDATING, inspection_started_at__isnull=True)
                .update(inspection_started_at=timezone.now(), inspection_queued_at=timezone.now()))


def finished(version_id: int, send: Send) -> None:
    """An inspection ended (ready, invalid, or gone): its team's next waiting upload takes the slot."""
    team_id = ModelVersion.objects.filter(pk=version_id).values_list("model__team_id", flat=True).first()
    if team_id is not None:
        dispatch(team_id, send)


def mark_timed_out(version_id: int) -> bool:
    return bool(ModelVersion.objects.filter(pk=version_id, status=V.VALIDATING).update(
        status=V.INVALID, error=time_limit_message(), validated_at=timezone.now()))


def sweep(send: Send) -> int:
    """Periodic: mark invalid what the hard time limit killed, queue again what the broker lost, then fill every
    team's free slots. Returns how many inspections were queued."""
    now = timezone.now()
    past_hard_limit = now - timedelta(seconds=settings.INSPECTION_TIME_LIMIT_SECONDS
                                      + settings.INSPECTION_KILL_GRACE_SECONDS + 30)
    for version_id in ModelVersion.objects.filter(status=V.VALIDATING, inspection_started_at__lt=past_hard_limit
                                                  ).values_list("pk", flat=True):
        if mark_timed_out(version_id):
            log.warning("version %s: its inspection was killed at the hard time limit; marked invalid", version_id)
    ModelVersion.objects.filter(status=V.VALIDATING, inspection_started_at__isnull=True,
                                inspection_queued_at__lt=now - QUEUED_LOST_AFTER).update(inspection_queued_at=None)
    teams = (ModelVersion.objects.filter(status=V.VALIDATING, inspection_queued_at__isnull=True)
             .values_list("model__team_id", flat=True).distinct())
    return sum(len(dispatch(team_id, send)) for team_id in set(teams))
