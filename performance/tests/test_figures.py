"""The window's figures from crafted statistics snapshots: means per request, batch sizes, restarts (never a
negative figure), and hostile answers a team's Triton could give."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from performance.figures import (
    DURATIONS,
    MAX_MODELS,
    ModelCounters,
    Snapshot,
    gateway_own_ms,
    parse_statistics,
    window_counters,
    window_counters_stepwise,
    window_figures,
)
from performance.tests.statistics import triton_row

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def snap(minutes: float, *rows: dict[str, Any], prefix: str = "") -> Snapshot:
    return Snapshot(T0 + timedelta(minutes=minutes), parse_statistics({"model_stats": list(rows)}, prefix))


def test_two_snapshots_give_the_means_per_request_and_the_batches_formed_between_them() -> None:
    before = snap(0, triton_row("digits", 100, queue_ns=100 * 4_000_000, infer_ns=100 * 1_000_000,
                                batches={1: 100}))
    after = snap(1, triton_row("digits", 300, queue_ns=100 * 4_000_000 + 200 * 2_000_000,
                               infer_ns=100 * 1_000_000 + 200 * 3_000_000, fail=2, batches={1: 120, 8: 10}))

    [figures] = window_figures([before, after], ["digits"])

    assert figures.requests == 200 and figures.errors == 2
    assert figures.queue_ms == pytest.approx(2.0)
    assert figures.compute_infer_ms == pytest.approx(3.0)
    assert figures.compute_input_ms == pytest.approx(0.001) and figures.compute_output_ms == pytest.approx(0.002)
    assert figures.batch_sizes == {1: 20, 8: 10}
    assert figures.mean_batch_size == pytest.approx((20 + 80) / 30)
    assert figures.queue_share == pytest.approx(2.0 / (2.0 + 0.001 + 3.0 + 0.002))
    assert figures.executions == 30 and not figures.restarted


def test_a_restart_between_snapshots_counts_what_the_new_server_counted_never_a_negative_figure() -> None:
    first = snap(0, triton_row("digits", 1_000, queue_ns=1_000 * 5_000_000, infer_ns=1_000 * 1_000_000))
    second = snap(1, triton_row("digits", 1_500, queue_ns=1_500 * 5_000_000, infer_ns=1_500 * 1_000_000))
    restarted = snap(2, triton_row("digits", 40, queue_ns=40 * 1_000_000, infer_ns=40 * 1_000_000))
    third = snap(3, triton_row("digits", 100, queue_ns=100 * 1_000_000, infer_ns=100 * 1_000_000))

    [figures] = window_figures([third, first, restarted, second], ["digits"])  # any order: sorted by time

    assert figures.requests == 500 + 40 + 60
    assert figures.restarted
    assert figures.queue_ms is not None and figures.queue_ms > 0
    assert all(count > 0 for count in figures.batch_sizes.values())


def test_one_counter_alone_going_down_is_a_restart_too() -> None:
    before = snap(0, triton_row("digits", 10, batches={4: 5}))
    after = snap(1, triton_row("digits", 12, batches={1: 12}))  # the size-4 executions vanished

    [figures] = window_figures([before, after], ["digits"])

    assert figures.restarted and figures.requests == 12 and figures.batch_sizes == {1: 12}


def test_a_model_loaded_between_snapshots_counts_from_zero_and_one_never_seen_has_zeros() -> None:
    before = snap(0, triton_row("digits", 10))
    after = snap(1, triton_row("digits", 10), triton_row("postprocess", 7))

    digits, postprocess, absent = window_figures([before, after], ["digits", "postprocess", "absent"])

    assert digits.requests == 0 and digits.queue_ms is None and digits.queue_share is None
    assert postprocess.requests == 7
    assert absent.requests == 0 and absent.batch_sizes == {} and absent.mean_batch_size is None


@pytest.mark.parametrize("count", [0, 1])
def test_fewer_than_two_snapshots_know_nothing_yet(count: int) -> None:
    taken = [snap(0, triton_row("digits", 10))][:count]

    [figures] = window_figures(taken, ["digits"])

    assert figures.requests == 0 and figures.request_ms is None


def test_a_pool_answer_keeps_the_revisions_own_models_by_prefix() -> None:
    rows = [triton_row("d7-r2-digits", 5), triton_row("d9-r1-digits", 50), triton_row("d7-r20-digits", 9)]

    counters = parse_statistics({"model_stats": rows}, "d7-r2-")

    assert list(counters) == ["digits"] and counters["digits"].duration("success").count == 5


def test_versions_of_one_model_are_added_up() -> None:
    counters = parse_statistics({"model_stats": [triton_row("digits", 5), triton_row("digits", 7)]})

    assert counters["digits"].duration("success").count == 12 and counters["digits"].batches == {1: 12}


@pytest.mark.parametrize("answer", [
    None, [], "stats", {"model_stats": None}, {"model_stats": {"name": "x"}}, {"model_stats": [1, "x", None]},
    {"model_stats": [{"name": 5}]}, {"model_stats": [{"name": ""}]},
])
def test_answers_that_are_not_statistics_count_nothing(answer: Any) -> None:
    assert parse_statistics(answer) == {}


@pytest.mark.parametrize("value", [-5, "-5", "12abc", "١٢", 1e300, float("nan"), True, None, [3], {"n": 1},
                                   "9" * 40, 2**80])
def test_hostile_counters_read_as_zero(value: Any) -> None:
    row = triton_row("digits", 3)
    row["inference_stats"]["queue"] = {"count": value, "ns": value}
    row["execution_count"] = value
    row["batch_stats"] = [{"batch_size": value, "compute_infer": {"count": value, "ns": 0}}]

    counters = parse_statistics({"model_stats": [row]})["digits"]

    assert counters.duration("queue").count == 0 and counters.duration("queue").ns == 0
    assert counters.execution_count == 0 and counters.batches == {}


def test_counters_written_as_strings_of_digits_are_read() -> None:
    row = triton_row("digits", 3)
    row["inference_stats"]["success"] = {"count": "3", "ns": "9000000"}

    assert parse_statistics({"model_stats": [row]})["digits"].duration("success").ns == 9_000_000


def test_an_answer_naming_thousands_of_models_is_cut_to_the_bound() -> None:
    rows = [triton_row(f"m{i}", 1) for i in range(MAX_MODELS + 50)]

    assert len(parse_statistics({"model_stats": rows})) == MAX_MODELS


def test_counters_survive_their_stored_form_and_a_mangled_row_reads_as_nothing() -> None:
    counters = parse_statistics({"model_stats": [triton_row("digits", 4, queue_ns=8, batches={2: 2})]})["digits"]

    assert ModelCounters.from_json(counters.to_json()) == counters
    for mangled in (None, [], {"d": {"queue": [1]}, "b": {"x": 1, "-2": 3}, "e": -1}):
        read = ModelCounters.from_json(mangled)
        assert read.duration("queue").count == 0 and read.batches == {} and read.execution_count == 0


def test_the_gateways_own_time_is_its_latency_less_tritons_and_never_negative() -> None:
    assert gateway_own_ms(latency_sum_ms=500.0, requests=100, triton_request_ns=300_000_000) == pytest.approx(2.0)
    assert gateway_own_ms(latency_sum_ms=100.0, requests=100, triton_request_ns=900_000_000) == 0.0
    assert gateway_own_ms(latency_sum_ms=100.0, requests=0, triton_request_ns=0) is None


def _normal(counted: dict[str, tuple[ModelCounters, bool]]) -> dict[str, Any]:
    return {name: ({n: (c.duration(n).count, c.duration(n).ns) for n in DURATIONS},
                   {size: count for size, count in c.batches.items() if count}, c.execution_count, c.inference_count,
                   reset) for name, (c, reset) in counted.items()}


# A model's life over a window: each step serves some requests, restarts its server (counting from zero), or is
# absent from the snapshot (unloaded, as a pool's idle model is).
_STEP = st.one_of(st.tuples(st.just("serve"), st.integers(0, 50), st.integers(1, 4)),
                  st.tuples(st.just("restart"), st.integers(0, 50), st.integers(1, 4)),
                  st.tuples(st.just("absent"), st.just(0), st.just(1)))


@settings(max_examples=150, deadline=None)
@given(lives=st.lists(st.lists(_STEP, min_size=1, max_size=12), min_size=1, max_size=3))
def test_the_counts_by_stretches_are_the_counts_step_by_step(lives: list[list[tuple[str, int, int]]]) -> None:
    steps = max(len(life) for life in lives)
    totals: list[dict[str, int]] = [{"n": 0, "batched": 0} for _ in lives]
    taken = []
    for index in range(steps):
        rows = []
        for model, life in enumerate(lives):
            kind, served, size = life[index] if index < len(life) else ("serve", 0, 1)
            if kind == "absent":
                totals[model] = {"n": 0, "batched": 0}  # unloaded: loaded again, it counts from zero
                continue
            if kind == "restart":
                totals[model] = {"n": 0, "batched": 0}
            totals[model]["n"] += served * size
            totals[model]["batched"] += served
            n, batched = totals[model]["n"], totals[model]["batched"]
            rows.append(triton_row(f"m{model}", n, queue_ns=7 * n, infer_ns=11 * n, batches={size: batched}))
        taken.append(snap(index, *rows))

    assert _normal(window_counters(taken)) == _normal(window_counters_stepwise(taken))
