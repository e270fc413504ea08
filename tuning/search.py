"""The tuning search: which serving settings to measure, in what order, and when to stop. A pure function over a
`measure(config, concurrency) -> Measurement` callable, so that tests drive it with a synthetic model of throughput
and latency (tuning/tests/test_search.py) and tuning/runner.py with real Tritons and a real load generator.

Not a full grid. Dimensions are explored one after the other, each from the best setting found so far, and a ladder
stops as soon as a step improves throughput by no more than MIN_GAIN or breaks the latency target:

1. instance count 1, 2, 4, ... up to the cores, batching off;
2. at that count, dynamic batching on, max_batch_size 8, 16, 32, ... up to the model's limit, no queue delay;
3. queue delay 500, 2000, 8000 µs with the best batch size;
4. the instance counts next to the best one (double, half), with the best batching (batching moves the optimum).

Before them all, the setting the deployment serves now (`current`) is measured: it is the one an Apply would leave.

Close calls are measured again (`confirm`): one measurement of a setting is one draw of this machine's noise (on
the shared 2-core machine one setting measured twice has differed by more than 10%), and an Apply that flips dynamic
batching on one draw flips it on noise. The best two settings and the current one are each measured REPEATS more
times at the concurrency of their best point, interleaved (A B C A B C, each on a fresh server, so that a drift of
the machine's load hits them all alike), and compared by the median of their runs (only with each other: a setting
left at one run would win on its luck against medians the repeats pulled down). The run-to-run spread of a setting
is (max − min) / median of its runs within the target; two settings are within noise when their medians are no
further apart than the larger of their two spreads. `decide` then keeps the current setting if it is within noise of
the best, or else takes, of the settings within noise of the best, the one closest to the current setting (dynamic
batching on or off first, then instances, batch size, delay): an Apply changes what serves only on a difference the
repeats show is larger than the noise. The result says which (`Decision.note`).

The repeats come out of the budget: while exploring, the search keeps back time for the repeats of what has met the
target so far (REPEATS runs of each, of two settings at most: CONFIRM_RESERVE runs) at the longest measurement so far,
so that a tune whose budget runs out early still re-measures its best two; a third finalist's repeats use what is
left, and where the budget allows fewer the comparison uses the runs it has (and says when there were none).

A setting that never met the target says why (`ConfigResult.missed`): p99 over the target or errors at each
concurrency measured, a server that did not start, the budget or a cancellation ending its ladder.

Each setting is measured from the top of the concurrency range downwards (halving) until p99 meets the target: in a
closed loop more clients give more throughput (until they only queue), so the first level within the target is the
setting's best, usually found with one measurement; its score is that throughput. (An earlier version climbed from
the bottom and stopped when a level gained under MIN_GAIN: on this noisy machine it stopped batched settings at 4
clients, below where batching pays.) The time budget is honoured
before each measurement (what would overrun is skipped, and the outcome is marked partial).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

MIN_GAIN = 0.05  # a step must improve throughput by more than 5% for its ladder to go on
DELAY_LADDER_US = (500, 2000, 8000)
MAX_INSTANCES = 16
REPEATS = 2  # close candidates are measured this many more times (3 runs each), interleaved
CONFIRM_RESERVE = 2 * REPEATS  # measurements kept back from the exploration for the repeats of the best two


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
    repeats: list[Measurement] = field(default_factory=list)  # its best point's concurrency measured again
    repeat_failures: list[str] = field(default_factory=list)  # repeats that could not be measured (count as 0)
    cut: str = ""  # why its concurrency ladder ended before the target was met or the lowest level measured
    current: bool = False  # the setting the deployment serves now

    def best(self, p99_target_ms: float) -> Measurement | None:
        """The highest-throughput point of the exploration that met the target."""
        ok = [p for p in self.points if p.meets(p99_target_ms)]
        return max(ok, key=lambda p: p.throughput) if ok else None

    def samples(self, p99_target_ms: float) -> list[float]:
        """The throughput of each run at its best point's concurrency: the first, then the repeats (a repeat that
        missed the target, or could not be measured, counts as 0: the setting did not hold the target that time)."""
        best = self.best(p99_target_ms)
        if best is None:
            return []
        return [best.throughput, *(r.throughput if r.meets(p99_target_ms) else 0.0 for r in self.repeats),
                *(0.0 for _ in self.repeat_failures)]

    def score(self, p99_target_ms: float) -> float:
        """Its throughput within the target: the median of its runs once repeated, else its one measurement."""
        samples = self.samples(p99_target_ms)
        return float(statistics.median(samples)) if samples else 0.0

    def spread(self, p99_target_ms: float) -> float | None:
        """The run-to-run spread, (max − min) / median of its runs within the target; None before two such runs."""
        best = self.best(p99_target_ms)
        runs = [best.throughput] + [r.throughput for r in self.repeats if r.meets(p99_target_ms)] if best else []
        if len(runs) < 2 or statistics.median(runs) <= 0:
            return None
        return (max(runs) - min(runs)) / statistics.median(runs)

    def missed(self, p99_target_ms: float) -> str:
        """Why no point met the target ('' when one did): what each concurrency measured gave, and what ended the
        ladder early."""
        if self.best(p99_target_ms) is not None:
            return ""
        if self.error and not self.points:
            return self.error
        parts = []
        for p in self.points:
            if p.errors:
                what = f"{p.errors} errors" + (f" of {p.errors + p.requests} requests" if p.requests else "")
            elif p.p99_ms is None or p.throughput <= 0:
                what = "no answer"
            else:
                what = f"p99 {p.p99_ms:.1f} ms"
            parts.append(f"{p.concurrency} clients: {what}")
        measured = "; ".join(parts)
        if self.error:
            return f"{measured}; then {self.error}"
        if self.cut:
            return f"p99 ≤ {p99_target_ms:g} ms not met at the concurrencies measured ({measured}); {self.cut}"
        return f"p99 ≤ {p99_target_ms:g} ms not met at any concurrency measured ({measured})"

    def to_json(self, p99_target_ms: float) -> dict[str, Any]:
        best = self.best(p99_target_ms)
        spread = self.spread(p99_target_ms)
        return {"settings": self.config.to_json(), "label": self.config.label(), "error": self.error,
                "meets_target": best is not None, "missed": self.missed(p99_target_ms), "current": self.current,
                "throughput": self.score(p99_target_ms),
                "p50_ms": best.p50_ms if best else None, "p99_ms": best.p99_ms if best else None,
                "concurrency": best.concurrency if best else None,
                "errors": sum(p.errors for p in self.points),
                "samples": self.samples(p99_target_ms),
                "spread_pct": round(spread * 100, 1) if spread is not None else None,
                "points": [asdict(p) for p in self.points],
                "repeats": [asdict(p) for p in self.repeats]}


@dataclass(frozen=True)
class Decision:
    """Which setting to recommend, and why in one sentence (`note`, '' when there was nothing to compare)."""

    recommendation: Config | None
    note: str = ""
    within_noise: bool = False  # the best and the one compared were within the run-to-run spread of each other
    apart_pct: float | None = None  # how far apart their medians were, % of the lower
    spread_pct: float | None = None  # the margin they were compared with: the larger of their spreads, %
    kept_current: bool = False  # the recommendation is the setting that serves now, though another measured more

    def to_json(self) -> dict[str, Any]:
        return {"note": self.note, "within_noise": self.within_noise, "apart_pct": self.apart_pct,
                "spread_pct": self.spread_pct, "kept_current": self.kept_current}


def distance(config: Config, current: Config | None) -> tuple[float, ...]:
    """How far `config` is from `current`, as an Apply would feel it: dynamic batching switched first, then the
    instance count, batch size and queue delay (by factors of two, in µs)."""
    if current is None:
        return (0.0,)
    both = config.batching and current.batching
    return (float(config.batching != current.batching), abs(math.log2(config.instances / current.instances)),
            abs(math.log2(max(1, config.max_batch_size) / max(1, current.max_batch_size))) if both else 0.0,
            float(abs(config.queue_delay_us - current.queue_delay_us)) if both else 0.0)


def _pct(value: float) -> float:
    return round(value * 100, 1)


def decide(results: list[ConfigResult], p99_target_ms: float, current: Config | None = None) -> Decision:
    """The recommendation from what was measured (see the module's docstring): the best median, unless a setting
    within noise of it is closer to `current` (the current one itself first)."""
    scored = [r for r in results if r.score(p99_target_ms) > 0]
    if not scored:
        return Decision(None)
    # Once settings were re-measured, only they are compared: the median of three runs against another setting's one
    # lucky run would hand the recommendation to whichever unrepeated setting drew the most noise.
    repeated = [r for r in scored if len(r.samples(p99_target_ms)) > 1]
    scored = repeated if len(repeated) >= 2 else scored
    score = {id(r): r.score(p99_target_ms) for r in scored}
    top = max(scored, key=lambda r: score[id(r)])  # ties: the first measured (the current one, then the cheaper)

    def margin(a: ConfigResult, b: ConfigResult) -> float | None:
        known = [s for s in (a.spread(p99_target_ms), b.spread(p99_target_ms)) if s is not None]
        return max(known) if known else None

    def apart(a: ConfigResult, b: ConfigResult) -> float:
        return (score[id(a)] - score[id(b)]) / score[id(b)]

    close = [r for r in scored if r is top or ((m := margin(top, r)) is not None and apart(top, r) <= m)]
    choice = min(close, key=lambda r: (distance(r.config, current), -score[id(r)]))
    mine = next((r for r in scored if r.config == current), None)
    if choice is not top:
        m = margin(top, choice)
        assert m is not None  # only what was within a measured margin is in `close`
        figures = f"within noise ({_pct(apart(top, choice))}% apart, spread {_pct(m)}%)"
        if choice is mine:
            note = (f"{top.config.label()} measured {_pct(apart(top, choice))}% more than the current setting, "
                    f"{figures}: the current setting is kept.")
        else:
            note = (f"{top.config.label()} measured {_pct(apart(top, choice))}% more than {choice.config.label()}, "
                    f"{figures}: {choice.config.label()} is closer to the current setting.")
        return Decision(choice.config, note, True, _pct(apart(top, choice)), _pct(m), kept_current=choice is mine)
    others = sorted((r for r in scored if r is not top), key=lambda r: -score[id(r)])
    rival = mine if mine is not None and mine is not top else (others[0] if others else None)
    if rival is None:
        return Decision(top.config)
    m, gap = margin(top, rival), apart(top, rival)
    versus = "the current setting" if rival is mine else rival.config.label()
    lead = "The current setting measured the most" if top is mine else top.config.label()
    if m is None:
        note = (f"{lead}: {_pct(gap)}% more than {versus}, each measured once (the budget left no time to repeat "
                "them): the difference may be noise.")
        return Decision(top.config, note, False, _pct(gap), None)
    if gap <= m:  # within noise, and the best is also the closest to the current setting
        end = "the current setting is kept." if top is mine else "it is the closer to the current setting."
        note = f"{lead}, within noise ({_pct(gap)}% apart, spread {_pct(m)}%) of {versus}: {end}"
        return Decision(top.config, note, True, _pct(gap), _pct(m), kept_current=top is mine)
    note = f"{lead}: {_pct(gap)}% more than {versus}, beyond the run-to-run spread of {_pct(m)}%: clearly better."
    return Decision(top.config, note, False, _pct(gap), _pct(m))


@dataclass
class Outcome:
    results: list[ConfigResult]
    recommendation: Config | None
    partial: bool  # the budget ran out before the search was done
    planned: int
    decision: Decision = field(default_factory=lambda: Decision(None))

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
           concurrency: tuple[int, int], progress: Progress | None = None, current: Config | None = None,
           clock: Callable[[], float] = time.monotonic, cancelled: Callable[[], bool] = lambda: False) -> Outcome:
    """Search the settings (see the module's docstring); `measure` runs one load test; `current` is the setting that
    serves now (measured first, and kept unless another is better by more than the noise). Never raises for the
    budget: the outcome says `partial`."""
    started = clock()
    instances = instance_ladder(cores)
    batches = batch_ladder(model_max_batch_size)
    levels = concurrency_ladder(*concurrency)
    planned = len(instances) + len(batches) + (len(DELAY_LADDER_US) + 2 if batches else 0) + (current is not None)
    results: list[ConfigResult] = []
    tried: dict[Config, ConfigResult] = {}
    slowest = [0.0]

    def left() -> float:
        return budget_s - (clock() - started)

    def reserve() -> int:
        met = sum(1 for r in results if r.best(p99_target_ms) is not None)
        return min(CONFIRM_RESERVE, REPEATS * met)

    def run(config: Config) -> ConfigResult:
        if config in tried:
            return tried[config]
        result = ConfigResult(config, current=config == current)
        tried[config] = result
        for level in reversed(levels):
            # Skip what would overrun: the longest measurement so far is the estimate of the next, and the repeats
            # of what met the target so far (of the best two at most: CONFIRM_RESERVE runs) must still fit.
            if cancelled() or left() < max(slowest[0] * (1 + reserve()), 0.001):
                if not result.points:
                    del tried[config]
                    raise BudgetSpent
                result.cut = ("the tune was cancelled before fewer clients were measured" if cancelled() else
                              "the budget ran out before fewer clients were measured")
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
            # batches, less delay). This only prunes the walk; what is recommended is decided on repeats.
            if best is None or score(result) > score(best) * (1 + MIN_GAIN):
                best = result
            if result.error or score(result) == 0 or (
                    previous is not None and score(result) <= score(previous) * (1 + MIN_GAIN)):
                break
            previous = result
        return best

    partial = False
    try:
        if current is not None:
            run(current)
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
    if not confirm(measure, finalists(results, p99_target_ms), p99_target_ms, lambda: left() >= slowest[0],
                   cancelled):
        partial = partial or cancelled()
    decision = decide(results, p99_target_ms, current)
    return Outcome(results=results, recommendation=decision.recommendation, partial=partial,
                   planned=max(planned, len(results)), decision=decision)


def finalists(results: list[ConfigResult], p99_target_ms: float) -> list[ConfigResult]:
    """The settings to measure again: the best two by their one measurement, and the current setting (if it met the
    target), in the order the repeats are taken (the best, the current one, the runner-up) when time is short."""
    scored = sorted((r for r in results if r.best(p99_target_ms) is not None), key=lambda r: -r.score(p99_target_ms))
    chosen = scored[:1] + [r for r in scored if r.current][:1] + scored[1:2]
    unique: list[ConfigResult] = []
    for result in chosen:
        if all(result is not u for u in unique):
            unique.append(result)
    return unique if len(unique) > 1 else []


def confirm(measure: Measure, finalists: list[ConfigResult], p99_target_ms: float, fits: Callable[[], bool],
            cancelled: Callable[[], bool]) -> bool:
    """Measure each finalist REPEATS more times at its best point's concurrency, interleaved, while the next run
    `fits` the budget; False when time or a cancellation cut the repeats short."""
    for _ in range(REPEATS):
        for result in finalists:
            if cancelled() or not fits():
                return False
            best = result.best(p99_target_ms)
            assert best is not None  # finalists met the target
            try:
                result.repeats.append(measure(result.config, best.concurrency))
            except MeasureFailed as exc:
                result.repeat_failures.append(str(exc))
    return True


class MeasureFailed(Exception):
    """The setting could not be measured (its server did not start): recorded, and the search goes on."""
