"""The runtime env the operator configured (settings.MODELPORT_RUNTIME_ENV) and the frameworks installed in it,
for the pages, the system checks and the local runtime; the core (modelport.core.frameworks) reads no settings."""

from __future__ import annotations

from django.conf import settings

from modelport.core import frameworks


def local_frameworks() -> dict[str, str]:
    """{framework name: version} of the configured runtime env ({} when there is none)."""
    return frameworks.installed_in(settings.MODELPORT_RUNTIME_ENV)


def local_framework_status() -> list[frameworks.FrameworkStatus]:
    """Every optional framework with its installed version, for the upload page and the deploy form."""
    return frameworks.framework_status(local_frameworks())
