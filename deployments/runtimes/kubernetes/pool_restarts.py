"""What a cluster pool's deployments are told when the pool's Triton restarts (issue 24, "Faults").

On a cluster the kubelet restarts a pool pod's `triton` container (OOMKilled, a crash, a failed liveness probe) and
the pod's agent loads again what Triton lost (pool_agent.py): nothing here acts on the pool. The worker's periodic
pass over each cluster pool (pool_runtime.unload_idle) calls watch() with the pool's pods, and:

- a `triton` container whose restartCount rose since the last pass records ONE event on every deployment with a
  revision loaded in the pool (why, from lastState.terminated: OOMKilled with the memory limit, or the exit code);
- a pod that Kubernetes stopped (phase Failed: evicted for the node's memory, say) does the same;
- once the restarted pod's agent has loaded a revision again in the new Triton, its deployment is told it is back
  (for a stopped pod: once every running pod of the pool has it).

The last restartCount seen is kept per pod (PoolPod), claimed with a conditional update, so that a restart seen by
two passes (or two workers) is told once. A pod the worker has not seen before (the autoscaler's, a replacement,
with a new name) is remembered with its count and tells nothing: it loads everything from scratch, as at a
scale-up. A pod that goes away gracefully (scale-down, a rollout of the pool's template) tells nothing either: the
pool's other pods serve. Each event names the pool and the pod only: never another deployment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from deployments import events, pool_names, pools
from deployments.models import Event, Pool, PoolLoad, PoolPod
from deployments.runtimes.kubernetes import manifests, pool_agent, pool_manifests
from deployments.runtimes.kubernetes.kube import Kube, KubeError
from modelport.core.quantity import parse_quantity

# The restarted pod's agent log read for its loads (only while some are awaited): enough lines for a pool's
# revisions each loading again, bounded in bytes.
RELOAD_LOG_LINES = 2000
RELOAD_LOG_BYTES = 512 * 1024
MAX_REASON = 300

Statuses = list[tuple[str, dict[str, Any] | None]]

_TIMESTAMPED = re.compile(r"^([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]{1,9}))?Z (.*)$")
_AGENT = "modelport-pool-agent: "


def _triton(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(status, Mapping) and status.get("name") == manifests.CONTAINER:
            return status
    return {}


def restart_count(pod: Mapping[str, Any]) -> int:
    value = _triton(pod).get("restartCount", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _parse_time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


def started_at(pod: Mapping[str, Any]) -> datetime | None:
    """When the pod's `triton` container last started, None while it is not running (back-off, say)."""
    return _parse_time(((_triton(pod).get("state") or {}).get("running") or {}).get("startedAt"))


def _memory_limit(pod: Mapping[str, Any]) -> str:
    for container in (pod.get("spec") or {}).get("containers") or []:
        if isinstance(container, Mapping) and container.get("name") == manifests.CONTAINER:
            limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
            if not limit:
                return "no memory limit"
            try:
                size = int(parse_quantity(str(limit)))
            except ValueError:
                return f"memory limit {limit}"
            return f"memory limit {size / 2**30:g} GiB" if size % 2**27 == 0 else \
                f"memory limit {pools.format_bytes(size)}"
    return "no memory limit"


def restart_reason(pod: Mapping[str, Any]) -> str:
    """Why the `triton` container last ended, from lastState.terminated: "OOMKilled, memory limit 3 GiB",
    "Error, exit code 139"."""
    last = (_triton(pod).get("lastState") or {}).get("terminated") or {}
    reason = str(last.get("reason") or "no reason given")[:MAX_REASON]
    if reason == "OOMKilled":
        return f"OOMKilled, {_memory_limit(pod)}"
    code = last.get("exitCode")
    return f"{reason}, exit code {code}" if code is not None else reason


