"""The search prunes (fewer measurements than the grid), finds a setting close to the grid's best within the target,
honours its time budget and cancellation, and goes on past a setting that cannot be measured. Synthetic measure
(tuning/tests/synthetic.py): milliseconds per test."""

from __future__ import annotations

from tuning.search import (
    batch_ladder,
    concurrency_ladder,
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
    assert len(model.calls) == 6
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
    from tuning.search import Config, Measurement

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
