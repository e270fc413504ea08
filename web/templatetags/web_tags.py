"""Template helpers of the portal's pages."""

from __future__ import annotations

from typing import Any

from django import template

from accounts.context import current_membership
from accounts.models import Membership

register = template.Library()


@register.inclusion_tag("web/_team_menu.html", takes_context=True)
def team_menu(context: template.Context) -> dict[str, Any]:
    """The current team, and a switcher when the user is in more than one."""
    request = context["request"]
    current = current_membership(request)
    memberships = list(Membership.objects.filter(user=request.user).select_related("team").order_by("team__name"))
    return {"current": current, "memberships": memberships, "csrf_token": context.get("csrf_token")}


@register.filter
def dims(value: Any) -> str:
    """[-1, 3, 224, 224] as "-1 × 3 × 224 × 224" (-1: any size)."""
    return " × ".join(str(d) for d in value or []) or "scalar"


@register.filter
def ms(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.1f} ms" if value < 100 else f"{value:,.0f} ms"
