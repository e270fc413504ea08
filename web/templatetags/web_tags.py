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


@register.filter
def status_words(deployment: Any) -> str:
    """The status as a user should read it: "updating (serving r1)" while revision 2 rolls out and 1 serves, "failed
    (serving r1)" when it did not make it, "deleting" rather than "stopping" on the way out."""
    status = deployment.status
    serving = deployment.serving_revision
    rolling = (serving is not None and deployment.upstream_url
               and deployment.revision_id != deployment.serving_revision_id)
    if rolling and status in ("pending", "rendering", "building", "starting"):
        return f"updating (serving r{serving.number})"
    if rolling and status == "failed":
        return f"failed (serving r{serving.number})"
    if status == "stopping" and deployment.desired_state == "deleted":
        return "deleting"
    return str(status)


@register.filter
def percent(value: Any) -> str:
    """0.0123 as "1.2%", None as "–"."""
    if value is None:
        return "–"
    share = float(value) * 100
    return f"{share:.0f}%" if share == 0 or share >= 10 else f"{share:.1f}%"


@register.filter
def served_as(value: Any, max_batch_size: Any) -> str:
    """How Triton serves a tensor of a model's own signature when it differs ("-1 × 1" for a [batch] tensor of a
    batching model), else ""."""
    from deployments.render import served_dims

    declared = list(value or [])
    served = served_dims(declared, int(max_batch_size or 0) > 0)
    return dims(served) if served != declared else ""


@register.filter
def example_inputs(request: Any) -> str:
    """A version's stored example request in a few words, its inputs and shapes ("image BYTES 1 × 1"): the request
    itself may be a megabyte (an image in base64), too much for the versions table. Bounded, since it is the
    uploader's JSON as sent until inspection checks it (a name of a megabyte)."""
    inputs = request.get("inputs") if isinstance(request, dict) else None
    tensors = [t for t in (inputs if isinstance(inputs, list) else []) if isinstance(t, dict)]
    words = []
    for tensor in tensors[:8]:
        shape = tensor.get("shape")
        fits = isinstance(shape, list) and len(shape) <= 8 and all(type(n) is int for n in shape)
        words.append(f"{str(tensor.get('name'))[:64]} {str(tensor.get('datatype'))[:16]} "
                     f"{dims(shape) if fits else '?'}")
    return ", ".join(words) + (f" and {len(tensors) - 8} more" if len(tensors) > 8 else "")
