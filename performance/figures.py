"""Where a deployment's time goes over a window: Triton's cumulative statistics (its statistics extension, `GET
/v2/models/stats`) read as snapshots, and the difference of snapshots turned into per-request figures.

Plain code, no Django. `parse_statistics()` is the front door for what a Triton answers (a team's server: its JSON is
untrusted and bounded here); `window_figures()` turns the snapshots of a window into each model's requests, errors,
mean queue and compute times and the batch sizes Triton formed. Triton keeps sums (counts and nanoseconds), never
quantiles: these figures are means, and say so.

A Triton that restarted counts from zero again. Between two snapshots a counter that went down is a restart: what
the later snapshot counts is what happened since (the way Prometheus' increase() reads a reset), so a window across
a restart loses at most the requests between the last snapshot and the restart, and no figure is ever negative.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

# Triton's inference_stats durations, each {count, ns}. success: whole requests inside Triton (queue and compute);
# fail: requests that failed; queue: waiting for an instance; compute_*: per request, apart.
DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
# Bounds on one answer (a team's model can be anything Triton loads): more models than a revision could hold, or
# more batch sizes than any max_batch_size allows, are cut off rather than stored.
MAX_MODELS = 256
MAX_BATCH_SIZES = 1024
MAX_NAME = 255
_MAX_COUNTER = 2**63 - 1


@dataclass(frozen=True)
class Duration:
    count: int = 0
    ns: int = 0


@dataclass(frozen=True)
class ModelCounters:
    """One model's cumulative counters at one moment (summed over its versions)."""

    durations: Mapping[str, Duration] = field(default_factory=dict)  # by DURATIONS name
    batches: Mapping[int, int] = field(default_factory=dict)  # batch size -> executions of that size
    execution_count: int = 0
    inference_count: int = 0

    def duration(self, name: str) -> Duration:
        return self.durations.get(name, Duration())

    @cached_property
    def vector(self) -> tuple[int, ...]:
        """Every counter but the batches', in one order: what restarted() compares (a third of a 24 h window's
        time went to looking them up one by one)."""
        found = [self.duration(name) for name in DURATIONS]
        return (*(d.count for d in found), *(d.ns for d in found), self.execution_count, self.inference_count)

    def to_json(self) -> dict[str, Any]:
        return {"d": {name: [d.count, d.ns] for name, d in self.durations.items()},
                "b": {str(size): count for size, count in self.batches.items()},
                "e": self.execution_count, "i": self.inference_count}

    @classmethod
    def from_json(cls, data: Any) -> ModelCounters:
        if not isinstance(data, Mapping):
            return cls()
        raw = _mapping(data.get("d"))
        durations = {name: Duration(_count(pair[0]), _count(pair[1])) for name, pair in raw.items()
                     if name in DURATIONS and isinstance(pair, list) and len(pair) == 2}
        batches_raw = _mapping(data.get("b"))
        batches = {}
        for size, count in batches_raw.items():
            number = _count(size)
            if number > 0:
                batches[number] = _count(count)
        return cls(durations=durations, batches=batches, execution_count=_count(data.get("e")),
                   inference_count=_count(data.get("i")))


