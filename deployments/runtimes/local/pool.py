"""A pool's shared Triton on this machine (issue 24): one sandboxed tritonserver per pool in explicit model-control
mode, into which deployments' revisions are loaded under names unique to deployment and revision.

- Files: a revision is rendered as for a dedicated server, its models renamed `d<deployment>-r<revision>-<model>`
  (ensemble steps too), and moved into the pool's repository (var/pools/<pool>/repository), which the sandbox
  mounts read-only.
- Loads go through Triton's repository API (an admin API: the server's own key). One pool's unloads, (re)starts and
  the bookkeeping around each load (room, rows, cgroups) take the pool's file lock, across worker and gateway
  processes; while Triton loads, only the team's own lock is held (team_locked), so that one team's slow load never
  holds another's (issue 30).
- Each model's processes run in a memory cgroup of their own, limited to its reservation (pools.reservations: its
  measured peak with headroom), which is what its team is charged; its figure is that cgroup's peak, read after the
  load and at each refresh (pool_memory.py): a model past its memory loses its own process, never the pool's Triton,
  and loads side by side never count in each other's figures. A model whose process its limit ended, at a load (a
  model never measured that needs more than its first reservation) or under use, is loaded again at the next pass
  with twice that limit while its team's share has room; past it its deployment fails naming what it needs.
- A load that would pass the pool's budget first evicts the least recently used models idle for
  POOL_EVICTION_MIN_IDLE_SECONDS, then is refused with a message naming what to unload.
- A server that died is found by whoever looks next (a health check, a request): it is started again on the same
  ports where they are free, and the revisions that were loaded in it are loaded again.
- A server in which no deployment has models for POOL_EMPTY_SERVER_STOP_SECONDS is stopped (stop_empty_servers);
  the orphan sweep (runtime.sweep_orphans) stops a pool Triton that no running PoolServer row knows.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from deployments import events, local_env, pool_events, pool_names, pool_policy, pools, pyenvs
from deployments.models import Deployment, Event, ModelMemory, Pool, PoolLoad, PoolServer, Revision
from deployments.render import render_repository
from deployments.revision_spec import Resources, RevisionSpec
from deployments.runtimes.artifacts import artifact_path
from deployments.runtimes.base import (
    POOL_REF_PREFIX,
    PREPARED,
    Health,
    Launch,
    Observation,
    Preparation,
    RuntimeUnavailable,
    Wake,
    is_pool_launch,
)
from deployments.runtimes.local import confined, pool_memory, serverlog
from deployments.runtimes.local import triton as local_triton
from infra import sandbox_settings
from modelport.core.runtime_env import RuntimeEnvError
from models_registry.models import record_memory
from models_registry.validation import archive_limits

log = logging.getLogger(__name__)

REF_PREFIX = POOL_REF_PREFIX
LIVE_WAIT_SECONDS = 30.0


class PoolFull(Exception):
    """A load that would pass the pool's budget; the message names what to unload or where to go."""


def pool_dir(pool: Pool) -> Path:
    return Path(settings.POOLS_DIR) / pool.name


def repository(pool: Pool) -> Path:
    return pool_dir(pool) / "repository"


class PoolBusy(Exception):
    """Another load, unload or start holds the pool's lock: look again shortly instead of waiting behind it."""


@contextmanager
def locked(pool: Pool, wait: bool | float = True) -> Iterator[None]:
    """The pool's lock, across processes: one start, unload, or step of a load's bookkeeping (room, state) at a time
    per pool; never held while Triton loads a model (load_revision). wait=False: PoolBusy at once when it is held;
    a number: PoolBusy once it was held that many seconds. A request or a health check never queues for long."""
    with _flock(pool_dir(pool) / ".lock", wait,
                f"pool {pool.name!r} is loading or unloading another model; retry shortly"):
        yield


@contextmanager
def team_locked(pool: Pool, team_id: int, wait: bool | float = True) -> Iterator[None]:
    """One team's loads into the pool, one at a time across processes, held while Triton loads: a team's slow loads
    wait behind each other, never another team's (issue 30: a 100k-node ONNX loads for 30 s)."""
    with _flock(pool_dir(pool) / f".lock-team-{team_id}", wait,
                f"your team is loading another model into pool {pool.name!r}; retry shortly"):
        yield


@contextmanager
def _flock(path: Path, wait: bool | float, busy: str) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        deadline = time.monotonic() + (0 if wait is False else float(wait))
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX if wait is True else fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise PoolBusy(busy) from None
                time.sleep(0.05)  # flock has no timeout of its own
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- Names ---------------------------------------------------------------------------------------------------------

# The renaming is the runtimes' common ground (deployments/pool_names.py): the Kubernetes pool renames alike.
pooled_spec = pool_names.pooled_spec
load_order = pool_names.load_order


def _prefix(load: PoolLoad) -> str:
    return pool_names.name_prefix(load.deployment_id, load.revision.number)


# --- Files ---------------------------------------------------------------------------------------------------------


def prepare(revision: Revision) -> None:
    """Render the revision's models into its pool's repository (idempotent)."""
    pool = Pool.objects.get(name=revision.spec.placement.pool)
    prefix = pool_names.name_prefix(revision.deployment_id, revision.number)
    key = pool_names.revision_key(revision.deployment_id, revision.number)
    marker = pool_dir(pool) / "rendered" / key
    if marker.exists():
        return
    staging = pool_dir(pool) / "staging" / key
    shutil.rmtree(staging, ignore_errors=True)
    spec = pooled_spec(revision.spec, prefix)
    render_repository(spec.repository(lambda entry: artifact_path(entry.sha256)), "local", staging / "repository",
                      local_frameworks=local_env.local_frameworks(), archive_limits=archive_limits())
    target = repository(pool)
    target.mkdir(parents=True, exist_ok=True)
    for model_dir in sorted((staging / "repository").iterdir()):
        destination = target / model_dir.name
        if destination.exists():
            shutil.rmtree(destination)
        os.replace(model_dir, destination)  # the same filesystem: Triton never sees half a model
    pyenvs.readable_by_all(target)
    shutil.rmtree(staging, ignore_errors=True)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(timezone.now().isoformat())


