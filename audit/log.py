from __future__ import annotations

from typing import Any

from accounts.models import Team
from audit.models import AuditEntry


def record(user: Any, team: Team | None, action: str, target: str, **detail: Any) -> AuditEntry:
    """Call inside the transaction of the change, so the log and the change commit (or roll back) together."""
    authenticated = user is not None and getattr(user, "is_authenticated", False)
    return AuditEntry.objects.create(
        team=team,
        user=user if authenticated else None,
        username=user.get_username() if authenticated else "",
        action=action,
        target=target,
        detail=detail,
    )
