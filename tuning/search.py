"""The tuning search: which serving settings to measure, in what order, and when to stop. A pure function over a
`measure(config, concurrency) -> Measurement` callable, so that tests drive it with a synthetic model of throughput
and latency (tuning/tests/test_search.py) and tuning/runner.py with real Tritons and a real load generator.

Not a full grid. Dimensions are explored one after the other, each from the best setting found so far, and a ladder
stops as soon as a step improves throughput by no more than MIN_GAIN or breaks the latency target:

1. instance count 1, 2, 4, ... up to the cores, batching off;
2. at that count, dynamic batching on, max_batch_size 8, 16, 32, ... up to the model's limit, no queue delay;
3. queue delay 500, 2000, 8000 µs with the best batch size;
4. the instance counts next to the best one (double, half), with the best batching (batching moves the optimum).

The recommendation is the best setting measured, whichever stage found it.

Each setting is measured from the top of the concurrency range downwards (halving) until p99 meets the target: in a
closed loop more clients give more throughput (until they only queue), so the first level within the target is the
setting's best, usually found with one measurement; its score is that throughput. (An earlier version climbed from
the bottom and stopped when a level gained under MIN_GAIN: on this noisy machine it stopped batched settings at 4
clients, below where batching pays.) The time budget is honoured
before each measurement (what would overrun is skipped, and the outcome is marked partial).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

MIN_GAIN = 0.05  # a step must improve throughput by more than 5% for its ladder to go on
DELAY_LADDER_US = (500, 2000, 8000)
MAX_INSTANCES = 16


@dataclass(frozen=True)
class Config:
    """The settings a tune varies. batching False: dynamic batching off (max_batch_size keeps the model's)."""

    instances: int = 1
    batching: bool = False
    max_batch_size: int = 0
    queue_delay_us: int = 0

    def label(self) -> str:
        if not self.batching:
            return f"{self.instances} inst, batching off"
        return f"{self.instances} inst, batch {self.max_batch_size}, delay {self.queue_delay_us} µs"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Config:
        return cls(instances=int(data["instances"]), batching=bool(data["batching"]),
                   max_batch_size=int(data["max_batch_size"]), queue_delay_us=int(data["queue_delay_us"]))


@dataclass(frozen=True)
class Measurement:
    """One load-generator run against one setting at one concurrency."""

    concurrency: int
    throughput: float  # successful requests per second
    p50_ms: float | None
    p99_ms: float | None
    errors: int = 0
    seconds: float = 0.0  # wall time the measurement took (for the budget)
    loadgen_cpu_s: float = 0.0  # the load generator's own CPU time (user + system), warm-up and start included
    requests: int = 0  # answered in the measurement window

    def meets(self, p99_target_ms: float) -> bool:
        return self.errors == 0 and self.p99_ms is not None and self.p99_ms <= p99_target_ms and self.throughput > 0


@dataclass
class ConfigResult:
    config: Config
    points: list[Measurement] = field(default_factory=list)
    error: str = ""  # the setting could not be measured (its Triton did not start, say)

    def best(self, p99_target_ms: float) -> Measurement | None:
        """The highest-throughput point that met the target."""
        ok = [p for p in self.points if p.meets(p99_target_ms)]
        return max(ok, key=lambda p: p.throughput) if ok else None

    def score(self, p99_target_ms: float) -> float:
        best = self.best(p99_target_ms)
        return best.throughput if best else 0.0

    def to_json(self, p99_target_ms: float) -> dict[str, Any]:
        best = self.best(p99_target_ms)
        return {"settings": self.config.to_json(), "label": self.config.label(), "error": self.error,
                "meets_target": best is not None,
                "throughput": best.throughput if best else 0.0,
                "p50_ms": best.p50_ms if best else None, "p99_ms": best.p99_ms if best else None,
                "concurrency": best.concurrency if best else None,
                "errors": sum(p.errors for p in self.points),
                "points": [asdict(p) for p in self.points]}


@dataclass
class Outcome:
    results: list[ConfigResult]
    recommendation: Config | None
    partial: bool  # the budget ran out before the search was done
    planned: int

    def frontier(self) -> list[Measurement]:
        """The measured points no other point beats on both throughput and p99 (errors excluded), by p99."""
        points = [p for r in self.results for p in r.points if p.errors == 0 and p.p99_ms is not None]
        front = [p for p in points if not any(
            (q.throughput >= p.throughput and (q.p99_ms or 0) <= (p.p99_ms or 0))
            and (q.throughput > p.throughput or (q.p99_ms or 0) < (p.p99_ms or 0)) for q in points)]
        return sorted(front, key=lambda p: p.p99_ms or 0)


Measure = Callable[[Config, int], Measurement]
Progress = Callable[[int, int, float], None]  # (configs done, configs planned, seconds left)


class BudgetSpent(Exception):
    pass


def instance_ladder(cores: int) -> list[int]:
    top = max(1, min(cores, MAX_INSTANCES))
    ladder = [1]
    while ladder[-1] * 2 <= top:
        ladder.append(ladder[-1] * 2)
    if ladder[-1] != top:
        ladder.append(top)
    return ladder


def batch_ladder(model_max_batch_size: int) -> list[int]:
    return [size for size in (8, 16, 32, 64, 128, 256) if size <= model_max_batch_size] or (
        [model_max_batch_size] if model_max_batch_size > 0 else [])


def concurrency_ladder(low: int, high: int) -> list[int]:
    levels = [low]
    while levels[-1] * 2 < high:
        levels.append(levels[-1] * 2)
    if levels[-1] != high:
        levels.append(high)
    return levels


def search(measure: Measure, *, p99_target_ms: float, budget_s: float, cores: int, model_max_batch_size: int,
           concurrency: tuple[int, int], progress: Progress | None = None,
           clock: Callable[[], float] = time.monotonic, cancelled: Callable[[], bool] = lambda: False) -> Outcome:
    """Search the settings (see the module's docstring); `measure` runs one load test. Never raises for the budget:
    the outcome says `partial`."""
    started = clock()
    instances = instance_ladder(cores)
    batches = batch_ladder(model_max_batch_size)
    levels = concurrency_ladder(*concurrency)
    planned = len(instances) + len(batches) + (len(DELAY_LADDER_US) + 2 if batches else 0)
    results: list[ConfigResult] = []
    tried: dict[Config, ConfigResult] = {}
    slowest = [0.0]

    def left() -> float:
        return budget_s - (clock() - started)

    def run(config: Config) -> ConfigResult:
        if config in tried:
            return tried[config]
        result = ConfigResult(config)
        tried[config] = result
        for level in reversed(levels):
            # Skip what would overrun: the longest measurement so far is the estimate of the next.
            if cancelled() or left() < max(slowest[0], 0.001):
                if not result.points:
                    del tried[config]
                    raise BudgetSpent
                break
            try:
                point = measure(config, level)
            except MeasureFailed as exc:
                result.error = str(exc)
                break
            slowest[0] = max(slowest[0], point.seconds)
            result.points.append(point)
            if point.meets(p99_target_ms):
                break  # the most clients within the target: in a closed loop, the most throughput within it
        results.append(result)
        if progress is not None:
            done = len(results)
            rate = (clock() - started) / done
            progress(done, max(planned, done), max(0.0, min(left(), rate * (max(planned, done) - done))))
        return result

    def score(result: ConfigResult | None) -> float:
        return result.score(p99_target_ms) if result is not None else 0.0

    def ladder(configs: Iterable[Config], previous: ConfigResult | None = None) -> ConfigResult | None:
        """Walk one dimension while each step beats the step before by more than MIN_GAIN (a step that misses the
        target, or cannot be measured, ends it too); the best of the steps taken (and `previous`)."""
        best = previous
        for config in configs:
            result = run(config)
            # Within MIN_GAIN counts as no better: the earlier step is the cheaper one (fewer instances, smaller
            # batches, less delay), and the difference is within this machine's noise.
            if best is None or score(result) > score(best) * (1 + MIN_GAIN):
                best = result
            if result.error or score(result) == 0 or (
                    previous is not None and score(result) <= score(previous) * (1 + MIN_GAIN)):
                break
            previous = result
        return best

    partial = False
    try:
        unbatched = ladder(Config(instances=n) for n in instances)
        n = unbatched.config.instances if unbatched else 1
        if batches:
            # Batching is a dimension of its own: its steps are compared with each other, not with batching off
            # (the first batch size may lose to it where a larger one wins).
            batched = ladder(Config(instances=n, batching=True, max_batch_size=b) for b in batches)
            if batched is not None and score(batched) > 0:
                base = batched.config
                batched = ladder((Config(base.instances, True, base.max_batch_size, d) for d in DELAY_LADDER_US),
                                 batched)
                c = batched.config if batched is not None else base
                for m in instances:
                    # Batching moves the best instance count: the neighbours of the one found, once each.
                    if m != c.instances and (m == c.instances * 2 or m * 2 == c.instances):
                        run(Config(m, True, c.max_batch_size, c.queue_delay_us))
    except BudgetSpent:
        partial = True
    scored = [r for r in results if r.best(p99_target_ms) is not None]
    recommendation = max(scored, key=lambda r: r.score(p99_target_ms)).config if scored else None
    return Outcome(results=results, recommendation=recommendation, partial=partial, planned=max(planned, len(results)))


class MeasureFailed(Exception):
    """The setting could not be measured (its server did not start): recorded, and the search goes on."""
