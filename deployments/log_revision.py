"""Which revision's Triton log a deployment's log answers show: the serving (stable) revision's unless one is asked
for. The newest server of the deployment was the wrong choice: after a canary rollback it is the rolled-back
canary's, while the stable revision serves every request and writes to a log of its own."""

from __future__ import annotations

from dataclasses import dataclass

from deployments.models import Deployment, Revision


class UnknownRevision(ValueError):
    """A revision number the deployment has no revision of (a 400 naming `revision`)."""


@dataclass(frozen=True)
class LogChoice:
    revision: Revision | None  # whose log (None: the deployment has no revision yet)
    role: str  # "serving", "canary", "starting" (not serving yet) or "retired"

    def label(self) -> str:
        """What the log panel and the CLI say about the log shown."""
        if self.revision is None:
            return "no revision yet"
        what = {"serving": "serving", "canary": "canary", "starting": "not serving yet",
                "retired": "no longer serving"}[self.role]
        return f"revision {self.revision.number} ({what})"


def choose(deployment: Deployment, number: int | None = None) -> LogChoice:
    """The serving revision's log by default (the revision being launched before any serves); revision `number`
    when asked for, the canary's say."""
    if number is None:
        revision = deployment.serving_revision or deployment.revision
    else:
        revision = Revision.objects.filter(deployment=deployment, number=number).first()
        if revision is None:
            raise UnknownRevision(f"{deployment.name} has no revision {number}")
    return LogChoice(revision, _role(deployment, revision))


def _role(deployment: Deployment, revision: Revision | None) -> str:
    if revision is None:
        return "starting"
    if revision.pk == deployment.serving_revision_id:
        return "serving"
    if revision.pk == deployment.canary_revision_id:
        return "canary"
    if revision.pk == deployment.revision_id:
        return "starting"
    return "retired"
