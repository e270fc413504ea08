"""What to change when a model's requests wait in Triton's queue more than they compute: plain words from the
window's figures and the model's settings. A pure function, so that its thresholds are unit-tested.

The rules, in order (the first that fits speaks; a tune is always offered, since it measures instead of guessing):
- too few requests in the window, or the queue not dominating (less than QUEUE_DOMINATES of the time in Triton):
  nothing to say;
- the mean wait is about the configured max_queue_delay_microseconds while batches stay small: the queue is the
  delay Triton was told to wait for companions that do not come at this load: lower it;
- the model does not batch (max_batch_size 0 or no dynamic batching): each request waits for an instance alone:
  add an instance, or allow batching;
- the batches Triton forms are the largest preferred size, below max_batch_size: a larger preferred size lets it
  take more of the queue at once;
- the batches are (nearly) full: the instances are busy: add an instance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from performance.figures import ModelFigures

QUEUE_DOMINATES = 0.5  # of the time in Triton (queue + compute) spent in the queue
MIN_REQUESTS = 20  # fewer in the window say nothing reliable
FULL_BATCH = 0.8  # a mean batch at least this part of max_batch_size is full
DELAY_MATCH = 0.7  # a mean wait at least this part of the configured delay is the delay
SMALL_BATCH = 0.5  # a mean batch under this part of max_batch_size is small
AT_PREFERRED = 0.6  # the part of the executions at the largest preferred size that says Triton stops there


@dataclass(frozen=True)
class Settings:
    """The model's settings in the revision the figures are of."""

    max_batch_size: int = 0
    dynamic_batching: bool = False
    max_queue_delay_us: int = 0
    preferred_batch_sizes: Sequence[int] = ()
    instances: int = 1


def advice(figures: ModelFigures, settings: Settings, deployment: str = "NAME") -> list[str]:
    """Sentences saying what to change (empty: nothing to change, or too little to tell)."""
    share = figures.queue_share
    if figures.requests < MIN_REQUESTS or share is None or share < QUEUE_DOMINATES or figures.queue_ms is None:
        return []
    wait = f"Requests to {figures.model} wait in Triton's queue {share:.0%} of their time ({figures.queue_ms:.2f} ms)"
    tune = f"or run a tune (modelport tune {deployment} --p99-ms TARGET) to measure the settings instead of guessing."
    mean_batch = figures.mean_batch_size or 1.0
    batches = settings.max_batch_size > 0 and settings.dynamic_batching
    delay_ms = settings.max_queue_delay_us / 1000.0
    if (batches and delay_ms > 0 and figures.queue_ms >= DELAY_MATCH * delay_ms
            and mean_batch < SMALL_BATCH * settings.max_batch_size):
        return [f"{wait}, about the queue delay it is told to wait for a batch "
                f"(max_queue_delay_microseconds {settings.max_queue_delay_us}) while its batches stay small "
                f"(mean {mean_batch:.1f} of {settings.max_batch_size}): lower the delay, "
                f"e.g. to {max(100, settings.max_queue_delay_us // 4)}, {tune}"]
    if not batches:
        return [f"{wait} and it does not batch, so each request waits for an instance alone: add an instance "
                f"(instances {settings.instances} -> {settings.instances + 1}), or allow batching (a max_batch_size "
                f"and dynamic batching) if the model takes a batch dimension, {tune}"]
    preferred = max(settings.preferred_batch_sizes, default=0)
    executions = sum(figures.batch_sizes.values())
    at_preferred = figures.batch_sizes.get(preferred, 0) / executions if executions else 0.0
    if 0 < preferred < settings.max_batch_size and at_preferred >= AT_PREFERRED:
        larger = min(settings.max_batch_size, preferred * 2)
        return [f"{wait} and Triton sends most batches at the largest preferred size ({preferred}) while up to "
                f"{settings.max_batch_size} are allowed: a larger preferred batch size (e.g. {larger}) lets one "
                f"execution take more of the queue; {tune}"]
    if mean_batch >= FULL_BATCH * settings.max_batch_size:
        return [f"{wait} with full batches (mean {mean_batch:.1f} of {settings.max_batch_size}): its instances are "
                f"busy, add an instance (instances {settings.instances} -> {settings.instances + 1}), {tune}"]
    return [f"{wait} with batches of {mean_batch:.1f} on average (up to {settings.max_batch_size}): add an instance "
            f"(instances {settings.instances} -> {settings.instances + 1}) or a larger preferred batch size, {tune}"]
