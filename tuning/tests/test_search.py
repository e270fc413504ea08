"""The search prunes (fewer measurements than the grid), finds a setting close to the grid's best within the target,
honours its time budget and cancellation, and goes on past a setting that cannot be measured. Synthetic measure
(tuning/tests/synthetic.py): milliseconds per test."""

from __future__ import annotations

from collections.abc import Callable

from tuning.search import (
    REPEATS,
    Config,
    ConfigResult,
    Measurement,
    batch_ladder,
    concurrency_ladder,
    decide,
    instance_ladder,
    search,
)
from tuning.tests.synthetic import Synthetic


def run(model: Synthetic, **kwargs: object) -> object:
    options: dict[str, object] = {"p99_target_ms": 20.0, "budget_s": 3600.0, "cores": model.cores,
                                  "model_max_batch_size": 64, "concurrency": (1, 32), "clock": model.clock}
    options.update(kwargs)
    return search(model, **options)  # type: ignore[arg-type]


def test_the_ladders_fit_the_machine_and_the_model() -> None:
    assert instance_ladder(1) == [1]
    assert instance_ladder(6) == [1, 2, 4, 6]
    assert instance_ladder(64) == [1, 2, 4, 8, 16]
    assert batch_ladder(64) == [8, 16, 32, 64]
    assert batch_ladder(4) == [4]
    assert batch_ladder(0) == []
    assert concurrency_ladder(1, 32) == [1, 2, 4, 8, 16, 32]
    assert concurrency_ladder(3, 20) == [3, 6, 12, 20]
    assert concurrency_ladder(8, 8) == [8]


def test_it_finds_a_setting_within_ten_percent_of_the_grid_with_fewer_measurements() -> None:
    model = Synthetic(cores=4)
    outcome = run(model, cores=4)
    assert outcome.recommendation is not None  # type: ignore[attr-defined]
    best = next(r for r in outcome.results if r.config == outcome.recommendation)  # type: ignore[attr-defined]
    grid = model.grid_best(20.0, 64, (1, 32))
    assert best.score(20.0) >= 0.9 * grid
    assert best.best(20.0).p99_ms <= 20.0
    grid_measurements = len(instance_ladder(4)) * (1 + 4 * 4) * len(concurrency_ladder(1, 32))
    assert len(model.calls) < grid_measurements / 4, len(model.calls)
    assert not outcome.partial  # type: ignore[attr-defined]


def test_it_stops_a_ladder_when_throughput_stops_improving() -> None:
    model = Synthetic(cores=2)
    run(model, cores=16)  # 16 cores claimed, 2 real: 4 instances gain nothing, so 8 and 16 are never tried
    tried = {config.instances for config, _ in model.calls if not config.batching}
    assert tried == {1, 2, 4}


def test_batching_helps_and_is_recommended() -> None:
    model = Synthetic(cores=2)
    outcome = run(model)
    assert outcome.recommendation.batching  # type: ignore[attr-defined]
    unbatched = max(r.score(20.0) for r in outcome.results if not r.config.batching)  # type: ignore[attr-defined]
    batched = max(r.score(20.0) for r in outcome.results if r.config.batching)  # type: ignore[attr-defined]
    assert batched > 2 * unbatched


def test_a_target_nothing_meets_ends_the_search_and_recommends_nothing() -> None:
    model = Synthetic(cores=2)
    outcome = run(model, p99_target_ms=1.0)  # nothing answers in 1 ms
    assert outcome.recommendation is None  # type: ignore[attr-defined]
    # Every concurrency was tried, from the top down, for one setting unbatched and one batched; then it stopped.
    assert [len(r.points) for r in outcome.results] == [6, 6]  # type: ignore[attr-defined]
    assert [p.concurrency for p in outcome.results[0].points] == [32, 16, 8, 4, 2, 1]  # type: ignore[attr-defined]


def test_each_setting_is_measured_from_the_most_clients_down_to_the_first_within_the_target() -> None:
    model = Synthetic(cores=2)
    outcome = run(model, p99_target_ms=20.0)
    for result in outcome.results:  # type: ignore[attr-defined]
        levels = [p.concurrency for p in result.points]
        assert levels == sorted(levels, reverse=True) and levels[0] == 32
        assert all(not p.meets(20.0) for p in result.points[:-1])