def remove_files(pool: Pool, deployment_id: int, revision_number: int | None = None) -> None:
    """Remove a revision's (or, with None, every revision's) models of a deployment from the pool's repository."""
    pattern = pool_names.files_of(deployment_id, revision_number)
    for directory in (repository(pool), pool_dir(pool) / "rendered"):
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():
            if pattern.match(entry.name + "-"):
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)


# --- The server ----------------------------------------------------------------------------------------------------


def live_server(pool: Pool) -> PoolServer | None:
    """The pool's running server; a dead one is marked stopped, and what was loaded in it is to be loaded again."""
    for server in PoolServer.objects.filter(pool=pool, state=PoolServer.State.RUNNING):
        if local_triton.is_alive(server.pid):
            return server
        _mark_dead(server)
    return None


# What comes after a pool's Triton stopped, for its deployments' events: said as what will happen, never as done (a
# Triton is started again only by the next look, and after `make stop-triton` none looks until the portal runs).
AT_NEXT_LOOK = ("this deployment's models are loaded again at its next health check or request, in a new Triton of "
                "the pool")
ONCE_THE_PORTAL_RUNS = ("this deployment's models are loaded again once the portal runs again (make run), at its "
                        "next health check or request, in a new Triton of the pool")


def _mark_dead(server: PoolServer, what: str = "died", then: str = AT_NEXT_LOOK) -> None:
    PoolServer.objects.filter(pk=server.pk).update(state=PoolServer.State.STOPPED, stopped_at=timezone.now())
    _clean_up(server)
    for load in PoolLoad.objects.filter(server=server, state=PoolLoad.State.LOADED).select_related("deployment"):
        PoolLoad.objects.filter(pk=load.pk).update(state=PoolLoad.State.LOADING, server=None,
                                                   message=f"the pool's Triton {what}; to be loaded again")
        events.record(load.deployment, Event.Kind.WARNING,
                      f"The Triton of pool {server.pool.name!r} (pid {server.pid}) {what}: {then}.")


def stop_servers(pool: Pool, what: str = "was stopped") -> int:
    """Stop the pool's Triton (an operator's or a benchmark's teardown; what was loaded is loaded again at the next
    need); how many were stopped."""
    stopped = 0
    for server in PoolServer.objects.filter(pool=pool, state=PoolServer.State.RUNNING):
        stopped += bool(local_triton.stop_server(server.pid, grace_seconds=settings.TRITON_STOP_GRACE_SECONDS))
        _mark_dead(server, what)
    return stopped


def mark_stopped(pids: Sequence[int], what: str) -> None:
    """Record that the pool Tritons at `pids` were stopped by hand (`make stop-triton`, which runs only while the
    portal is stopped): their loaded revisions are loaded again once the portal runs and looks, each deployment
    told so (and told again once they are)."""
    for server in PoolServer.objects.filter(state=PoolServer.State.RUNNING, pid__in=list(pids)).select_related("pool"):
        if not local_triton.is_alive(server.pid):
            _mark_dead(server, what, ONCE_THE_PORTAL_RUNS)


def _in_use(pool: Pool) -> bool:
    """Whether a deployment has models in the pool: loaded, loading, or unloaded while idle. An idle one's route
    names the server's ports, which a stopped server might not get back (another program may take them)."""
    return PoolLoad.objects.filter(pool=pool).exclude(state=PoolLoad.State.FAILED).exists()


def stop_empty_servers() -> list[str]:
    """Stop the pool Tritons in which no deployment has had models for POOL_EMPTY_SERVER_STOP_SECONDS (all its
    deployments stopped, deleted or moved): an empty Triton still holds its memory, threads and ports. Level-
    triggered like the reconciler: one pass notes when a server was first seen empty, a later one stops it; the
    next deployment into the pool starts it again. A line per server stopped."""
    wait = settings.POOL_EMPTY_SERVER_STOP_SECONDS
    done: list[str] = []
    now = timezone.now()
    for server in PoolServer.objects.filter(state=PoolServer.State.RUNNING, pool__runtime=Pool.Runtime.LOCAL) \
            .select_related("pool"):
        pool = server.pool
        if _in_use(pool):
            if server.empty_since is not None:
                PoolServer.objects.filter(pk=server.pk).update(empty_since=None)
            continue
        if server.empty_since is None:
            PoolServer.objects.filter(pk=server.pk).update(empty_since=now)
            server.empty_since = now
        if wait <= 0 or now - server.empty_since < timedelta(seconds=wait):
            continue
        try:
            # A launch records its load before it asks for the server (launch()), so that under the lock either the
            # load is seen here and the server kept, or the launch's ensure_server starts a new one after this.
            with locked(pool, wait=False):
                if _in_use(pool):
                    continue
                local_triton.stop_server(server.pid, grace_seconds=settings.TRITON_STOP_GRACE_SECONDS)
                _mark_dead(server, "was stopped")
        except PoolBusy:
            continue  # a load is under way: the next pass looks again
        log.info("Stopped the Triton of pool %r (pid %s): no deployment had models in it for %g s.",
                 pool.name, server.pid, wait)
        done.append(f"stopped the Triton of pool {pool.name!r} (pid {server.pid}): empty for {wait:g} s")
    return done


def _clean_up(server: PoolServer) -> None:
    if server.cgroups:
        confined.remove_cgroups(server.cgroups)
    if server.sandbox_id:
        shutil.rmtree(pool_dir(server.pool) / "scratch" / server.sandbox_id, ignore_errors=True)


def ensure_server(pool: Pool) -> PoolServer:
    """The pool's running server, started if none runs (returns once it is spawned, not once it answers)."""
    with locked(pool):
        return _ensure_server(pool)


