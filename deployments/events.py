from __future__ import annotations

import logging
from datetime import UTC, timedelta

from django.conf import settings
from django.utils import timezone

from deployments.models import Deployment, Event, bounded_message

log = logging.getLogger("deployments.events")


def record(deployment: Deployment, kind: str, message: str) -> Event:
    message = bounded_message(message)
    log.info("%s: %s", deployment, message.splitlines()[0] if message else "")
    return Event.objects.create(deployment=deployment, kind=kind, message=message)


def record_repeated(deployment: Deployment, kind: str, reason: str, message: str) -> Event:
    """An event that may come every few seconds for as long as a deployment is used so (a shared model unloaded
    while idle and loaded again by the next request, all day long), coalesced as Kubernetes coalesces its events:
    the latest event of the same `reason` is updated in place (the latest message, its time now, its count one
    more) when it began within EVENT_REPEAT_WINDOW_SECONDS and no other event of the deployment came since it began;
    else a row is added. So such churn writes at most one row per reason per window (at the default hour, 24 a day
    per reason, however often it happens), one UPDATE per occurrence, and the deployment's other events are never
    pushed off its page by it (each one of them starts the next run afresh). Only the deployment's own rows are
    read or written: one team's churn costs another team's lists nothing. EVENT_REPEAT_WINDOW_SECONDS 0: a row
    each time."""
    message = bounded_message(message)
    now = timezone.now()
    window = settings.EVENT_REPEAT_WINDOW_SECONDS
    if window > 0:
        since = now - timedelta(seconds=window)
        other = (Event.objects.filter(deployment=deployment, reason="").order_by("-time", "-id")
                 .values_list("time", flat=True).first())
        if other is not None and other > since:
            since = other
        run = (Event.objects.filter(deployment=deployment, reason=reason, first_time__gte=since)
               .order_by("-time", "-id").first())
        if run is not None and run.first_time is not None:
            count = run.count + 1
            text = bounded_message(f"{message} ({count} times since {run.first_time.astimezone(UTC):%H:%M:%S} UTC; "
                                   "this is the latest)")
            # Conditional on the count read: of two processes telling the same run at once, the second adds a row.
            if Event.objects.filter(pk=run.pk, count=run.count).update(count=count, time=now, kind=kind,
                                                                       message=text):
                log.info("%s: %s", deployment, text.splitlines()[0] if text else "")
                run.count, run.time, run.kind, run.message = count, now, kind, text
                return run
    log.info("%s: %s", deployment, message.splitlines()[0] if message else "")
    return Event.objects.create(deployment=deployment, kind=kind, message=message, reason=reason, first_time=now,
                                time=now)