def test_it_honours_the_budget_and_marks_the_outcome_partial() -> None:
    model = Synthetic(cores=4, seconds_per_measurement=5.0)
    outcome = run(model, cores=4, budget_s=30.0)
    assert outcome.partial  # type: ignore[attr-defined]
    assert model.now <= 30.0
    # 1 instance met the target at 4 clients after 4 measurements (20 s); the 10 s left could not hold another
    # measurement and the repeats kept back for a comparison with it (2 more), so the search stopped there.
    assert len(model.calls) == 4
    # What was measured still counts: the best of it is recommended.
    best = max(outcome.results, key=lambda r: r.score(20.0))  # type: ignore[attr-defined]
    assert outcome.recommendation == best.config  # type: ignore[attr-defined]
    assert not outcome.recommendation.batching  # type: ignore[attr-defined]


def test_progress_reports_configs_done_and_time_left() -> None:
    model = Synthetic(cores=2)
    seen: list[tuple[int, int, float]] = []
    run(model, budget_s=600.0, progress=lambda done, planned, eta: seen.append((done, planned, eta)))
    assert [done for done, _, _ in seen] == list(range(1, len(seen) + 1))
    assert all(planned >= done and 0 <= eta <= 600 for done, planned, eta in seen)


def test_cancellation_stops_before_the_next_measurement() -> None:
    model = Synthetic(cores=4)
    outcome = run(model, cancelled=lambda: len(model.calls) >= 3)
    assert len(model.calls) == 3
    assert outcome.partial  # type: ignore[attr-defined]


def test_a_setting_that_cannot_be_measured_is_recorded_and_the_search_goes_on() -> None:
    model = Synthetic(cores=4, fail={2})
    outcome = run(model, cores=4)
    failed = [r for r in outcome.results if r.error]  # type: ignore[attr-defined]
    assert failed and {r.config.instances for r in failed} == {2}
    assert "did not start" in failed[0].error
    assert any(r.config.batching for r in outcome.results)  # type: ignore[attr-defined]
    assert outcome.recommendation is not None  # type: ignore[attr-defined]


def test_the_frontier_holds_only_points_nothing_beats() -> None:
    model = Synthetic(cores=2)
    outcome = run(model)
    front = outcome.frontier()  # type: ignore[attr-defined]
    assert front
    assert [p.p99_ms for p in front] == sorted(p.p99_ms for p in front)
    assert [p.throughput for p in front] == sorted(p.throughput for p in front)


def test_the_batching_ladder_goes_on_where_its_first_step_loses_to_batching_off() -> None:
    """Batch 8 loses to batching off, batch 16 and 32 win: the batch sizes are compared with each other."""
    table = {(1, False, 0): 500.0, (2, False, 0): 505.0, (1, True, 8): 400.0, (1, True, 16): 600.0,
             (1, True, 32): 700.0, (1, True, 64): 710.0}
    tried: list[Config] = []

    def measure(config: Config, concurrency: int) -> Measurement:
        tried.append(config)
        key = (config.instances, config.batching, config.max_batch_size)
        throughput = table.get(key, 100.0) * (1.2 if config.queue_delay_us == 500 else 1.0)
        return Measurement(concurrency=concurrency, throughput=throughput, p50_ms=5.0, p99_ms=10.0)

    outcome = search(measure, p99_target_ms=20.0, budget_s=600.0, cores=2, model_max_batch_size=64,
                     concurrency=(8, 8))
    assert outcome.recommendation == Config(1, True, 32, 500)
    assert Config(1, True, 64) in tried and Config(1, True, 128) not in tried
    assert Config(1, True, 32, 2000) in tried and Config(1, True, 32, 8000) not in tried
    assert Config(2, True, 32, 500) in tried  # the neighbouring instance count, with the best batching


def point(throughput: float, p99_ms: float = 10.0, concurrency: int = 8, errors: int = 0) -> Measurement:
    return Measurement(concurrency=concurrency, throughput=throughput, p50_ms=p99_ms / 2, p99_ms=p99_ms,
                       errors=errors, requests=int(throughput * 2))


def measured(config: Config, runs: list[float], *, current: bool = False) -> ConfigResult:
    """A setting measured once at 8 clients, then re-measured: `runs` in req/s, all within a 20 ms target."""
    return ConfigResult(config, points=[point(runs[0])], repeats=[point(tp) for tp in runs[1:]], current=current)


CURRENT = Config(1, True, 8, 0)  # what the README's CI step deploys: dynamic batching on
OFF = Config(1)