def _ensure_server(pool: Pool) -> PoolServer:
    server = live_server(pool)
    if server is not None:
        return server
    previous = PoolServer.objects.filter(pool=pool).order_by("-started_at").first()
    ports = _same_ports_if_free(previous)
    started = timezone.now()
    log_path = pool_dir(pool) / f"triton-{started:%Y%m%dT%H%M%S%f}.log"
    confined.prune_logs(pool_dir(pool))
    if settings.SANDBOX_REQUIRED and not sandbox_settings.sandbox_capabilities().available:
        # start_confined's own rule sees a spec with no models and would not refuse: a pool's models come later.
        raise RuntimeUnavailable(
            f"This machine cannot sandbox uploaded code ({sandbox_settings.sandbox_capabilities().reason}), so the "
            f"Triton of pool {pool.name!r} is not started unsandboxed (SANDBOX_REQUIRED): deploy with placement "
            "mode 'dedicated' on Kubernetes, or ask an operator to make the sandbox work (docs/security.md).")
    limit = pool.memory_budget_bytes + pools.quantity_bytes(settings.POOL_PROCESS_OVERHEAD)
    spec = RevisionSpec(runtime="local", models=(), resources=Resources(memory=str(limit)))
    repository(pool).mkdir(parents=True, exist_ok=True)
    caps = sandbox_settings.sandbox_capabilities()
    try:
        started_server = confined.start_confined(
            spec, repository(pool), pool_dir(pool) / "scratch", log_path, label=f"pool {pool.name!r}",
            model_control="explicit", ports=ports, pids_max=settings.POOL_PIDS_MAX, traced=True,
            extra_env=pool_memory.server_environment(
                caps.available and pool_memory.per_model_available(caps.cgroups.version)))
    except RuntimeEnvError as exc:
        raise RuntimeUnavailable(f"The local runtime cannot start Triton: {exc}") from None
    process = started_server.process
    return PoolServer.objects.create(
        pool=pool, pid=process.pid, http_port=process.http_port, grpc_port=process.grpc_port,
        metrics_port=process.metrics_port, log_path=str(process.log_path), admin_key=process.admin_key,
        sandboxed=process.sandboxed, sandbox_id=started_server.sandbox_id, cgroups=list(process.cgroups),
        started_at=started)


def _same_ports_if_free(previous: PoolServer | None) -> list[int] | None:
    """The last server's ports, so that the gateway's routes stay right across a restart; None if one is taken."""
    if previous is None:
        return None
    ports = [previous.http_port, previous.grpc_port, previous.metrics_port]
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            # As a server binds (Triton does): a port whose old connections linger in TIME_WAIT is free to it.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return None
    return ports


def _wait_live(server: PoolServer, prefix: str, seconds: float = LIVE_WAIT_SECONDS) -> None:
    """Wait for the pool's Triton to answer. If it exits, the error quoted is one naming the caller's own models
    (`prefix`): the pool's log holds every team's lines."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(f"{server.url}/v2/health/live", timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        if not local_triton.is_alive(server.pid):
            own = [line.replace(prefix, "") for line in serverlog.log_errors(Path(server.log_path))
                   if prefix in line]
            raise RuntimeUnavailable(f"the Triton of pool {server.pool.name!r} exited at start: "
                                     + (serverlog.summary_error(own)
                                        or "its log names none of this deployment's models; an operator can read "
                                           "it in the pool's directory"))
        if time.monotonic() > deadline:
            raise RuntimeUnavailable(f"the Triton of pool {server.pool.name!r} did not answer within {seconds:g} s")
        time.sleep(0.1)


def _admin(server: PoolServer, name: str, action: str, timeout: float) -> str | None:
    """POST the repository API's load or unload of `name`; None when done, else Triton's error."""
    request = urllib.request.Request(f"{server.url}/v2/repository/models/{name}/{action}", data=b"{}",
                                     method="POST", headers={local_triton.ADMIN_HEADER: server.admin_key,
                                                             "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except urllib.error.HTTPError as exc:
        try:
            return str(json.loads(exc.read(64 * 1024) or b"{}").get("error") or exc.reason)
        except ValueError:
            return str(exc.reason)
    except OSError as exc:
        return f"the pool's Triton did not answer: {exc}"


def _stats(server: PoolServer) -> dict[str, int]:
    """Triton's last_inference (ms since the epoch) per loaded model name."""
    try:
        with urllib.request.urlopen(f"{server.url}/v2/models/stats", timeout=5) as response:
            data = json.load(response)
    except (OSError, ValueError):
        return {}
    found: dict[str, int] = {}
    for row in data.get("model_stats", []):
        name, last = str(row.get("name", "")), int(row.get("last_inference") or 0)
        found[name] = max(found.get(name, 0), last)
    return found


# --- Loads ---------------------------------------------------------------------------------------------------------


def _refresh_last_used(pool: Pool, server: PoolServer) -> None:
    """Record each loaded revision's last inference (Triton counts them; the gateway writes nothing per request)."""
    stats = _stats(server)
    for load in PoolLoad.objects.filter(pool=pool, server=server, state=PoolLoad.State.LOADED).select_related(
            "revision"):
        prefix = _prefix(load)
        last_ms = max((stats.get(prefix + m.name, 0) for m in load.revision.spec.models), default=0)
        if last_ms:
            used = datetime.fromtimestamp(last_ms / 1000, tz=UTC)
            if load.last_used_at is None or used > load.last_used_at:
                PoolLoad.objects.filter(pk=load.pk).update(last_used_at=used)


def _estimate(spec: RevisionSpec) -> int:
    """What loading `spec` takes from the pool: its models' reservations (each one's memory limit)."""
    return sum(pools.reservations(spec).values())


