"""The advice's thresholds: silent below them, and the words that fit each way the queue can dominate."""

from __future__ import annotations

import math

from performance.advice import AT_PREFERRED, FULL_BATCH, MIN_REQUESTS, QUEUE_DOMINATES, Settings, advice
from performance.figures import ModelFigures


def figures(queue_ms: float, compute_ms: float = 1.0, requests: int = 1_000,
            batches: dict[int, int] | None = None) -> ModelFigures:
    return ModelFigures(model="digits", requests=requests, errors=0, executions=sum((batches or {1: 1}).values()),
                        inferences=requests, request_ms=queue_ms + compute_ms, queue_ms=queue_ms,
                        compute_input_ms=0.0, compute_infer_ms=compute_ms, compute_output_ms=0.0,
                        batch_sizes=batches or {1: requests}, restarted=False)


BATCHING = Settings(max_batch_size=32, dynamic_batching=True, max_queue_delay_us=0, instances=1)


def test_nothing_to_say_when_the_queue_does_not_dominate() -> None:
    just_under = QUEUE_DOMINATES - 0.01
    assert advice(figures(queue_ms=just_under, compute_ms=1 - just_under), Settings()) == []


def test_nothing_to_say_with_too_few_requests() -> None:
    assert advice(figures(queue_ms=9.0, requests=MIN_REQUESTS - 1), Settings()) == []
    assert advice(figures(queue_ms=9.0, requests=MIN_REQUESTS), Settings()) != []


def test_nothing_to_say_without_figures() -> None:
    empty = ModelFigures("digits", 0, 0, 0, 0, None, None, None, None, None, {}, False)
    assert advice(empty, Settings()) == []


def test_a_model_that_does_not_batch_is_told_to_add_an_instance_or_allow_batching() -> None:
    [words] = advice(figures(queue_ms=QUEUE_DOMINATES + 0.01, compute_ms=1 - QUEUE_DOMINATES - 0.01),
                     Settings(instances=2), deployment="digits-prod")

    assert "does not batch" in words and "instances 2 -> 3" in words and "allow batching" in words
    assert "modelport tune digits-prod" in words


def test_a_wait_about_the_configured_delay_with_small_batches_is_told_to_lower_the_delay() -> None:
    settings = Settings(max_batch_size=32, dynamic_batching=True, max_queue_delay_us=5_000)

    [words] = advice(figures(queue_ms=4.0, compute_ms=0.5, batches={1: 900, 2: 50}), settings)

    assert "lower the delay" in words and "max_queue_delay_microseconds 5000" in words and "1250" in words


def test_a_wait_well_past_the_delay_is_not_blamed_on_it() -> None:
    settings = Settings(max_batch_size=32, dynamic_batching=True, max_queue_delay_us=1_000, instances=1)

    [words] = advice(figures(queue_ms=20.0, compute_ms=5.0, batches={32: 100}), settings)

    assert "lower the delay" not in words and "full batches" in words and "instances 1 -> 2" in words


def test_full_batches_ask_for_an_instance_more() -> None:
    full = math.ceil(FULL_BATCH * 32)
    [words] = advice(figures(queue_ms=5.0, batches={full: 100}), BATCHING)
    assert "full batches" in words and "add an instance" in words

    [below] = advice(figures(queue_ms=5.0, batches={full - 1: 100}), BATCHING)
    assert "full batches" not in below and "larger preferred batch size" in below


def test_batches_stuck_at_the_largest_preferred_size_ask_for_a_larger_one() -> None:
    settings = Settings(max_batch_size=64, dynamic_batching=True, preferred_batch_sizes=(4, 8))
    at = int(AT_PREFERRED * 100)

    [words] = advice(figures(queue_ms=5.0, batches={8: at, 3: 100 - at}), settings)
    assert "largest preferred size (8)" in words and "e.g. 16" in words

    [fewer] = advice(figures(queue_ms=5.0, batches={8: at - 5, 3: 100 - at + 5}), settings)
    assert "largest preferred size" not in fewer