def test_two_settings_within_noise_keep_the_current_one_and_say_so() -> None:
    """Batching off measured 3% more by the medians, but each setting's runs spread by 5%: the current is kept."""
    current = measured(CURRENT, [1000.0, 960.0, 1010.0], current=True)
    off = measured(OFF, [1060.0, 1010.0, 1030.0])
    decision = decide([current, off], 20.0, CURRENT)
    assert decision.recommendation == CURRENT
    assert decision.within_noise and decision.kept_current
    assert (decision.apart_pct, decision.spread_pct) == (3.0, 5.0)
    assert "within noise (3.0% apart, spread 5.0%)" in decision.note
    assert "the current setting is kept" in decision.note
    # The figures compared are the medians of the runs, and the spread is each one's (max - min) / median.
    assert (current.score(20.0), off.score(20.0)) == (1000.0, 1030.0)
    assert round(off.spread(20.0) or 0, 4) == round(50 / 1030, 4)


def test_a_clearly_better_setting_is_recommended_and_says_by_how_much() -> None:
    current = measured(CURRENT, [1000.0, 960.0, 1010.0], current=True)
    off = measured(OFF, [1300.0, 1280.0, 1310.0])
    decision = decide([current, off], 20.0, CURRENT)
    assert decision.recommendation == OFF
    assert not decision.within_noise and not decision.kept_current
    assert decision.apart_pct == 30.0 and decision.spread_pct == 5.0
    assert "30.0% more than the current setting, beyond the run-to-run spread of 5.0%" in decision.note


def test_within_noise_of_the_best_the_setting_closest_to_the_current_one_is_chosen() -> None:
    """The current setting missed the target; of two within noise, the one that keeps batching on is chosen."""
    current = ConfigResult(CURRENT, points=[point(900.0, p99_ms=30.0)], current=True)
    off = measured(OFF, [1050.0, 1000.0, 1020.0])
    batch16 = measured(Config(1, True, 16, 0), [1000.0, 1040.0, 990.0])
    decision = decide([current, off, batch16], 20.0, CURRENT)
    assert decision.recommendation == Config(1, True, 16, 0)
    assert decision.within_noise and not decision.kept_current
    assert "within noise (2.0% apart, spread 5.0%)" in decision.note
    assert "closer to the current setting" in decision.note


def test_a_repeat_that_misses_the_target_counts_against_the_setting() -> None:
    """Fast once, then over the target twice: its median is 0, the steady current setting is recommended."""
    current = measured(CURRENT, [1000.0, 990.0, 1005.0], current=True)
    flaky = ConfigResult(OFF, points=[point(1500.0)], repeats=[point(1400.0, p99_ms=40.0), point(1450.0, p99_ms=45.0)])
    assert flaky.samples(20.0) == [1500.0, 0.0, 0.0]
    decision = decide([current, flaky], 20.0, CURRENT)
    assert decision.recommendation == CURRENT


def test_settings_measured_once_are_compared_as_measured_and_the_note_says_it_may_be_noise() -> None:
    current = ConfigResult(CURRENT, points=[point(1000.0)], current=True)
    off = ConfigResult(OFF, points=[point(1040.0)])
    decision = decide([current, off], 20.0, CURRENT)
    assert decision.recommendation == OFF
    assert "each measured once" in decision.note and "may be noise" in decision.note


def test_a_missed_setting_says_why() -> None:
    over = ConfigResult(OFF, points=[point(900.0, p99_ms=45.0, concurrency=32), point(700.0, p99_ms=30.5,
                                                                                       concurrency=16)])
    assert over.missed(20.0) == ("p99 ≤ 20 ms not met at any concurrency measured (32 clients: p99 45.0 ms; "
                                 "16 clients: p99 30.5 ms)")
    erring = ConfigResult(OFF, points=[point(900.0, concurrency=8, errors=3)])
    assert erring.missed(20.0) == ("p99 ≤ 20 ms not met at any concurrency measured (8 clients: 3 errors of 1803 "
                                   "requests)")
    cut = ConfigResult(OFF, points=[point(900.0, p99_ms=45.0, concurrency=32)],
                       cut="the budget ran out before fewer clients were measured")
    assert cut.missed(20.0) == ("p99 ≤ 20 ms not met at the concurrencies measured (32 clients: p99 45.0 ms); the "
                                "budget ran out before fewer clients were measured")
    dead = ConfigResult(OFF, error="its Triton did not start: out of memory")
    assert dead.missed(20.0) == "its Triton did not start: out of memory"
    assert measured(OFF, [1000.0]).missed(20.0) == ""
    row = over.to_json(20.0)
    assert row["meets_target"] is False and row["missed"] == over.missed(20.0)