@dataclass(frozen=True)
class Snapshot:
    """Every model's counters of one revision's Triton at `taken_at`."""

    taken_at: datetime
    models: Mapping[str, ModelCounters]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _count(value: Any) -> int:
    """A counter as Triton writes it (a number, or a string of digits for uint64 in some versions); anything
    else, negative or absurd, is 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, str):
        value = value.strip()
        if not value.isascii() or not value.isdigit() or len(value) > 19:
            return 0
        value = int(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return 0
        value = int(value)
    if not isinstance(value, int) or value < 0 or value > _MAX_COUNTER:
        return 0
    return value


def _duration(value: Any) -> Duration:
    if not isinstance(value, Mapping):
        return Duration()
    return Duration(_count(value.get("count")), _count(value.get("ns")))


def parse_statistics(data: Any, prefix: str = "") -> dict[str, ModelCounters]:
    """Triton's /v2/models/stats answer as counters per model name. `prefix`: a pool's names of this revision's
    models (`d7-r2-`): only names with it are kept, without it. Versions of one model are added up. Anything
    malformed counts as nothing."""
    rows = data.get("model_stats") if isinstance(data, Mapping) else None
    if not isinstance(rows, list):
        return {}
    found: dict[str, ModelCounters] = {}
    for row in rows[:MAX_MODELS * 4]:
        if not isinstance(row, Mapping) or not isinstance(row.get("name"), str):
            continue
        name = row["name"]
        if prefix:
            if not name.startswith(prefix):
                continue
            name = name[len(prefix):]
        if not name or len(name) > MAX_NAME or (name not in found and len(found) >= MAX_MODELS):
            continue
        stats = _mapping(row.get("inference_stats"))
        batches: dict[int, int] = {}
        batch_rows = row.get("batch_stats")
        if not isinstance(batch_rows, list):
            batch_rows = []
        for batch in batch_rows[:MAX_BATCH_SIZES]:
            if not isinstance(batch, Mapping):
                continue
            size = _count(batch.get("batch_size"))
            if size > 0:
                batches[size] = batches.get(size, 0) + _duration(batch.get("compute_infer")).count
        counters = ModelCounters(durations={name_: _duration(stats.get(name_)) for name_ in DURATIONS},
                                 batches=batches, execution_count=_count(row.get("execution_count")),
                                 inference_count=_count(row.get("inference_count")))
        found[name] = _add(found[name], counters) if name in found else counters
    return found


def _add(a: ModelCounters, b: ModelCounters) -> ModelCounters:
    durations = {name: Duration(a.duration(name).count + b.duration(name).count,
                                a.duration(name).ns + b.duration(name).ns) for name in DURATIONS}
    batches = dict(a.batches)
    for size, count in b.batches.items():
        batches[size] = batches.get(size, 0) + count
    return ModelCounters(durations=durations, batches=batches, execution_count=a.execution_count + b.execution_count,
                         inference_count=a.inference_count + b.inference_count)


def restarted(before: ModelCounters, after: ModelCounters) -> bool:
    """Whether a counter went down from `before` to `after`: the server counted from zero again in between."""
    if any(later < earlier for earlier, later in zip(before.vector, after.vector, strict=True)):
        return True
    return any(after.batches.get(size, 0) < count for size, count in before.batches.items())


def difference(before: ModelCounters | None, after: ModelCounters) -> tuple[ModelCounters, bool]:
    """What happened between two snapshots of one model, and whether it restarted in between (then: all that
    `after` counts). A model absent before (loaded since) counts from zero."""
    if before is None:
        return after, False
    if restarted(before, after):
        return after, True
    durations = {n: Duration(after.duration(n).count - before.duration(n).count,
                             after.duration(n).ns - before.duration(n).ns) for n in DURATIONS}
    batches = {size: count - before.batches.get(size, 0) for size, count in after.batches.items()
               if count - before.batches.get(size, 0) > 0}
    return ModelCounters(durations=durations, batches=batches,
                         execution_count=after.execution_count - before.execution_count,
                         inference_count=after.inference_count - before.inference_count), False


@dataclass(frozen=True)
class ModelFigures:
    """One model over a window. Times are means per request in milliseconds (None without requests): Triton's
    statistics are sums, so there are no percentiles here."""

    model: str
    requests: int  # requests that succeeded
    errors: int  # requests that failed inside Triton
    executions: int  # model executions (a batch is one)
    inferences: int  # inferences (a batch of 8 is 8)
    request_ms: float | None  # a successful request's whole time inside Triton
    queue_ms: float | None
    compute_input_ms: float | None
    compute_infer_ms: float | None
    compute_output_ms: float | None
    batch_sizes: Mapping[int, int]  # executions per batch size Triton formed
    restarted: bool  # its server restarted during the window (what it counted before is lost)

    @property
    def mean_batch_size(self) -> float | None:
        executions = sum(self.batch_sizes.values())
        if not executions:
            return None
        return sum(size * count for size, count in self.batch_sizes.items()) / executions

    @property
    def queue_share(self) -> float | None:
        """The part of a request's time in Triton spent waiting in the queue (of queue plus compute)."""
        parts = [self.queue_ms, self.compute_input_ms, self.compute_infer_ms, self.compute_output_ms]
        if any(part is None for part in parts):
            return None
        total = sum(part for part in parts if part is not None)
        return (self.queue_ms or 0.0) / total if total > 0 else None