def _refresh_memory(load: PoolLoad, server: PoolServer) -> str:
    """Read each of the load's models' own peak (its cgroup's): kept as the version's figure, and its charge raised
    to it where there is no per-model limit. A model whose process the kernel killed at its limit is remembered as
    needing twice that (pools.figure_past_limit); the reason to load it again is returned ("" if none)."""
    spec = load.revision.spec
    prefix = _prefix(load)
    measured, reload = {}, ""
    for entry in spec.models:
        if entry.is_pipeline:
            continue
        pool_memory.adopt(server, repository(load.pool), prefix + entry.name)
        pool_memory.fit_data_limit(server, prefix + entry.name)
        measured[entry.name] = pool_memory.measure(server, repository(load.pool), prefix + entry.name)
        reached = pool_memory.limit_reached(server, prefix + entry.name)
        if reached:
            measured[entry.name] = max(measured[entry.name], pools.figure_past_limit(reached))
            reload = (f"model {entry.name!r} passed its memory limit in the pool ({pools.format_bytes(reached)}) and "
                      "its process was ended (no other model was touched): it is loaded again with more, if the "
                      "pool has room")
    _remember(spec, {name: value for name, value in measured.items() if value > 0})
    total = sum(measured.values())
    if total > load.memory_bytes and not reload:
        PoolLoad.objects.filter(pk=load.pk, memory_bytes__lt=total).update(memory_bytes=total)
    return reload


def _note_memory(load: PoolLoad, server: PoolServer) -> None:
    """_refresh_memory, and a revision whose model passed its limit marked to be loaded again (the next health check
    or request loads it)."""
    reason = _refresh_memory(load, server)
    if reason and PoolLoad.objects.filter(pk=load.pk, state=PoolLoad.State.LOADED).update(
            state=PoolLoad.State.LOADING, message=reason):
        events.record(load.deployment, Event.Kind.WARNING, reason[0].upper() + reason[1:] + ".")


def refresh_memory(pool: Pool, server: PoolServer) -> None:
    """Refresh the figures of every revision loaded in `server` (GET /api/v1/pools/ shows them)."""
    for load in PoolLoad.objects.filter(pool=pool, server=server, state=PoolLoad.State.LOADED).select_related(
            "revision", "deployment", "pool"):
        _note_memory(load, server)


def refresh_figures(pool: Pool) -> None:
    """Read the models' own peaks in the pool's running server into their figures (what GET /api/v1/pools/ shows):
    figures only, no state changes (the health checks load a model past its limit again)."""
    if pool.runtime != Pool.Runtime.LOCAL:
        return
    for server in PoolServer.objects.filter(pool=pool, state=PoolServer.State.RUNNING):
        for load in PoolLoad.objects.filter(pool=pool, server=server, state=PoolLoad.State.LOADED).select_related(
                "revision", "deployment", "pool"):
            _refresh_memory(load, server)


def _loaded_names(pool: Pool, server: PoolServer) -> set[str]:
    names: set[str] = set()
    # A load under way has no server yet (its row says loading): its cgroups are kept too.
    for load in PoolLoad.objects.filter(Q(server=server) | Q(state=PoolLoad.State.LOADING), pool=pool) \
            .exclude(state=PoolLoad.State.FAILED).select_related("revision"):
        names.update(load_order(load.revision.spec, _prefix(load)))
    return names


def _held(pool: Pool, load: PoolLoad) -> list[pool_policy.Held]:
    """The pool's other loads as the policy counts them: a loaded one at what it was charged when it loaded, one
    under way at what its attempt reserved (its models not loaded yet; nothing while no attempt runs)."""
    rows = (PoolLoad.objects.filter(pool=pool, state__in=[PoolLoad.State.LOADING, PoolLoad.State.LOADED])
            .exclude(pk=load.pk).select_related("deployment", "revision"))
    return [pool_policy.Held(
        load_id=row.pk, team_id=row.deployment.team_id,
        state=pool_policy.LOADED if row.state == PoolLoad.State.LOADED else pool_policy.LOADING,
        charge=row.memory_bytes if row.state == PoolLoad.State.LOADED else row.reserved_bytes,
        last_used_at=row.last_used_at, loaded_at=row.loaded_at,
        name=f"{row.deployment.name} r{row.revision.number}") for row in rows]


def _make_room(pool: Pool, load: PoolLoad, need: int) -> None:
    """Make `need` more bytes fit, or PoolFull: the rule is deployments/pool_policy.py's (the cluster pool's too);
    this unloads the idle victims it names, under the pool's lock."""
    team_id = load.deployment.team_id
    budget, rules, now = pools.budget_of(pool), pools.eviction_rules(), timezone.now()
    spared: set[int] = set()
    while True:
        held = _held(pool, load)
        room = pool_policy.make_room(budget, held, team_id, need, now, rules, spared)
        if not room.fits:
            raise PoolFull(pool_policy.refusal(budget, held, team_id, need))
        if not room.evict:
            return
        victims = PoolLoad.objects.filter(pk__in=room.evict, state=PoolLoad.State.LOADED) \
            .select_related("revision", "deployment", "server")
        for victim in sorted(victims, key=lambda v: room.evict.index(v.pk)):
            _evict(victim, pool, now)
        spared.update(room.evict)  # unloaded now, or not loaded any more: never named again


def _evict(victim: PoolLoad, pool: Pool, now: datetime) -> None:
    _unload_locked(victim, "evicted: the pool needed its memory for another model (least recently used first)")
    unused = (now - victim.last_used_at).total_seconds() if victim.last_used_at is not None else 0.0
    pool_events.evicted(victim.deployment, pool.name, unused)


def _full_message(pool: Pool, load: PoolLoad, need: int, head: str = "") -> str:
    """Why it does not fit (deployments/pool_policy.py's words), naming the team's own loaded deployments."""
    return pool_policy.refusal(pools.budget_of(pool), _held(pool, load), load.deployment.team_id, need, head)


