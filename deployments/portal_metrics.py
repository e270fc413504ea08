"""What the portal's /metrics adds from its own state (issue 34): the pools' memory budgets and what their models
reserve, the canary rollbacks recorded, and the Celery queues' lengths in the broker, so that the alerts on a pool
near its budget, a canary rolled back and worker queues backing up have a metric to read; and whose each model loaded
in a pool is (modelport_pool_model_info), so that the rules can give a cluster pool's Triton series, which only know
a model by its pool name, their team, deployment and revision (platform/observability/prometheus/modelport.rules.yml).

A prometheus_client Collector evaluated at each scrape, in whichever process answers it: the figures come from the
database and the broker, never from one process' memory, so every portal replica exports the same ones. Never a
cost on a request: only /metrics calls it (its own registry, not the global one the gRPC gateway's /metrics also
serves). Labels are ids and validated names (a pool's, a team's, a deployment's, a queue of infra/queues.py), never
free text. The broker is asked within BROKER_TIMEOUT_SECONDS: a broker that does not answer leaves the queue
sample out of that scrape rather than holding /metrics (Prometheus' scrape_timeout is 10 s by default)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from django.conf import settings
from django.db.models import Count, Exists, OuterRef, Q, Sum
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from audit.models import AuditEntry
from deployments import pool_names
from deployments.models import Deployment
from deployments.pool_models import Pool, PoolLoad
from infra.queues import Queue

log = logging.getLogger(__name__)

BROKER_TIMEOUT_SECONDS = 0.5  # connect and each answer; Redis answers LLEN in well under a millisecond
ROLLBACK_ACTION = "deployment.rollback"  # deployments/actions.py, rollback_canary: by a user or by the guardrails
# Kombu's Redis transport keeps a queue's messages of priority p (0, 3, 6, 9) in a list of its own: the queue's
# name, then the name followed by this separator and the step (kombu/transport/redis.py, Channel._q_for_pri).
_REDIS_PRIORITY_STEPS = (0, 3, 6, 9)
_REDIS_PRIORITY_SEP = "\x06\x16"

POOL_BUDGET = "modelport_pool_memory_budget_bytes"
POOL_RESERVED = "modelport_pool_memory_reserved_bytes"
ROLLBACKS = "modelport_canary_rollbacks"  # exposed as ..._total
QUEUE_MESSAGES = "modelport_worker_queue_messages"
POOL_MODEL = "modelport_pool_model_info"


def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily, GaugeMetricFamily,
                         GaugeMetricFamily]:
    return (
        GaugeMetricFamily(POOL_BUDGET, "What the models loaded in a shared pool may take together.",
                          labels=["pool"]),
        GaugeMetricFamily(POOL_RESERVED, "What a pool's loaded models take (as charged when each loaded) plus what "
                                         "its loads under way reserved.", labels=["pool"]),
        CounterMetricFamily(ROLLBACKS, "Canary revisions rolled back (by a user or by their guardrails), per "
                                       "deployment, from the audit log.", labels=["team", "deployment"]),
        GaugeMetricFamily(QUEUE_MESSAGES, "Messages waiting in a Celery queue of the broker (not yet taken by a "
                                          "worker).", labels=["queue"]),
        GaugeMetricFamily(POOL_MODEL, "1 for each model a pool holds a load of: its name in the pool's Triton "
                                      "(pool_model) and whose it is.",
                          labels=["pool", "pool_model", "team", "deployment", "revision", "model"]),
    )


class PortalState(Collector):
    def __init__(self, broker_url: str | None = None, transport_options: Mapping[str, Any] | None = None,
                 timeout: float = BROKER_TIMEOUT_SECONDS) -> None:
        self.broker_url = broker_url
        self.transport_options = transport_options
        self.timeout = timeout

    def describe(self) -> Iterable[Metric]:
        return _families()

    def collect(self) -> Iterator[Metric]:
        budget, reserved, rollbacks, queues, models = _families()
        for name, budget_bytes, used in pool_memory():
            budget.add_metric([name], budget_bytes)
            reserved.add_metric([name], used)
        for labels in pool_models():
            models.add_metric(list(labels), 1)
        for team, deployment, count in canary_rollbacks():
            rollbacks.add_metric([team, deployment], count)
        url = self.broker_url if self.broker_url is not None else settings.CELERY_BROKER_URL
        options = (self.transport_options if self.transport_options is not None
                   else getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}))
        for queue, messages in queue_lengths(url, options, self.timeout).items():
            queues.add_metric([queue], messages)
        yield from (budget, reserved, rollbacks, queues, models)


def pool_memory() -> list[tuple[str, int, int]]:
    """(pool, budget, reserved) of every pool, in one query: what memory_used (deployments/pools.py) counts, the
    loaded revisions' charged bytes plus the loads under way's reservations."""
    rows = Pool.objects.order_by("name").annotate(
        loaded=Sum("loads__memory_bytes", filter=Q(loads__state=PoolLoad.State.LOADED)),
        loading=Sum("loads__reserved_bytes", filter=Q(loads__state=PoolLoad.State.LOADING,
                                                      loads__reserved_bytes__gt=0)),
    ).values_list("name", "memory_budget_bytes", "loaded", "loading")
    return [(name, int(budget), int(loaded or 0) + int(loading or 0)) for name, budget, loaded, loading in rows]


def pool_models() -> list[tuple[str, str, str, str, str, str]]:
    """(pool, pool name, team, deployment, revision, model) of each model of every load of every pool, whatever the
    load's state: an unloaded or failed revision's models may still have series in Prometheus' window, as the local
    relay keeps them (deployments/triton_metrics.py). One query; a revision's model names come from its spec."""
    loads = (PoolLoad.objects.select_related("pool", "deployment__team", "revision")
             .order_by("pool__name", "deployment_id", "revision__number"))
    return [(load.pool.name, pool_names.loaded_name(load.deployment_id, load.revision.number, model),
             load.deployment.team.name, load.deployment.name, str(load.revision.number), model)
            for load in loads for model in sorted(load.revision.spec.model_names)]