def _stop_reason(pod: Mapping[str, Any]) -> str:
    status = pod.get("status") or {}
    reason = str(status.get("reason") or "Failed")
    message = " ".join(str(status.get("message") or "").split())
    return (f"{reason}: {message}" if message else reason)[:MAX_REASON]


def _loaded(pool: Pool) -> list[PoolLoad]:
    return list(PoolLoad.objects.filter(pool=pool, state=PoolLoad.State.LOADED).select_related("deployment"))


def _tell(loads: list[PoolLoad], kind: str, message: str) -> None:
    """One event per deployment, however many of its revisions the loads hold (a rollout's two)."""
    told: set[int] = set()
    for load in loads:
        if load.deployment_id not in told:
            told.add(load.deployment_id)
            events.record(load.deployment, kind, message)


def watch(kube: Kube, pool: Pool, namespace: str, pods: list[dict[str, Any]], statuses: Statuses) -> list[str]:
    """One pass over the pool's pods (all of them, running or not): restarts and stopped pods told to the pool's
    deployments, and loads back told. A line per restart, stopped pod and deployment told it is back."""
    done: list[str] = []
    rows = {row.name: row for row in PoolPod.objects.filter(pool=pool)}
    listed: dict[str, dict[str, Any]] = {}
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name") or "")
        if not name:
            continue
        listed[name] = pod
        count = restart_count(pod)
        row = rows.get(name)
        if row is None:
            try:
                with transaction.atomic():  # a savepoint: the race below leaves the caller's transaction usable
                    rows[name] = PoolPod.objects.create(pool=pool, name=name, restart_count=count)
            except IntegrityError:  # another worker's pass remembered it first
                pass
            continue
        if not row.gone and (pod.get("status") or {}).get("phase") == "Failed":
            done += _claim(row, pool, count, gone=True, message=(
                f"The Triton pod {name} of shared pool {pool.name!r} was stopped by Kubernetes ({_stop_reason(pod)}); "
                "this deployment's models are loading again in the pool's other or new pods."))
        elif count > row.restart_count:
            done += _claim(row, pool, count, gone=row.gone, message=(
                f"The Triton of shared pool {pool.name!r} in pod {name} restarted ({restart_reason(pod)}); this "
                "deployment's models are loading again."))
        elif count < row.restart_count:  # not the same container's count (a pod made again under the name)
            PoolPod.objects.filter(pk=row.pk).update(restart_count=count)
    for name, row in rows.items():
        if name not in listed:
            if row.reloading:
                PoolPod.objects.filter(pk=row.pk).update(gone=True)  # its loads are awaited in the other pods
            else:
                PoolPod.objects.filter(pk=row.pk).delete()
    for row in PoolPod.objects.filter(pool=pool):
        if not row.reloading:
            continue
        current = listed.get(row.name)
        if row.gone or current is None:
            back = _back_in_every_pod(row, statuses)
        else:
            back = _back_in_pod(kube, namespace, row, current)
        done += _told_back(row, pool, back)
    return done


def _claim(row: PoolPod, pool: Pool, count: int, *, gone: bool, message: str) -> list[str]:
    """Record the restart (or the stop) once: the pass whose conditional update moves the row tells it."""
    loads = _loaded(pool)
    with transaction.atomic():
        claimed = PoolPod.objects.filter(pk=row.pk, restart_count=row.restart_count, gone=row.gone).update(
            restart_count=count, gone=gone, seen_at=timezone.now(),
            reloading=sorted(set(row.reloading) | {load.pk for load in loads}))
        if not claimed:
            return []
        _tell(loads, Event.Kind.WARNING, message)
    return [f"pool {pool.name!r}: pod {row.name} {'stopped' if gone and not row.gone else 'restarted'}, told to "
            f"{len({load.deployment_id for load in loads})} deployment(s)"]


def _key(load: PoolLoad) -> str:
    return pool_names.revision_key(load.deployment_id, load.revision.number)


