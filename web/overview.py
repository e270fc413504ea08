"""What the operators' overview page (/admin/overview/) shows: Triton servers, GPUs asked for per team, the Celery
queue and workers, and recent failures. Each probe of something outside the database answers with a short note
instead of raising, so that the page renders while the broker or the workers are down."""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from deployments.models import Deployment, Event, TritonServer
from deployments.runtimes.local import triton as local_triton
from portal.queues import Queue

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
    return [{"server": s, "alive": local_triton.is_alive(s.pid)} for s in servers]


def sandbox() -> Probe:
    """Whether this process can sandbox the local Tritons, and what is weaker than designed here."""
    from deployments.runtimes.local.runtime import sandbox_capabilities

    try:
        caps = sandbox_capabilities()
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
                    (queue.value, *(f"{queue.value}{_REDIS_PRIORITY_SEPARATOR}{step}" for step in _REDIS_PRIORITY_STEPS))]
            return Probe(sum(int(client.llen(key)) for key in keys), "Redis")
        if url.startswith("filesystem://"):
            folder = Path(settings.VAR_DIR) / "celery" / "queue"
            return Probe(sum(1 for p in folder.iterdir() if p.is_file()) if folder.exists() else 0, f"files in {folder}")
    except Exception as exc:  # the broker being down is what this page is for
        log.warning("queue depth: %s", exc)
        return Probe(None, f"the broker did not answer: {exc}")
    return Probe(None, f"not measured for this broker ({url.split(':', 1)[0]})")


def worker_ping(timeout: float = 1.0) -> Probe:
    """Names of the Celery workers that answered a ping; an empty list when none did."""
    try:
        from portal.celery import app

        replies = app.control.inspect(timeout=timeout).ping() or {}
    except Exception as exc:
        log.warning("worker ping: %s", exc)
        return Probe([], f"no worker answered ({exc})")
    return Probe(sorted(replies), "" if replies else "no worker answered")


def recent_failures(hours: int = 24) -> dict[str, Any]:
    since = timezone.now() - timedelta(hours=hours)
    failed = (Deployment.objects.filter(status=Deployment.Status.FAILED)
              .exclude(desired_state=Deployment.Desired.DELETED).select_related("team").order_by("-status_changed_at"))
    errors = (Event.objects.filter(kind=Event.Kind.ERROR, time__gte=since)
              .select_related("deployment__team")[:100])
    return {"hours": hours, "failed": list(failed), "errors": list(errors)}