def canary_rollbacks() -> list[tuple[str, str, int]]:
    """(team, deployment, rollbacks) of every existing deployment, from the audit rows that rollback_canary writes in
    its transaction. 0 for one never rolled back: Prometheus' increase() counts nothing of a series' first sample, so
    the series must exist before the first rollback for the alert to see it. A deleted deployment's series ends, so
    the labels stay those of today's deployments."""
    exists = Deployment.objects.filter(team_id=OuterRef("team_id"), name=OuterRef("target"))
    counted = (AuditEntry.objects.filter(action=ROLLBACK_ACTION, team__isnull=False).filter(Exists(exists))
               .values_list("team_id", "target").annotate(n=Count("id")).order_by())
    counts = {(team_id, target): n for team_id, target, n in counted}
    rows = Deployment.objects.order_by("team__name", "name").values_list("team_id", "team__name", "name")
    return [(team, name, counts.get((team_id, name), 0)) for team_id, team, name in rows]


def queue_lengths(url: str, options: Mapping[str, Any], timeout: float) -> dict[str, int]:
    """The messages waiting in each queue the portal routes to (infra/queues.py); {} when the broker does not
    answer within `timeout` (logged) or keeps no queue one can count (memory://)."""
    started = time.monotonic()
    try:
        if url.startswith(("redis://", "rediss://")):
            return _redis_lengths(url, timeout)
        if url.startswith("filesystem://"):
            return _filesystem_lengths(str(options.get("data_folder_in", "")))
    except Exception as error:  # noqa: BLE001 (whatever the broker does, /metrics answers without the sample)
        log.warning("worker queues left out of /metrics: the broker did not answer in %.2f s: %s",
                    time.monotonic() - started, type(error).__name__)
    return {}


def _redis_lengths(url: str, timeout: float) -> dict[str, int]:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # No retries: redis-py retries a timeout three times by default, which would quadruple the bound.
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                  retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0)
    try:
        pipe = client.pipeline(transaction=False)
        for queue in Queue:
            for step in _REDIS_PRIORITY_STEPS:
                pipe.llen(f"{queue}{_REDIS_PRIORITY_SEP}{step}" if step else str(queue))
        lengths = pipe.execute()
    finally:
        client.close()
    steps = len(_REDIS_PRIORITY_STEPS)
    return {str(queue): int(sum(lengths[i * steps:(i + 1) * steps])) for i, queue in enumerate(Queue)}


def _filesystem_lengths(folder: str) -> dict[str, int]:
    """The transport's queued messages: one file "<time>_<uuid>.<queue>.msg" each, until a worker takes it
    (infra/kombu_filesystem.py; ".part" files are still being written)."""
    counts = {str(queue): 0 for queue in Queue}
    if not folder or not os.path.isdir(folder):
        return counts
    with os.scandir(folder) as entries:
        for entry in entries:
            name = entry.name
            if not name.endswith(".msg"):
                continue
            queue = name[:-len(".msg")].rpartition(".")[2]
            if queue in counts:
                counts[queue] += 1
    return counts
