"""System checks of the deployments app (`manage.py check`, and every manage.py command's start).

The sandbox's capability check at start-up (docs/security.md): `manage.py check`, `migrate` (what `make run` runs
first) and `runserver` warn when this machine cannot sandbox the local Tritons; the Celery worker logs what it found
when it starts (deployments.tasks)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register


@register()
def runtime_extras(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """MODELPORT_RUNTIME_EXTRAS names frameworks the local runtime env should have; say which it lacks."""
    from deployments import local_env
    from modelport.core import frameworks

    if not settings.MODELPORT_RUNTIME_EXTRAS:
        return []
    unknown, missing = frameworks.check_configured_extras(settings.MODELPORT_RUNTIME_EXTRAS,
                                                          local_env.local_frameworks())
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


@register()
def sandbox_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from infra import sandbox_settings

    if not settings.SANDBOX_ENABLED:
        return [Warning("SANDBOX_ENABLED is false: local Tritons run unconfined, with the portal's privileges.",
                        hint="Unset SANDBOX_ENABLED unless you are debugging the sandbox itself.",
                        id="modelport.W020")]
    caps = sandbox_settings.sandbox_capabilities()
    if not caps.available:
        consequence = ("python models are refused (SANDBOX_REQUIRED)" if settings.SANDBOX_REQUIRED else
                       "python models run unconfined (SANDBOX_REQUIRED is false)")
        return [Warning(f"This machine cannot sandbox the local Tritons: {caps.reason}; {consequence}.",
                        hint="docs/security.md says what the sandbox needs from the kernel.", id="modelport.W021")]
    return [Warning(f"The sandbox is weaker here: {note}.", id="modelport.W022") for note in caps.notes]


@register()
def visibility_timeout_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Redis hands a task to a second worker once it has run longer than the visibility timeout: the timeout must
    exceed the longest task, an inspection with its trial run."""
    timeout = (getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {}).get("visibility_timeout")
    if timeout is None or timeout > settings.TRIAL_RUN_TIMEOUT_SECONDS * 2:
        return []
    return [Warning(f"CELERY_VISIBILITY_TIMEOUT ({timeout} s) is not well above TRIAL_RUN_TIMEOUT_SECONDS "
                    f"({settings.TRIAL_RUN_TIMEOUT_SECONDS:g} s): Redis may deliver a running inspection to a second "
                    "worker.", hint="Raise CELERY_VISIBILITY_TIMEOUT (default 1800).", id="modelport.W030")]


@register()
def pool_namespace_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The pools open to every team have a namespace of their own: no team may be mapped to it (a team whose name
    makes it, such as `pools` with the default prefix, is refused at rollout: KubernetesConfig.namespace_for)."""
    teams = sorted(team for team, namespace in settings.KUBERNETES_NAMESPACES.items()
                   if namespace == settings.KUBERNETES_POOL_NAMESPACE)
    if not teams:
        return []
    return [Error(f"KUBERNETES_NAMESPACES maps {', '.join(map(repr, teams))} to {settings.KUBERNETES_POOL_NAMESPACE}, "
                  "KUBERNETES_POOL_NAMESPACE, where the pools open to every team run",
                  hint="Map the team to a namespace of its own, or set KUBERNETES_POOL_NAMESPACE to another.",
                  id="modelport.E040")]
