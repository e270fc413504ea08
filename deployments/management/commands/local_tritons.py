"""The local Triton servers that run from this MODELPORT_VAR_DIR, dedicated ones and pools' (var/pools/): what keeps
running when the portal stops.

They run in sessions of their own, so stopping the portal (Ctrl-C, `make stop`) leaves them alone, and the next
start adopts them. bin/run-portal lists them when it stops and `make stop-triton` stops them. They are found by
their processes, not the database, so that this also works while the database is down; their deployments' names
come from the database when it answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError

from deployments.runtimes.local import triton as local_triton


@dataclass(frozen=True)
class LocalTriton:
    pid: int
    deployment_id: int
    revision: int


@dataclass(frozen=True)
class PoolTriton:
    pid: int
    pool: str


def _tritons(pattern: re.Pattern[bytes]) -> list[tuple[int, re.Match[bytes]]]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        match = pattern.search(cmdline)
        if match and local_triton.is_alive(int(proc.name)):
            found.append((int(proc.name), match))
    return found


def running_tritons(deployments_dir: Path) -> list[LocalTriton]:
    """tritonserver processes whose model repository lies under `deployments_dir` ({id}/r{number}/repository)."""
    pattern = re.compile(rb"--model-repository=" + re.escape(str(deployments_dir).encode()) + rb"/(\d+)/r(\d+)/")
    found = [LocalTriton(pid=pid, deployment_id=int(match[1]), revision=int(match[2]))
             for pid, match in _tritons(pattern)]
    return sorted(found, key=lambda t: (t.deployment_id, t.revision))


def running_pool_tritons(pools_dir: Path) -> list[PoolTriton]:
    """tritonserver processes whose model repository is a pool's under `pools_dir` (<pool>/repository)."""
    pattern = re.compile(rb"--model-repository=" + re.escape(str(pools_dir).encode()) + rb"/([^/\0]+)/repository")
    found = [PoolTriton(pid=pid, pool=match[1].decode(errors="replace")) for pid, match in _tritons(pattern)]
    return sorted(found, key=lambda t: (t.pool, t.pid))


def _names(ids: set[int]) -> dict[int, str]:
    from deployments.models import Deployment

    try:
        return {d.pk: str(d) for d in Deployment.objects.filter(pk__in=ids).select_related("team")}
    except DatabaseError:
        return {}


class Command(BaseCommand):
    help = ("List the local Triton servers of this MODELPORT_VAR_DIR that keep running without the portal "
            "(--stop: stop them).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--stop", action="store_true", help="stop them (SIGTERM, SIGKILL after the grace period)")

    def handle(self, *args: Any, **options: Any) -> None:
        tritons = running_tritons(Path(settings.DEPLOYMENTS_DIR).resolve())
        names = _names({t.deployment_id for t in tritons}) if tritons else {}
        grace = settings.TRITON_STOP_GRACE_SECONDS
        for triton in tritons:
            name = names.get(triton.deployment_id, f"deployment #{triton.deployment_id}")
            if options["stop"]:
                local_triton.stop_server(triton.pid, grace_seconds=grace)
                self.stdout.write(f"stopped Triton pid {triton.pid} ({name}, revision {triton.revision})")
            else:
                self.stdout.write(f"Triton pid {triton.pid} ({name}, revision {triton.revision})")
        if options["stop"] and tritons:
            _note_dedicated_stopped([t.pid for t in tritons])
        stopped = []
        for shared in running_pool_tritons(Path(settings.POOLS_DIR).resolve()):
            if options["stop"]:
                local_triton.stop_server(shared.pid, grace_seconds=grace)
                stopped.append(shared.pid)
                self.stdout.write(f"stopped Triton pid {shared.pid} (pool {shared.pool!r})")
            else:
                self.stdout.write(f"Triton pid {shared.pid} (pool {shared.pool!r})")
        if stopped:
            _forget_pool_servers(stopped)


def _note_dedicated_stopped(pids: list[int]) -> None:
    """Tell each dedicated server's deployment, at the next health check, that an operator stopped it (not a crash),
    when the database answers; else that check reports it died."""
    from deployments.runtimes.local.runtime import mark_stopped_by_operator

    try:
        mark_stopped_by_operator(pids)
    except (DatabaseError, OSError):
        pass


def _forget_pool_servers(pids: list[int]) -> None:
    """Mark the stopped pool servers' rows (their loaded revisions load again at the next need), when the database
    answers; else the next look at the pool finds them gone and does it."""
    from deployments.runtimes.local import pool

    try:
        pool.mark_stopped(pids, "was stopped by an operator (make stop-triton)")
    except DatabaseError:
        pass