def _back_in_every_pod(row: PoolPod, statuses: Statuses) -> set[int]:
    """The awaited loads every running pod of the pool has loaded (at least one pod)."""
    if not statuses or any(status is None for _pod, status in statuses):
        return set()
    loads = PoolLoad.objects.filter(pk__in=row.reloading).select_related("revision")
    return {load.pk for load in loads
            if all(_key(load) in (status or {}).get("loaded", []) for _pod, status in statuses)}


def agent_loads_since(log_text: str, since: datetime) -> set[str]:
    """The revisions whose last word in the agent's (timestamped) log is that it loaded them, at or after `since`:
    each line the agent writes about a revision after the new Triton started that says it is loaded, with no later
    line saying Triton lost it (or does not answer), it was refused or unloaded."""
    loaded_at: dict[str, datetime | None] = {}
    for line in log_text.splitlines():
        found = _TIMESTAMPED.match(line)
        if not found:
            continue
        when = datetime.fromisoformat(f"{found[1]}.{(found[2] or '0')[:6]:0<6}+00:00")
        text = found[3]
        if not text.startswith(_AGENT):
            continue
        text = text[len(_AGENT):]
        if text.startswith("Triton does not answer"):
            loaded_at = dict.fromkeys(loaded_at)
            continue
        key, sep, rest = text.partition(": ")
        if not sep or not pool_agent.REVISION_RE.fullmatch(key):
            continue
        loaded_at[key] = when if rest.startswith("loaded ") else None
    return {key for key, when in loaded_at.items() if when is not None and when >= since}


def _back_in_pod(kube: Kube, namespace: str, row: PoolPod, pod: Mapping[str, Any]) -> set[int]:
    """The awaited loads the restarted pod's agent has loaded in the Triton that runs now. Read from its log with
    the kubelet's timestamps, not from its last status line: that line may be the one it wrote before Triton
    restarted, listing everything loaded."""
    since = started_at(pod)
    if since is None:
        return set()
    try:
        text = kube.pod_log(namespace, row.name, pool_manifests.AGENT_CONTAINER, tail_lines=RELOAD_LOG_LINES,
                            limit_bytes=RELOAD_LOG_BYTES, timestamps=True).decode("utf-8", "replace")
    except KubeError:
        return set()
    keys = agent_loads_since(text, since)
    loads = PoolLoad.objects.filter(pk__in=row.reloading).select_related("revision")
    return {load.pk for load in loads if _key(load) in keys}


def _told_back(row: PoolPod, pool: Pool, back: set[int]) -> list[str]:
    """Tell each deployment whose awaited loads are all back (and forget the loads no longer loaded: stopped,
    unloaded, failed); a line per deployment told."""
    with transaction.atomic():
        current = PoolPod.objects.select_for_update().filter(pk=row.pk).first()
        if current is None:
            return []
        loads = {load.pk: load for load in
                 PoolLoad.objects.filter(pk__in=current.reloading).select_related("deployment")}
        waiting = [pk for pk in current.reloading if pk in loads and loads[pk].state == PoolLoad.State.LOADED]
        done_deployments = {loads[pk].deployment_id for pk in waiting
                            if all(other in back for other in waiting
                                   if loads[other].deployment_id == loads[pk].deployment_id)}
        returned = [loads[pk] for pk in waiting if loads[pk].deployment_id in done_deployments]
        remaining = [pk for pk in waiting if loads[pk].deployment_id not in done_deployments]
        if remaining == current.reloading:
            return []
        PoolPod.objects.filter(pk=row.pk).update(reloading=remaining)
        where = (f"the pods of shared pool {pool.name!r}" if current.gone else
                 f"pod {row.name} of shared pool {pool.name!r}")
        _tell(returned, Event.Kind.INFO, f"This deployment's models are loaded again in {where}.")
    return [f"pool {pool.name!r}: models of {load.deployment} loaded again after a restart"
            for load in {load.deployment_id: load for load in returned}.values()]