def load_revision(load_id: int, wait: bool | float = True) -> PoolLoad:
    """Load a revision's models into its pool's Triton (blocking for the seconds a load takes); idempotent. The row
    says how it went: loaded, or failed with the reason. wait=False: PoolBusy while another load of the same team,
    or a short step of another's, holds the pool (a number: once that many seconds passed so).

    Triton loads the models without the pool's lock, under the team's (team_locked): Triton loads several models at
    once (verified with this binary: two 6 s loads took 6.3 s side by side), so another team's slow load never holds
    this one; the lock covers only the server, the room made and the state written before and after."""
    load = PoolLoad.objects.select_related("pool", "revision", "deployment").get(pk=load_id)
    pool = load.pool
    if pool.runtime != Pool.Runtime.LOCAL:
        # A cluster's pool loads through its agents (the reconciler's launch and observe), never here.
        raise PoolBusy(f"pool {pool.name!r} loads this deployment's models on its cluster; retry shortly")
    with team_locked(pool, load.deployment.team_id, wait=wait):
        with locked(pool, wait=wait):
            started = _start_load(pool, load)
        if isinstance(started, PoolLoad):
            return started
        try:
            loaded = _load_models(started.server, load, started.reserved)
            with locked(pool):
                done = _finish_load(pool, load, started.server, loaded, started.reserved)
        finally:
            # The reservation _start_load wrote ends with this attempt, whatever became of it (a process that dies
            # mid-load leaves it until the row's next attempt, which writes it again: room held, never overcommitted).
            PoolLoad.objects.filter(pk=load.pk).update(reserved_bytes=0)
    if done.state == PoolLoad.State.LOADED:
        _tell_loaded(done, started)
    return done


def _tell_loaded(load: PoolLoad, started: _Started) -> None:
    """The deployment's event for a load that was not its first: woken by a request (it had been unloaded while
    idle or evicted; only the gateway's cold starts load such a row, a launch marks its row loading first), or
    loaded again in a Triton other than the one it was in (the pool's Triton stopped or died)."""
    seconds = load.cold_start_seconds or 0.0
    if started.woken:
        pool_events.loaded_on_demand(load.deployment, load.pool.name, seconds)
    elif started.loaded_before is not None:
        restarted = started.server.started_at > started.loaded_before
        pool_events.loaded_again(load.deployment, load.pool.name, seconds,
                                 started.server.pid if restarted else None)


@dataclass(frozen=True)
class _Started:
    server: PoolServer
    reserved: dict[str, int]  # bytes per model (its own name): its cgroup's limit, what it is charged
    woken: bool = False  # it was unloaded (idle or evicted): a request loads it
    # When it last loaded, when that was into another server than this one (loaded again after a stop), else None.
    loaded_before: datetime | None = None


@dataclass(frozen=True)
class _Loaded:
    measured: dict[str, int]  # bytes per model (its own name)
    done: list[str]  # the pool names Triton loaded, in order
    error: str | None
    seconds: float
    past_limit: dict[str, int] = field(default_factory=dict)  # the model whose process its limit ended, and that limit


def _start_load(pool: Pool, load: PoolLoad) -> PoolLoad | _Started:
    """Under the pool's lock: the server, room for the revision, the row marked loading. The row when there is
    nothing to load (loaded already, or failed)."""
    load.refresh_from_db()
    server = _ensure_server(pool)
    if load.state == PoolLoad.State.LOADED and load.server_id == server.pk:
        return load
    woken = load.state == PoolLoad.State.UNLOADED
    loaded_before = load.loaded_at if not woken and load.server_id != server.pk else None
    spec = load.revision.spec
    refusal = _unsandboxed_code(server, spec)
    if refusal:
        return _fail(load, refusal)
    _wait_live(server, _prefix(load))
    _refresh_last_used(pool, server)
    refresh_memory(pool, server)
    # Under the lock, and keeping the cgroups of the loads other teams run meanwhile (their rows say loading).
    pool_memory.remove_unused(server, _loaded_names(pool, server))
    reserved = pools.reservations(spec)
    try:
        _make_room(pool, load, sum(reserved.values()))
    except PoolFull as exc:
        return _fail(load, _past_limits(server, load) + str(exc))
    # Loading from here: a stop, retire or abandon meanwhile changes the state, which _finish_load then sees.
    PoolLoad.objects.filter(pk=load.pk).update(state=PoolLoad.State.LOADING, message="", server=None,
                                               reserved_bytes=sum(reserved.values()))
    return _Started(server, reserved, woken, loaded_before)


def _load_models(server: PoolServer, load: PoolLoad, reserved: Mapping[str, int]) -> _Loaded:
    """Triton's loads of the revision's models, steps first, each in its own cgroup and measured there (no lock of
    the pool's held: each figure is the model's own peak, so loads side by side never count in each other's)."""
    spec = load.revision.spec
    prefix = _prefix(load)
    pool = load.pool
    started = time.monotonic()
    measured: dict[str, int] = {}
    done: list[str] = []
    for name in load_order(spec, prefix):
        model = name.removeprefix(prefix)
        if pool_memory.limit_reached(server, name):
            # The kernel ended its process at its limit: Triton would keep that instance through a load of the
            # same files, so it goes first.
            _admin(server, name, "unload", 30)
        error: str | None
        try:
            # Before the load: the model's stubs wait for their cgroup before they run any of its code.
            cgroup = pool_memory.prepare(server, name, reserved[model]) if model in reserved else None
        except OSError as exc:
            error, cgroup = f"its memory cgroup could not be made ({exc.strerror or exc}): ask an operator", None
        else:
            with pool_memory.placing(server, repository(pool), name, cgroup):
                error = _admin(server, name, "load", settings.TRITON_READY_TIMEOUT_SECONDS)
        if error is not None:
            # Its process ended at its cgroup's limit while it loaded (the kernel's count, whatever Triton says:
            # "Stub process is not healthy"): it needs more than its reservation, not another upload.
            reached = pool_memory.limit_reached(server, name) if cgroup is not None else 0
            return _Loaded(measured, done, f"model {model!r} failed to load: {error.replace(prefix, '')}",
                           time.monotonic() - started, {model: reached} if reached else {})
        done.append(name)
        if model in reserved:
            measured[model] = pool_memory.measure(server, repository(pool), name)
            pool_memory.fit_data_limit(server, name)
    return _Loaded(measured, done, None, time.monotonic() - started)


