"""The sample buttons' work (web/samples.py), in the inspection lane: it trains, inspects and plans for up to a few
inspections' time, which no page request should wait for, and which must never hold up a tick."""

from __future__ import annotations

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.contrib.auth import get_user_model

from accounts.models import Team
from audit.log import record as audit
from web import samples

_LIMIT = samples.run_limit_seconds()


@shared_task(acks_late=True, soft_time_limit=_LIMIT, time_limit=_LIMIT + settings.INSPECTION_KILL_GRACE_SECONDS)
def deploy_sample(team_id: int, user_id: int, which: str) -> None:
    """Make the sample's models and deployment (idempotent: a message delivered twice reuses what the first made);
    a failure is written where the progress page reads it."""
    team = Team.objects.filter(pk=team_id).first()
    if team is None or which not in samples.SAMPLES:
        return
    user = get_user_model().objects.filter(pk=user_id).first()
    try:
        made = samples.deploy_sample(team, user, which)
    except samples.SampleError as exc:
        audit(user, team, samples.FAILED, which, error=str(exc)[:2000])
    except SoftTimeLimitExceeded:
        audit(user, team, samples.FAILED, which,
              error=f"The sample took longer than {_LIMIT} s to make; click the button again to finish it.")
    except Exception:
        audit(user, team, samples.FAILED, which,
              error="The sample could not be made (an error in the portal; the worker's log has it).")
        raise
    else:
        audit(user, team, samples.DONE, which, deployment=made.deployment.name, created=made.created)
