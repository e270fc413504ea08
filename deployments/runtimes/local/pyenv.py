"""The python environments a local Triton runs with: the runtime env (the serving environment, found once per
process) and, over it, an environment per requirement set of a revision's python models (deployments/pyenvs.py does
the building; this module says which one a revision needs and whether it is built)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from django.conf import settings

from deployments import pyenvs
from deployments.models import Revision
from deployments.render import RenderError
from deployments.revision_spec import RevisionSpec
from deployments.runtimes.base import PREPARED, Preparation, PreparationFailed, RuntimeUnavailable
from modelport.core import requirements as requirement_lines
from modelport.core.runtime_env import RuntimeEnv, RuntimeEnvError, find_runtime_env, server_environment

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def runtime_env() -> RuntimeEnv:
    return find_runtime_env(settings.MODELPORT_RUNTIME_ENV)


@dataclass(frozen=True)
class PythonEnv:
    """The environment a revision's Triton runs with: its python models' requirements installed over the runtime
    env."""

    key: str
    requirements: tuple[str, ...]
    identity: pyenvs.RuntimeIdentity

    @property
    def env_dir(self) -> Path:
        return pyenv_layout().env_dir(self.key)

    @property
    def site_packages(self) -> Path:
        return pyenv_layout().site_packages(self.key, self.identity)


def pyenv_layout() -> pyenvs.Layout:
    return pyenvs.Layout(Path(settings.PYENVS_DIR))


def python_env_for(spec: RevisionSpec) -> PythonEnv | None:
    """The environment the revision needs: the union of its python models' requirements (pipeline steps
    included; one Triton runs them all), normalized. None when they need nothing the runtime env lacks.

    Raises RequirementError (a line that is not a plain requirement, or one the runtime env contradicts),
    RuntimeEnvError (no runtime env) or pyenvs.BuildError (its python cannot run)."""
    lines = [line for entry in spec.models for line in entry.requirements]
    if not lines:
        return None
    parsed = requirement_lines.parse_requirements(lines)
    env = runtime_env()
    identity = pyenvs.runtime_identity(env.bin_dir / "python", env.site_packages,
                                       env=server_environment(env))
    conflicts = pyenvs.runtime_conflicts(parsed, identity)
    if conflicts:  # pip could only fail on them, saying ResolutionImpossible: said here, naming the line
        raise requirement_lines.RequirementError("; ".join(conflicts))
    if all(pyenvs.satisfied_by(r, identity) for r in parsed):
        return None
    requirements = requirement_lines.normalized(parsed)
    return PythonEnv(pyenvs.env_key(requirements, identity), requirements, identity)


def pip_options() -> pyenvs.PipOptions:
    return pyenvs.PipOptions(index_url=settings.MODELPORT_PIP_INDEX_URL, find_links=settings.MODELPORT_PIP_FIND_LINKS,
                             timeout_seconds=settings.MODELPORT_PIP_TIMEOUT_SECONDS)


def _requested_for_at_most() -> float:
    """A build asked for longer ago than this is presumed lost (its worker died): ask again."""
    return float(settings.MODELPORT_PIP_TIMEOUT_SECONDS) + 120.0


def prepare_python_env(revision: Revision) -> Preparation:
    """Is the revision's environment built? If nobody builds it, the answer asks for its build (the reconciler
    queues it for a worker on the inspection queue: never in a web request nor in a tick). A failed build fails the
    revision with pip's lines."""
    try:
        penv = python_env_for(revision.spec)
    except requirement_lines.RequirementError as exc:
        raise RenderError({"requirements": [str(exc)]}) from None
    except RuntimeEnvError as exc:
        raise RuntimeUnavailable(f"The local runtime cannot install python packages: {exc}") from None
    except pyenvs.BuildError as exc:
        raise RuntimeUnavailable(str(exc)) from None
    if penv is None:
        return PREPARED
    layout = pyenv_layout()
    found = pyenvs.state_of(layout, penv.key, _requested_for_at_most())
    if found.state == "built":
        return PREPARED
    if found.state == "failed":
        detail = pyenvs.forget_failure(layout, penv.key) or found.message
        # pip's last "ERROR:" line says it in one line (the CLI and the badges show the first line of a status).
        errors = [line.removeprefix("ERROR:").strip() for line in detail.splitlines() if line.startswith("ERROR:")]
        raise PreparationFailed(f"pip could not install its python packages ({', '.join(penv.requirements)})"
                                + (f": {errors[-1]}" if errors else ""), detail)
    return Preparation(False, f"Installing python packages for revision {revision.number}: "
                              f"{', '.join(penv.requirements)}.", retry_seconds=2.0, building=True,
                       build=found.state == "missing")


def mark_build_requested(revision_id: int) -> str | None:
    """Record that the revision's environment is about to be queued for a build, so that the next ticks wait for it
    rather than queue it again; its key (for forget_build_request), None when it needs no environment."""
    revision = Revision.objects.filter(pk=revision_id).first()
    penv = python_env_for(revision.spec) if revision is not None else None
    if penv is None:
        return None
    pyenvs.mark_requested(pyenv_layout(), penv.key, penv.requirements)
    return penv.key


def forget_build_request(key: str) -> None:
    """The build could not be queued (the broker is down): the next tick asks for it again."""
    pyenv_layout().requested_file(key).unlink(missing_ok=True)


def build_python_env(revision_id: int) -> int | None:
    """Build the revision's environment (the Celery task's work); the id of its deployment, None when there is
    nothing to build (the revision is gone, or needs no environment)."""
    revision = Revision.objects.select_related("deployment").filter(pk=revision_id).first()
    if revision is None:
        return None
    try:
        penv = python_env_for(revision.spec)
    except (requirement_lines.RequirementError, RuntimeEnvError, pyenvs.BuildError) as exc:
        log.warning("no python environment for revision %s: %s", revision_id, exc)
        return revision.deployment_id
    if penv is None:
        return None
    env = runtime_env()
    started = time.monotonic()
    result = pyenvs.build(pyenv_layout(), penv.key, penv.requirements, env.bin_dir / "python", env.site_packages,
                          penv.identity, pip_options())
    log.info("python environment %s for %s: %s in %.1f s", penv.key, ", ".join(penv.requirements), result.outcome,
             time.monotonic() - started)
    return revision.deployment_id