def _finish_load(pool: Pool, load: PoolLoad, server: PoolServer, loaded: _Loaded,
                 reserved: Mapping[str, int]) -> PoolLoad:
    """Under the pool's lock: the row loaded with what it took, or failed (its models unloaded again)."""
    current = PoolLoad.objects.filter(pk=load.pk).first()
    if current is None or current.state != PoolLoad.State.LOADING:
        # Stopped, retired or abandoned while Triton loaded it: what was loaded goes again, the row stays as set.
        for name in reversed(loaded.done):
            _admin(server, name, "unload", 30)
        if current is None:
            load.state, load.message, load.server = PoolLoad.State.UNLOADED, "stopped while it loaded", None
            return load
        return current
    if loaded.error is not None:
        for name in reversed(loaded.done):
            _admin(server, name, "unload", 30)
        if loaded.past_limit:
            return _load_again_with_more(load, loaded)
        return _fail(load, loaded.error)
    spec = load.revision.spec
    # Charged what each model may take (its limit); more only where nothing limits it.
    total = max(sum(reserved.values()), sum(loaded.measured.values()))
    if not pool_policy.fits(pools.budget_of(pool), _held(pool, load), load.deployment.team_id, total):
        for name in reversed(loaded.done):
            _admin(server, name, "unload", 30)
        _remember(spec, loaded.measured)
        return _fail(load, _full_message(pool, load, total))
    _remember(spec, loaded.measured)
    now = timezone.now()
    PoolLoad.objects.filter(pk=load.pk).update(
        state=PoolLoad.State.LOADED, server=server, message="", memory_bytes=total, loaded_at=now,
        last_used_at=now, cold_start_seconds=loaded.seconds)
    load.refresh_from_db()
    return load


def _load_again_with_more(load: PoolLoad, loaded: _Loaded) -> PoolLoad:
    """A load whose model's process the kernel ended at its limit (a model never measured that needs more than its
    first reservation, or one that grew): its figure remembered as needing twice that limit, and the row left loading,
    so that the next pass (a tick's observe or health check, a held request) loads it again with the doubled
    reservation, through the room rule of every load (_make_room: within its team's share, then the pool's budget;
    another team's loaded models are never touched for it, nor its idle ones evicted before they have been resident
    POOL_EVICTION_MIN_RESIDENCY_SECONDS). The loop ends: each load's limit doubles the last, and one past the share
    fails with the pool-full message naming what it needs; a reservation that did not grow fails at once."""
    spec = load.revision.spec
    _remember(spec, {model: pools.figure_past_limit(limit) for model, limit in loaded.past_limit.items()})
    after = pools.reservations(spec)
    model, limit = next(iter(loaded.past_limit.items()))
    cause = _past_limit_cause(model, limit)
    if after.get(model, 0) <= limit:
        # Nothing remembered makes it grow (a model with no version): loading it again would end alike.
        return _fail(load, f"{cause}: {loaded.error}; deploy it with placement mode 'dedicated' and a memory limit "
                           "that holds it")
    need = sum(after.values())
    pool = load.pool
    if pool_policy.never_fits(pools.budget_of(pool), need):
        # It would never fit (_make_room would refuse it): said now, not after an event promising another load.
        return _fail(load, _full_message(pool, load, need, _needs_more(model, limit)))
    reason = (f"{cause}: it is loaded again with {pools.format_bytes(after[model])}, if its team's share of the "
              f"pool has room ({pools.format_bytes(need)} for the revision)")
    if not PoolLoad.objects.filter(pk=load.pk, state=PoolLoad.State.LOADING).update(message=reason):
        return PoolLoad.objects.get(pk=load.pk)
    events.record(load.deployment, Event.Kind.WARNING, reason[0].upper() + reason[1:] + ".")
    load.refresh_from_db()
    return load


def _past_limit_cause(model: str, limit: int) -> str:
    return (f"model {model!r} passed its memory limit in the pool ({pools.format_bytes(limit)}) while it loaded, "
            "and its process was ended (no other model was touched)")


def _past_limits(server: PoolServer, load: PoolLoad) -> str:
    """Why a revision needs what it asks, where a model of it passed its limit in its last load ("" if none), as
    the head of a refusal: the memory it needs is then a figure learnt the hard way, not a guess."""
    prefix = _prefix(load)
    for entry in load.revision.spec.models:
        reached = 0 if entry.is_pipeline else pool_memory.limit_reached(server, prefix + entry.name)
        if reached:
            return _needs_more(entry.name, reached)
    return ""


def _needs_more(model: str, limit: int) -> str:
    """The head of a refusal for a model whose process was ended at `limit`: what it needs is learnt, not guessed."""
    return (f"model {model!r} needs more memory than the {pools.format_bytes(limit)} its process was ended at in "
            "the pool: ")


def _unsandboxed_code(server: PoolServer, spec: RevisionSpec) -> str | None:
    """Why models that run uploaded code may not go into this unsandboxed server (a dedicated Triton refuses them
    alike where the sandbox is missing), or None."""
    if server.sandboxed:
        return None
    code = sorted(m.name for m in spec.models if m.format in confined.CODE_FORMATS)
    if not code:
        return None
    return (f"model {code[0]!r} runs uploaded code (python, TorchScript or SavedModel) and the Triton of pool "
            f"{server.pool.name!r} is not sandboxed on this machine: deploy it with placement mode 'dedicated', "
            "or ask an operator to make the sandbox work (docs/security.md)")


def _remember(spec: RevisionSpec, measured: Mapping[str, int]) -> None:
    """Keep each version's peak measured on this machine (its reservation and "fits N more" come from it): the most
    it was seen to hold, at a load or after use, so a reading right after a load never lowers what use showed."""
    for entry in spec.models:
        if entry.version_id is None or entry.name not in measured:
            continue
        # The version's own figure too, from which a dedicated deployment's memory limit is derived.
        record_memory(entry.version_id, measured[entry.name] // max(entry.instance_group.count, 1),
                      "its use in a pool on this machine")
        if ModelMemory.objects.filter(version_id=entry.version_id, fingerprint=pools.fingerprint(),
                                                    memory_bytes__gte=measured[entry.name]).exists():
            continue
        ModelMemory.objects.update_or_create(version_id=entry.version_id, fingerprint=pools.fingerprint(),
                                             defaults={"memory_bytes": measured[entry.name],
                                                       "measured_at": timezone.now()})


