"""What the operators' overview page (/admin/overview/) shows: Triton servers, GPUs asked for per team, the Celery
queue and workers, and recent failures. Each probe of something outside the database answers with a short note
instead of raising, so that the page renders while the broker or the workers are down."""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Count, Sum
from django.utils import timezone

from deployments import pools as pool_rules
from deployments.models import Deployment, Event, Pool, PoolLoad, PoolServer, TritonServer
from deployments.runtimes.registry import runtime_named
from gateway.models import RequestStats
from infra.queues import Queue

log = logging.getLogger(__name__)

# kombu's Redis transport keeps one list per queue and priority step: "reconcile", then "reconcile\x06\x163", ...
_REDIS_PRIORITY_SEPARATOR = "\x06\x16"
_REDIS_PRIORITY_STEPS = (3, 6, 9)


@dataclass(frozen=True)
class Probe:
    value: Any
    note: str = ""


def triton_servers() -> list[dict[str, Any]]:
    servers = (TritonServer.objects.filter(state__in=[TritonServer.State.STARTING, TritonServer.State.READY])
               .select_related("deployment__team", "revision"))
    local = runtime_named(Deployment.Runtime.LOCAL)  # the TritonServer rows are its processes
    return [{"server": s, "alive": local.server_alive(s.pid)} for s in servers]


# The revisions listed per pool: enough to see who fills it, bounded so that the page stays fast however many
# deployments a pool holds (its totals count them all).
_MAX_POOL_LOADS = 200


def pools() -> list[dict[str, Any]]:
    """Each pool with its budget, what its loaded models took, its Triton process and the revisions in it."""
    servers = {s.pool_id: s for s in PoolServer.objects.filter(state=PoolServer.State.RUNNING).order_by("started_at")}
    rows = []
    local = runtime_named(Deployment.Runtime.LOCAL)  # a pool's Triton is its process
    for pool in Pool.objects.select_related("team").order_by("name"):
        used, models = pool_rules.memory_used(pool)
        loads = list(PoolLoad.objects.filter(pool=pool).exclude(deployment__desired_state=Deployment.Desired.DELETED)
                     .select_related("deployment__team", "revision")
                     .order_by("deployment__name", "revision__number")[:_MAX_POOL_LOADS])
        server = servers.get(pool.pk)
        budget = pool.memory_budget_bytes
        rows.append({
            "pool": pool, "models": models, "used": pool_rules.format_bytes(used),
            "budget": pool_rules.format_bytes(budget), "percent": round(100 * used / budget) if budget else 0,
            "server": server, "alive": local.server_alive(server.pid) if server else False,
            "loads": [{"load": load, "memory": pool_rules.format_bytes(load.memory_bytes) if load.memory_bytes else ""}
                      for load in loads],
        })
    return rows


def sandbox() -> Probe:
    """Whether this process can sandbox the local Tritons, and what is weaker than designed here."""
    from infra import sandbox_settings

    try:
        caps = sandbox_settings.sandbox_capabilities()
    except Exception as exc:  # the check itself failing is what the operator must see
        log.warning("sandbox check: %s", exc)
        return Probe(False, f"the check failed: {exc}")
    if caps.available:
        return Probe(True, caps.describe())
    required = settings.SANDBOX_REQUIRED
    return Probe(False, f"{caps.reason}. " + ("Python models are refused (SANDBOX_REQUIRED)." if required else
                                              "Python models run unconfined (SANDBOX_REQUIRED is false)."))


def deployments_by_runtime() -> list[dict[str, Any]]:
    """[{"runtime", "counts": {status: n}, "total"}] of the deployments not being deleted."""
    rows = (Deployment.objects.exclude(desired_state=Deployment.Desired.DELETED)
            .values("runtime", "status").annotate(n=Count("id")).order_by("runtime", "status"))
    by_runtime: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        by_runtime[row["runtime"]][row["status"]] += row["n"]
    return [{"runtime": runtime, "counts": dict(counts), "total": sum(counts.values())}
            for runtime, counts in sorted(by_runtime.items())]


