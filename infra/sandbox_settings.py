"""The sandbox's settings (SANDBOX_*) and what this machine's kernel offers, read here for everything that confines
uploaded code: the local runtime's Tritons (deployments.runtimes.local.confined), the trial run at inspection
(models_registry.trial), the start-up checks and the operator's overview. It sits below both apps, so that neither
reaches into the other (or into a runtime) for them."""

from __future__ import annotations

import hashlib
import logging
from functools import lru_cache

from django.conf import settings

from modelport.core import sandbox

log = logging.getLogger(__name__)


def sandbox_options() -> sandbox.Options:
    return sandbox.Options(
        uid=settings.SANDBOX_UID, gid=settings.SANDBOX_GID, shm_bytes=sandbox.memory_bytes(settings.SANDBOX_SHM_SIZE),
        scratch_bytes=sandbox.scratch_bytes(settings.SANDBOX_SCRATCH_SIZE),
        pids_max=settings.SANDBOX_PIDS_MAX, egress_ports=tuple(int(p) for p in settings.SANDBOX_EGRESS_PORTS),
        cgroup_parent=settings.SANDBOX_CGROUP_PARENT, nice=settings.SANDBOX_NICE,
    )


@lru_cache(maxsize=1)
def sandbox_capabilities() -> sandbox.Capabilities:
    """What this machine's kernel offers, checked once per process by building a throw-away sandbox."""
    if not settings.SANDBOX_ENABLED:
        return sandbox.Capabilities(False, "SANDBOX_ENABLED is false")
    caps = sandbox.check(sandbox_options())
    (log.info if caps.available and not caps.notes else log.warning)("Triton sandbox: %s", caps.describe())
    return caps


def var_tag() -> str:
    """Short and stable per VAR_DIR: names this var/'s cgroups, so that sweeping never touches another's."""
    return hashlib.sha256(str(settings.VAR_DIR).encode()).hexdigest()[:8]


def sandbox_name(suffix: str) -> str:
    """A sandbox's cgroup and host name, this var/'s prefix first: the sweep removes it once it is empty and old."""
    return f"mp-{var_tag()}-{suffix}"
