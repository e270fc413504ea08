"""A deployment's performance over a window, per revision and model: what the API answers and the page shows.

The gateway's figures come from its request rows (gateway/stats.py: percentiles of the whole request, Triton's time
included), per revision and per model called (the rows' model: its name in the deployment; requests naming no model
of the deployment count in the revision's totals only); Triton's from the snapshots (performance/snapshots.py)
through performance/figures.py: means, since Triton keeps sums. Each figure says which it is (`statistic`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from deployments.models import Deployment, Revision
from deployments.revision_spec import RevisionSpec
from gateway.models import LATENCY_BUCKETS_MS, RequestStats
from gateway.stats import BUCKET_SECONDS, percentile_ms
from performance.advice import Settings, advice
from performance.figures import ModelCounters, ModelFigures, Snapshot, gateway_own_ms, window_figures
from performance.models import TritonSnapshot

ROLES = ("serving", "canary", "earlier")
# What each answer's figures are (its `statistic`): the gateway's (a revision's and a model's alike), Triton's.
GATEWAY_STATISTICS = ("percentiles",)
MODEL_STATISTICS = ("mean",)
BUCKET = timedelta(seconds=BUCKET_SECONDS)


@dataclass(frozen=True)
class _Role:
    revision: Revision
    role: str  # "serving", "canary", "earlier"


def _settings(spec: RevisionSpec, model: str) -> Settings:
    entry = spec.entry(model)
    if entry is None:
        return Settings()
    batching = entry.dynamic_batching
    return Settings(max_batch_size=entry.max_batch_size, dynamic_batching=batching is not None,
                    max_queue_delay_us=batching.max_queue_delay_microseconds if batching else 0,
                    preferred_batch_sizes=tuple(batching.preferred_batch_size) if batching else (),
                    instances=entry.instance_group.count)


def _steps(spec: RevisionSpec) -> dict[str, list[str]]:
    """model -> the pipelines of the revision it is a step of."""
    found: dict[str, list[str]] = {}
    for entry in spec.models:
        for step in entry.ensemble_steps:
            found.setdefault(step.model, []).append(entry.name)
    return found


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _model(figures: ModelFigures, spec: RevisionSpec, steps: dict[str, list[str]], name: str,
           gateway: dict[str, Any]) -> dict[str, Any]:
    entry = spec.entry(figures.model)
    return {
        "model": figures.model,
        "pipeline": bool(entry and entry.is_pipeline),
        "step_of": sorted(set(steps.get(figures.model, []))),
        "statistic": "mean",
        "requests": figures.requests,
        "errors": figures.errors,
        "executions": figures.executions,
        "inferences": figures.inferences,
        "request_ms": _round(figures.request_ms),
        "queue_ms": _round(figures.queue_ms),
        "compute_input_ms": _round(figures.compute_input_ms),
        "compute_infer_ms": _round(figures.compute_infer_ms),
        "compute_output_ms": _round(figures.compute_output_ms),
        "queue_share": _round(figures.queue_share, 4),
        "mean_batch_size": _round(figures.mean_batch_size, 2),
        "batch_sizes": [{"batch_size": size, "executions": count} for size, count in figures.batch_sizes.items()],
        "restarted": figures.restarted,
        "gateway": gateway,
        # A pipeline has no instances or batching of its own to change (its steps do): its steps get the advice.
        "advice": [] if entry is None or entry.is_pipeline else advice(figures, _settings(spec, figures.model), name),
    }


def _gateway(rows: list[RequestStats], triton_ns: int | None = None,
             triton_mean_ms: float | None = None) -> dict[str, Any]:
    """The gateway's figures over the rows. Its own time: its latency less Triton's, given as Triton's time for the
    requests it sent (`triton_ns`: a revision's models called) or as Triton's mean time per request of one model
    (`triton_mean_ms`: a model's own share, a pipeline's step called directly too, whose Triton count includes the
    pipeline's calls of it)."""
    histogram = [0] * len(LATENCY_BUCKETS_MS)
    requests = errors = 0
    latency = 0.0
    for row in rows:
        histogram = [a + b for a, b in zip(histogram, row.latency_histogram or [0] * len(histogram), strict=False)]
        requests += row.requests
        errors += row.errors
        latency += row.latency_sum_ms
    return {
        "statistic": "percentiles",
        "requests": requests,
        "errors": errors,
        "error_rate": round(errors / requests, 4) if requests else None,
        "p50_ms": _round(percentile_ms(histogram, 0.50)),
        "p95_ms": _round(percentile_ms(histogram, 0.95)),
        "p99_ms": _round(percentile_ms(histogram, 0.99)),
        "mean_ms": _round(latency / requests) if requests else None,
        "own_mean_ms": _round(_own(latency, requests, triton_ns, triton_mean_ms)),
    }


def _own(latency_ms: float, requests: int, triton_ns: int | None, triton_mean_ms: float | None) -> float | None:
    if triton_ns is not None:
        return gateway_own_ms(latency_ms, requests, triton_ns)
    if triton_mean_ms is not None:
        return gateway_own_ms(latency_ms, requests, int(triton_mean_ms * 1e6 * requests))
    return None


def _roles(deployment: Deployment, numbers: set[int]) -> list[_Role]:
    roles = {}
    for revision in Revision.objects.filter(deployment=deployment, number__in=numbers):
        roles[revision.number] = _Role(revision, "earlier")
    for current, role in ((deployment.serving_revision, "serving"), (deployment.canary_revision, "canary")):
        if current is not None:
            roles[current.number] = _Role(current, role)
    return [roles[number] for number in sorted(roles, reverse=True)]


def performance(deployment: Deployment, window: timedelta, now: datetime | None = None) -> dict[str, Any]:
    """The figures of each revision that served in the window (the serving one and a canary always)."""
    now = now or timezone.now()
    start = now - window
    interval = timedelta(seconds=settings.PERFORMANCE_SNAPSHOT_SECONDS)
    # The snapshot just before the window's start too, so the window is covered from its beginning.
    snapshots: dict[int, list[Snapshot]] = {}
    for row in TritonSnapshot.objects.filter(deployment=deployment, taken_at__gte=start - interval * 1.5,
                                             taken_at__lte=now).order_by("taken_at"):
        models = {str(name): ModelCounters.from_json(data) for name, data in (row.counters or {}).items()}
        snapshots.setdefault(row.revision, []).append(Snapshot(row.taken_at, models))
    gateway_rows: dict[int, list[RequestStats]] = {}
    for stats in RequestStats.objects.filter(deployment=deployment, bucket_start__gte=start, revision__gt=0):
        gateway_rows.setdefault(stats.revision, []).append(stats)
    revisions = []
    for each in _roles(deployment, set(snapshots) | set(gateway_rows)):
        spec = each.revision.spec
        taken = snapshots.get(each.revision.number, [])
        figures = window_figures(taken, spec.model_names)
        steps = _steps(spec)
        # Triton's time for what the gateway sent: the models called (not a pipeline's steps, inside its time).
        entry_ns = sum(f.requests * (f.request_ms or 0.0) * 1e6 for f in figures if f.model not in steps)
        rows = gateway_rows.get(each.revision.number, [])
        if len(taken) >= 2:  # the gateway's requests over the span the snapshots cover, to compare like with like
            # (a bucket that overlaps the span counts: buckets are BUCKET_SECONDS, snapshots a minute apart)
            first, last = taken[0].taken_at, taken[-1].taken_at
            rows = [r for r in rows if first < r.bucket_start + BUCKET and r.bucket_start <= last]
        by_model: dict[str, list[RequestStats]] = {}
        for stored in rows:
            if stored.model:
                by_model.setdefault(stored.model, []).append(stored)
        covered = len(taken) >= 2
        each_model = [_model(f, spec, steps, deployment.name,
                         _gateway(by_model.get(f.model, []), None, f.request_ms if covered else None))
                  for f in figures]
        revisions.append({
            "revision": each.revision.number,
            "role": each.role,
            "from": taken[0].taken_at.isoformat() if len(taken) >= 2 else None,
            "to": taken[-1].taken_at.isoformat() if len(taken) >= 2 else None,
            "snapshots": len(taken),
            "gateway": _gateway(rows, int(entry_ns) if len(taken) >= 2 else None),
            "models": each_model,
        })
    return {
        "deployment": deployment.name,
        "window_seconds": int(window.total_seconds()),
        "snapshot_seconds": settings.PERFORMANCE_SNAPSHOT_SECONDS,
        "revisions": revisions,
    }