def gpus_per_team() -> list[dict[str, Any]]:
    """GPUs requested by the running deployments of each team: the spec's resources.gpu × replicas."""
    running = (Deployment.objects.filter(desired_state=Deployment.Desired.RUNNING)
               .exclude(status__in=[Deployment.Status.FAILED, Deployment.Status.STOPPED])
               .select_related("team", "revision"))
    totals: Counter[str] = Counter()
    deployments: Counter[str] = Counter()
    for deployment in running:
        spec = deployment.revision.spec if deployment.revision else None
        gpus = spec.resources.gpu * max(1, spec.replicas) if spec else 0
        if gpus:
            totals[deployment.team.name] += gpus
            deployments[deployment.team.name] += 1
    return [{"team": team, "gpus": gpus, "deployments": deployments[team]} for team, gpus in sorted(totals.items())]


def queue_depth() -> Probe:
    """Messages waiting in the Celery queues (Redis: their lists; the filesystem broker: its files)."""
    url = settings.CELERY_BROKER_URL
    try:
        if url.startswith(("redis://", "rediss://")):
            import redis

            client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
            keys = [key for queue in Queue for key in
                    (queue.value,
                     *(f"{queue.value}{_REDIS_PRIORITY_SEPARATOR}{step}" for step in _REDIS_PRIORITY_STEPS))]
            return Probe(sum(int(client.llen(key)) for key in keys), "Redis")
        if url.startswith("filesystem://"):
            folder = Path(settings.VAR_DIR) / "celery" / "queue"
            return Probe(sum(1 for p in folder.iterdir() if p.is_file()) if folder.exists() else 0,
                         f"files in {folder}")
    except Exception as exc:  # the broker being down is what this page is for
        log.warning("queue depth: %s", exc)
        return Probe(None, f"the broker did not answer: {exc}")
    return Probe(None, f"not measured for this broker ({url.split(':', 1)[0]})")


def worker_ping(timeout: float = 1.0) -> Probe:
    """Names of the Celery workers that answered a ping; an empty list when none did."""
    try:
        # Celery's current app is the portal's (portal/__init__.py loads it first): asked for here rather than
        # imported from the portal's wiring, which sits above the pages.
        from celery import current_app

        replies = current_app.control.inspect(timeout=timeout).ping() or {}
    except Exception as exc:
        log.warning("worker ping: %s", exc)
        return Probe([], f"no worker answered ({exc})")
    return Probe(sorted(replies), "" if replies else "no worker answered")


# Buckets with errors read per deployment for their status codes: enough for a day of a deployment that fails
# every request (10 s buckets), bounded so that the page stays fast whatever the gateway wrote.
_MAX_ERROR_BUCKETS = 20_000


def gateway_5xx(since: datetime) -> list[dict[str, Any]]:
    """Per deployment, the 5xx answers the gateway gave since `since` (the request statistics), most first: an
    overview that read only events said "No errors" while the gateway answered 500s and 502s."""
    rows = (RequestStats.objects.filter(bucket_start__gte=since, errors__gt=0)
            .order_by("-bucket_start").values_list("deployment_id", "requests", "codes")[:_MAX_ERROR_BUCKETS])
    counts: dict[int, Counter[str]] = defaultdict(Counter)
    for deployment_id, _requests, codes in rows:
        for code, n in (codes or {}).items():
            if str(code).startswith("5") and isinstance(n, int):
                counts[deployment_id][str(code)] += n
    totals = (RequestStats.objects.filter(bucket_start__gte=since, deployment_id__in=list(counts))
              .values("deployment_id").annotate(requests=Sum("requests")))
    requests = {row["deployment_id"]: row["requests"] for row in totals}
    deployments = Deployment.objects.select_related("team").in_bulk(list(counts))
    found = [{"deployment": deployments[pk], "errors": sum(codes.values()), "requests": requests.get(pk, 0),
              "codes": ", ".join(f"{n} x {code}" for code, n in sorted(codes.items()))}
             for pk, codes in counts.items() if codes and pk in deployments]
    return sorted(found, key=lambda row: (-row["errors"], row["deployment"].name))


def recent_failures(hours: int = 24) -> dict[str, Any]:
    since = timezone.now() - timedelta(hours=hours)
    failed = (Deployment.objects.filter(status=Deployment.Status.FAILED)
              .exclude(desired_state=Deployment.Desired.DELETED).select_related("team").order_by("-status_changed_at"))
    errors = (Event.objects.filter(kind=Event.Kind.ERROR, time__gte=since)
              .select_related("deployment__team")[:100])
    return {"hours": hours, "failed": list(failed), "errors": list(errors), "gateway": gateway_5xx(since)}