def noisy_table(noise: list[float]) -> tuple[list[tuple[Config, int]], Callable[[Config, int], Measurement]]:
    """Batching off and batching on (batch 8) as fast as each other (1000 req/s), everything else slower; each
    measurement's throughput is multiplied by the next factor of `noise` (then 1.0): the first of batching off +8%."""
    calls: list[tuple[Config, int]] = []
    factors = iter(noise)

    def measure(config: Config, concurrency: int) -> Measurement:
        calls.append((config, concurrency))
        true = 1000.0 if config in (OFF, CURRENT) else 800.0
        return Measurement(concurrency=concurrency, throughput=true * next(factors, 1.0), p50_ms=5.0, p99_ms=10.0,
                           seconds=1.0)

    return calls, measure


def test_close_candidates_are_measured_again_interleaved_and_the_current_setting_is_kept() -> None:
    """The newcomer's tune: batching off measured 8% more than the current batching once, by noise. The two are
    measured twice more each, interleaved, and the current setting is kept; before, batching off was recommended."""
    # Explored: the current, batching off (+8%), 2 inst, batch 16, delay 500 µs, 2 inst batch 8; then the repeats.
    calls, measure = noisy_table([1.0, 1.08, 1.0, 1.0, 1.0, 1.0, 0.98, 1.01, 1.02, 0.97])
    outcome = search(measure, p99_target_ms=20.0, budget_s=600.0, cores=2, model_max_batch_size=16,
                     concurrency=(8, 8), current=CURRENT)
    explored = len(outcome.results)
    assert explored == 6 and len(calls) == explored + 2 * REPEATS
    # By one measurement each, batching off was the best (what an Apply switched to before).
    assert max(outcome.results, key=lambda r: r.points[0].throughput).config == OFF
    # The repeats come last: the best by one measurement (batching off), the current, the best, the current.
    assert [c for c, _ in calls[explored:]] == [OFF, CURRENT, OFF, CURRENT]
    assert all(level == 8 for _, level in calls[explored:])
    assert outcome.recommendation == CURRENT
    assert outcome.decision.within_noise and outcome.decision.kept_current
    # Batching off: 1080, 980, 1020 (median 1020, spread 9.8%); the current: 1000, 1010, 970 (median 1000).
    assert "measured 2.0% more than the current setting, within noise (2.0% apart, spread 9.8%)" in \
        outcome.decision.note
    [current] = [r for r in outcome.results if r.current]
    assert current.config == CURRENT and len(current.samples(20.0)) == 1 + REPEATS


def test_the_repeats_come_out_of_the_budget() -> None:
    """A budget of 8 one-second measurements: the exploration stops after 4 (partial), keeping back the 4 repeats
    of the best two, which then fit."""
    clock = [0.0]
    calls, inner = noisy_table([1.0, 1.08])

    def measure(config: Config, concurrency: int) -> Measurement:
        clock[0] += 1.0
        return inner(config, concurrency)

    outcome = search(measure, p99_target_ms=20.0, budget_s=8.0, cores=16, model_max_batch_size=64,
                     concurrency=(8, 8), current=CURRENT, clock=lambda: clock[0])
    assert clock[0] <= 8.0
    assert outcome.partial and len(outcome.results) == 4 and len(calls) == 8
    finalists = [r for r in outcome.results if r.repeats]
    assert len(finalists) >= 2 and all(len(r.repeats) == REPEATS for r in finalists[:2])
    assert outcome.recommendation == CURRENT


def test_a_setting_measured_once_does_not_beat_the_medians_of_settings_measured_three_times() -> None:
    """The repeats pull the finalists' medians down from their lucky first runs; a setting left unrepeated (it was
    not among the best two) must not win on its one run."""
    current = measured(CURRENT, [1000.0, 960.0, 1040.0], current=True)
    off = measured(OFF, [1060.0, 960.0, 1040.0])
    once = ConfigResult(Config(2), points=[point(1055.0)])
    decision = decide([current, off, once], 20.0, CURRENT)
    assert decision.recommendation == CURRENT
    assert "1 inst, batching off measured 4.0% more than the current setting" in decision.note
