from __future__ import annotations

import logging

from deployments.models import Deployment, Event, bounded_message

log = logging.getLogger("deployments.events")


def record(deployment: Deployment, kind: str, message: str) -> Event:
    message = bounded_message(message)
    log.info("%s: %s", deployment, message.splitlines()[0] if message else "")
    return Event.objects.create(deployment=deployment, kind=kind, message=message)