def _mean_ms(duration: Duration) -> float | None:
    return duration.ns / duration.count / 1e6 if duration.count else None


def model_figures(model: str, counted: ModelCounters, restarts: bool = False) -> ModelFigures:
    """A model's figures from what it counted over a window (a difference())."""
    return ModelFigures(
        model=model, requests=counted.duration("success").count, errors=counted.duration("fail").count,
        executions=counted.execution_count, inferences=counted.inference_count,
        request_ms=_mean_ms(counted.duration("success")), queue_ms=_mean_ms(counted.duration("queue")),
        compute_input_ms=_mean_ms(counted.duration("compute_input")),
        compute_infer_ms=_mean_ms(counted.duration("compute_infer")),
        compute_output_ms=_mean_ms(counted.duration("compute_output")),
        batch_sizes=dict(sorted(counted.batches.items())), restarted=restarts)


def window_counters(snapshots: Sequence[Snapshot]) -> dict[str, tuple[ModelCounters, bool]]:
    """Each model's counts over the snapshots (oldest first), with whether its server restarted in between. Fewer
    than two snapshots: nothing is known yet.

    Between restarts the counts are the last snapshot's less the first's of that stretch; a restart between any two
    snapshots starts a new stretch from zero (what the later one counts). Only the stretches' ends are subtracted:
    the whole API answer for a 24 h window (1,440 snapshots of four models) took 340 ms here summed step by step
    (window_counters_stepwise, the specification a property test compares this with), 150 ms so."""
    ordered = sorted(snapshots, key=lambda s: s.taken_at)
    if len(ordered) < 2:
        return {}
    totals: dict[str, tuple[ModelCounters, bool]] = {}
    for name in {name for snapshot in ordered[1:] for name in snapshot.models}:
        parts: list[ModelCounters] = []
        reset = False
        base = last = ordered[0].models.get(name)  # base None: the stretch counts from zero
        for snapshot in ordered[1:]:
            current = snapshot.models.get(name)
            if current is None:  # unloaded (a pool's idle model): loaded again, it counts from zero
                if last is not None:
                    parts.append(difference(base, last)[0])
                base = last = None
                continue
            if last is not None and restarted(last, current):
                parts.append(difference(base, last)[0])
                base, reset = None, True
            last = current
        if last is not None:
            parts.append(difference(base, last)[0])
        total = parts[0]
        for part in parts[1:]:
            total = _add(total, part)
        totals[name] = (total, reset)
    return totals


def window_counters_stepwise(snapshots: Sequence[Snapshot]) -> dict[str, tuple[ModelCounters, bool]]:
    """The plain specification of window_counters: every step's difference, added up."""
    ordered = sorted(snapshots, key=lambda s: s.taken_at)
    totals: dict[str, tuple[ModelCounters, bool]] = {}
    for before, after in zip(ordered, ordered[1:], strict=False):
        for name, counters in after.models.items():
            step, reset = difference(before.models.get(name), counters)
            if name in totals:
                total, seen = totals[name]
                totals[name] = (_add(total, step), seen or reset)
            else:
                totals[name] = (step, reset)
    return totals


def window_figures(snapshots: Sequence[Snapshot], models: Sequence[str]) -> list[ModelFigures]:
    """The figures of `models` (a revision's, in its order) over the snapshots; a model no snapshot names gets
    zeros."""
    counted = window_counters(snapshots)
    return [model_figures(name, *counted.get(name, (ModelCounters(), False))) for name in models]


def gateway_own_ms(latency_sum_ms: float, requests: int, triton_request_ns: int) -> float | None:
    """The gateway's own mean time per request: its whole latency (Triton's time included) less Triton's time for
    the requests it sent (the success ns of the models called, pipeline steps excluded: their time is inside the
    pipeline's). Never below zero: the two are counted by different clocks over windows a few seconds apart."""
    if requests <= 0:
        return None
    return max(0.0, (latency_sum_ms - triton_request_ns / 1e6) / requests)