def _fail(load: PoolLoad, message: str) -> PoolLoad:
    PoolLoad.objects.filter(pk=load.pk).update(state=PoolLoad.State.FAILED, message=message, server=None)
    load.refresh_from_db()
    return load


def _unload_locked(load: PoolLoad, message: str, state: str = PoolLoad.State.UNLOADED) -> None:
    server = load.server
    if server is not None and server.state == PoolServer.State.RUNNING and local_triton.is_alive(server.pid):
        spec = load.revision.spec
        for name in reversed(load_order(spec, _prefix(load))):
            _admin(server, name, "unload", 30)
            pool_memory.remove(server, name)
    PoolLoad.objects.filter(pk=load.pk).update(state=state, message=message, server=None)


def unload(load: PoolLoad, message: str) -> None:
    with locked(load.pool):
        load.refresh_from_db()
        _unload_locked(load, message)


def idle_unload_after(load: PoolLoad) -> float:
    """Seconds unused after which a loaded revision is unloaded: its idle_unload_seconds, and at least
    POOL_IDLE_UNLOAD_LOAD_FACTOR times what its last load took, so that a slow loader (a 100k-node ONNX loads for
    30 s) set to unload after 1 s is not loaded again at every request, its team's load slot and the pool's CPU
    taken from the others each time."""
    return max(float(load.idle_unload_seconds), settings.POOL_IDLE_UNLOAD_LOAD_FACTOR * (load.cold_start_seconds or 0))


def unload_idle() -> list[str]:
    """Unload every loaded revision unused for its idle_unload_seconds; a line per revision unloaded."""
    done = []
    for pool in Pool.objects.filter(runtime=Pool.Runtime.LOCAL, loads__state=PoolLoad.State.LOADED).distinct():
        server = live_server(pool)
        if server is None:
            continue
        _refresh_last_used(pool, server)
        refresh_memory(pool, server)
        now = timezone.now()
        for load in PoolLoad.objects.filter(pool=pool, state=PoolLoad.State.LOADED, idle_unload_seconds__gt=0) \
                .select_related("revision", "deployment", "server", "pool"):
            last = load.last_used_at or load.loaded_at or now
            after = idle_unload_after(load)
            if now - last >= timedelta(seconds=after):
                with locked(pool):
                    current = PoolLoad.objects.select_related("revision", "server", "pool").get(pk=load.pk)
                    if current.state != PoolLoad.State.LOADED or current.last_used_at != load.last_used_at:
                        continue
                    _unload_locked(current, f"unloaded after {after:g} s unused; the next request loads it again")
                pool_events.idle_unloaded(load.deployment, pool.name, (now - last).total_seconds(), after,
                                          load.idle_unload_seconds)
                done.append(f"unloaded {load.deployment} r{load.revision.number} from pool {pool.name!r}")
    return done


# --- The runtime's steps for a shared revision (LocalRuntime calls these) -----------------------------------------


def launch(revision: Revision) -> Launch:
    pool = Pool.objects.get(name=revision.spec.placement.pool)
    load, _ = PoolLoad.objects.get_or_create(pool=pool, revision=revision, defaults={
        "deployment": revision.deployment, "idle_unload_seconds": revision.spec.placement.idle_unload_seconds})
    if load.state != PoolLoad.State.LOADED:
        PoolLoad.objects.filter(pk=load.pk).update(state=PoolLoad.State.LOADING, message="")
    server = ensure_server(pool)
    return Launch(revision_id=revision.pk, url=server.url, grpc_target=server.grpc_target,
                  ref=f"{REF_PREFIX}{load.pk}",
                  description=f"pool {pool.name!r}, pid {server.pid}, port {server.http_port}, "
                              + ("sandboxed" if server.sandboxed else "not sandboxed"))


def _load_of(launch: Launch) -> PoolLoad | None:
    try:
        load_id = int(str(launch.ref).removeprefix(REF_PREFIX))
    except ValueError:
        return None
    return PoolLoad.objects.select_related("pool", "revision", "server").filter(pk=load_id).first()


def observe(launch: Launch) -> Observation:
    load = _load_of(launch)
    if load is None:
        return Observation("failed", "its models are no longer in the pool")
    if load.state == PoolLoad.State.FAILED:
        return Observation("failed", load.message)
    try:
        load = load_revision(load.pk, wait=False)
    except PoolBusy as exc:
        return Observation("starting", str(exc))  # the next tick looks again
    except RuntimeUnavailable as exc:
        return Observation("failed", str(exc))
    if load.state == PoolLoad.State.FAILED:
        return Observation("failed", load.message)
    if load.state == PoolLoad.State.LOADING:
        return Observation("starting", load.message)  # to be loaded again with more memory: the next tick does
    if load.server is None or load.server.url != launch.url:
        return Observation("failed", "the pool's Triton restarted on other ports: start the deployment again")
    return Observation("ready", f"loaded in pool {load.pool.name!r} in {load.cold_start_seconds or 0:.1f} s")


def abandon(launch: Launch) -> None:
    """Unload and forget what was starting, unless it is what serves: a relaunch of the serving revision shares
    the serving launch's row (one per pool and revision), and deleting it would leave the route with no load."""
    load = _load_of(launch)
    if load is not None and not _serving(load, launch):
        unload(load, "abandoned")
        remove_files(load.pool, load.deployment_id, load.revision.number)
        PoolLoad.objects.filter(pk=load.pk).delete()


def _serving(load: PoolLoad, launch: Launch) -> bool:
    serving = Launch.from_json(Deployment.objects.filter(pk=load.deployment_id)
                               .values_list("serving_launch", flat=True).first())
    return serving is not None and serving.ref == launch.ref


