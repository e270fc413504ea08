"""The periodic clean-up of this var/'s local serving leftovers: Tritons no database row knows, scratch
directories and cgroups no live server uses, python environments no running deployment needs."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from django.conf import settings

from deployments import pyenvs
from deployments.models import Deployment, PoolServer, TritonServer
from deployments.runtimes.local import confined, pyenv
from deployments.runtimes.local import triton as local_triton
from deployments.runtimes.local.files import repository_dir
from infra import sandbox_settings
from modelport.core import requirements as requirement_lines
from modelport.core.runtime_env import RuntimeEnvError
from modelport.core.sandbox import cgroups

log = logging.getLogger(__name__)


def sweep_orphans() -> list[str]:
    """Stop the Tritons of this var/ that no starting or ready TritonServer row (a dedicated server) nor running
    PoolServer row (a pool's, under var/pools/) knows, one a worker spawned just before it died, say, once they are
    TRITON_ORPHAN_GRACE_SECONDS old, and remove cgroups and scratch directories that no live server uses. Returns a
    line per thing removed."""
    live = list(TritonServer.objects.filter(state__in=[TritonServer.State.STARTING, TritonServer.State.READY])
                .values("pid", "sandbox_id", "cgroups"))
    live += list(PoolServer.objects.filter(state=PoolServer.State.RUNNING).values("pid", "sandbox_id", "cgroups"))
    known_pids = {row["pid"] for row in live}
    grace = settings.TRITON_ORPHAN_GRACE_SECONDS
    done = []
    for where in (Path(settings.DEPLOYMENTS_DIR), Path(settings.POOLS_DIR)):
        for pid in local_triton.find_servers(f"{where}/"):
            if pid not in known_pids and local_triton.process_age(pid) >= grace:
                its_cgroups = _cgroups_of(pid)
                local_triton.stop_server(pid, grace_seconds=settings.TRITON_STOP_GRACE_SECONDS)
                done.append(f"stopped an orphaned Triton (pid {pid})")
                log.warning("Stopped an orphaned Triton (pid %s) that no database row knows.", pid)
                # Its processes may take a moment to leave the cgroup after the kill (more on a loaded machine):
                # wait for them here, as a normal stop does, rather than leave the cgroup to a later sweep.
                if its_cgroups and confined.remove_cgroups(its_cgroups):
                    done += [f"removed the cgroup {directory}" for directory in its_cgroups]
    known_ids = {row["sandbox_id"] for row in live}
    cutoff = time.time() - grace
    scratches = [*Path(settings.DEPLOYMENTS_DIR).glob("*/scratch/*"), *Path(settings.POOLS_DIR).glob("*/scratch/*")]
    for scratch in scratches:
        if scratch.name not in known_ids and _mtime(scratch) < cutoff:
            shutil.rmtree(scratch, ignore_errors=True)
            done.append(f"removed the scratch directory {scratch}")
    done += collect_python_envs()
    known_cgroups = {directory for row in live for directory in row["cgroups"]}
    layout = sandbox_settings.sandbox_capabilities().cgroups
    for parent in layout.parents.values():
        for directory in parent.glob(f"mp-{sandbox_settings.var_tag()}-*"):
            # Old enough too: a launcher joins its cgroup a moment after it is made, before any row knows it.
            if str(directory) not in known_cgroups and _mtime(directory) < cutoff \
                    and not cgroups.members([directory]) and cgroups.remove([directory], wait_seconds=0):
                done.append(f"removed the cgroup {directory}")
    return done


def collect_python_envs() -> list[str]:
    """Remove python environments that no revision of a running deployment needs, unused for
    PYENV_KEEP_UNUSED_SECONDS (a stopped deployment started again within that time finds its environment)."""
    layout = pyenv.pyenv_layout()
    if not layout.root.is_dir():
        return []
    in_use = set()
    running = Deployment.objects.filter(desired_state=Deployment.Desired.RUNNING).select_related(
        "revision", "serving_revision", "canary_revision")
    # A canary being prepared has no server yet: its environment is needed all the same.
    revisions = [r for d in running for r in (d.revision, d.serving_revision, d.canary_revision) if r is not None]
    for server in TritonServer.objects.filter(state__in=[TritonServer.State.STARTING, TritonServer.State.READY]) \
            .select_related("revision", "deployment"):
        try:
            in_use.add((repository_dir(server.revision).parent / "pyenv").read_text().strip())
        except OSError:
            pass
    for revision in revisions:
        if not any(m.requirements for m in revision.spec.models):
            continue
        try:
            penv = pyenv.python_env_for(revision.spec)
        except (requirement_lines.RequirementError, RuntimeEnvError, pyenvs.BuildError):
            continue
        if penv is not None:
            in_use.add(penv.key)
    return pyenvs.collect_garbage(layout, in_use, float(settings.PYENV_KEEP_UNUSED_SECONDS))


def _cgroups_of(pid: int) -> list[Path]:
    """The cgroup directories of this var/'s sandboxes that the process is in (read before it is stopped)."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return []
    names = {line.rsplit("/", 1)[-1] for line in text.splitlines()}
    prefix = f"mp-{sandbox_settings.var_tag()}-"
    return [parent / name for parent in sandbox_settings.sandbox_capabilities().cgroups.parents.values()
            for name in sorted(names) if name.startswith(prefix) and (parent / name).is_dir()]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()
