"""System checks of the deployments app (`manage.py check`, and every manage.py command's start)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register


@register()
def runtime_extras(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """MODELPORT_RUNTIME_EXTRAS names frameworks the local runtime env should have; say which it lacks."""
    from deployments import frameworks

    if not settings.MODELPORT_RUNTIME_EXTRAS:
        return []
    unknown, missing = frameworks.check_configured_extras(settings.MODELPORT_RUNTIME_EXTRAS,
                                                          frameworks.local_frameworks())
    messages: list[CheckMessage] = []
    if unknown:
        messages.append(Error(
            f"MODELPORT_RUNTIME_EXTRAS names {', '.join(map(repr, unknown))}, which is no runtime extra",
            hint=f"Use a comma-separated list of {', '.join(frameworks.BY_NAME)}.",
            id="modelport.E010",
        ))
    for framework in missing:
        messages.append(Warning(
            f"MODELPORT_RUNTIME_EXTRAS names {framework.name!r} but the runtime env ({settings.MODELPORT_RUNTIME_ENV}) "
            f"has no {framework.label}: the local runtime refuses {', '.join(framework.formats)} models",
            hint=f"Run `{framework.install_command}` ({framework.download}).",
            id="modelport.W010",
        ))
    return messages