def check(launch: Launch) -> Health:
    load = _load_of(launch)
    if load is None:
        return Health(False, "its models are no longer in the pool")
    server = live_server(load.pool)  # marks a dead server, its loads to be loaded again
    load.refresh_from_db()
    if server is not None and load.state == PoolLoad.State.LOADED and load.server_id == server.pk:
        _note_memory(load, server)  # its figure after use; a model past its limit is loaded again below
        load.refresh_from_db()
    if load.state == PoolLoad.State.UNLOADED:
        return Health(True)  # idle: the next request loads it
    if load.state == PoolLoad.State.FAILED:
        return Health(False, load.message)
    if load.state == PoolLoad.State.LOADING or server is None:
        try:
            load = load_revision(load.pk, wait=False)
        except PoolBusy:
            return Health(True)  # another load holds the pool: the next tick (or the next request) loads it
        except RuntimeUnavailable as exc:
            return Health(False, str(exc))
        if load.state == PoolLoad.State.FAILED:
            return Health(False, load.message)
        if load.state == PoolLoad.State.LOADING:
            return Health(True)  # to be loaded again with more memory: the next tick (or request) does
        server = load.server
    if server is None or server.url != launch.url:
        return Health(False, "the pool's Triton restarted on other ports")
    return Health(True)


def retire(deployment: Deployment, keep: Sequence[Launch]) -> list[str]:
    kept = {launch.ref for launch in keep if is_pool_launch(launch)}
    done = []
    for load in PoolLoad.objects.filter(deployment=deployment).select_related("pool", "revision", "server"):
        if f"{REF_PREFIX}{load.pk}" in kept:
            continue
        unload(load, "retired")
        remove_files(load.pool, deployment.pk, load.revision.number)
        PoolLoad.objects.filter(pk=load.pk).delete()
        done.append(f"Unloaded revision {load.revision.number} from pool {load.pool.name!r}.")
    return done


def stop(deployment: Deployment) -> None:
    for load in PoolLoad.objects.filter(deployment=deployment).select_related("pool", "revision", "server"):
        unload(load, "stopped")
        PoolLoad.objects.filter(pk=load.pk).delete()


def teardown(deployment: Deployment) -> None:
    pools_used = {load.pool for load in PoolLoad.objects.filter(deployment=deployment).select_related("pool")}
    stop(deployment)
    for pool in pools_used | set(Pool.objects.filter(runtime=Pool.Runtime.LOCAL)):
        remove_files(pool, deployment.pk)


def server_isolation(pool_name: str) -> dict[str, Any] | None:
    """Whether the running Triton of the pool runs sandboxed, as runtime.isolation answers for a deployment's own
    (None: the pool runs none). A pool's Triton never opens outgoing connections (start_confined's default)."""
    server = (PoolServer.objects.filter(pool__name=pool_name, pool__runtime=Pool.Runtime.LOCAL,
                                        state=PoolServer.State.RUNNING).order_by("-started_at").first())
    if server is None:
        return None
    return {"sandboxed": server.sandboxed, "egress": False,
            "note": f"the Triton of pool {pool_name!r}, shared with other deployments"}


def logs(deployment: Deployment, lines: int, revision: Revision) -> str:
    """The lines Triton wrote in the pool's log that name this revision's models (never another deployment's).
    Lines the models' processes print are left out: another team's model chooses their words (onnxruntime's
    warnings quote its tensor names), and could name this deployment's models in them."""
    spec = revision.spec
    if not spec.placement.shared:
        return ""
    server = PoolServer.objects.filter(pool__name=spec.placement.pool).order_by("-started_at").first()
    if server is None:
        return ""
    mine = pool_names.names_in(pool_names.name_prefix(deployment.pk, revision.number))
    text = serverlog.tail_log(Path(server.log_path), 5000, **confined.log_limits())
    return "\n".join([line for line in text.split("\n")
                      if serverlog.is_triton_line(line) and mine.search(line)][-lines:])


# --- The pool launcher (registry.py puts it behind one Runtime with LocalRuntime: runtimes/placed.py) -------------


class LocalPoolRuntime:
    """The local runtime's revisions placed in a pool: their models loaded into the pool's shared Triton."""

    poll_seconds = 1.0

    @property
    def ready_timeout_seconds(self) -> float:
        return float(settings.TRITON_READY_TIMEOUT_SECONDS)

    def check_plan(self, spec: RevisionSpec) -> dict[str, list[str]]:
        from deployments.runtimes.local.policy import plan_errors

        return plan_errors(spec)

    def prepare(self, revision: Revision) -> Preparation:
        prepare(revision)
        return PREPARED

    def launch(self, revision: Revision) -> Launch:
        try:
            return launch(revision)
        except RuntimeEnvError as exc:
            raise RuntimeUnavailable(f"The local runtime cannot start Triton: {exc}") from None

    def observe(self, launch: Launch) -> Observation:
        return observe(launch)

    def abandon(self, launch: Launch) -> None:
        abandon(launch)

    def check(self, deployment: Deployment, launch: Launch) -> Health:
        return check(launch)

    def retire(self, deployment: Deployment, keep: Sequence[Launch]) -> list[str]:
        return retire(deployment, keep)

    def stop(self, deployment: Deployment) -> None:
        stop(deployment)

    def teardown(self, deployment: Deployment) -> None:
        teardown(deployment)

    def logs(self, deployment: Deployment, lines: int, revision: Revision | None = None) -> str:
        revision = revision or deployment.serving_revision or deployment.revision
        return logs(deployment, lines, revision) if revision is not None else ""

    def wake(self, load_id: int, wait_seconds: float) -> Wake:
        """Load the revision again here (the gateway's load executor): the pool's lock and the team's are waited
        for up to `wait_seconds`, another team's load never (load_revision)."""
        try:
            done = load_revision(load_id, wait=wait_seconds)
        except PoolBusy:
            return Wake(busy=True)
        return Wake(failure="" if done.state == PoolLoad.State.LOADED else done.message)

    def unload_idle(self) -> list[str]:
        return unload_idle() + stop_empty_servers()

    def sweep_orphans(self) -> list[str]:
        return []  # a pool's Tritons are swept with the dedicated ones (LocalRuntime.sweep_orphans)

    def refresh_access(self) -> int:
        return 0
