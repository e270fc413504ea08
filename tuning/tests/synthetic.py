"""A synthetic model of a served model's throughput and latency, for fast tests of the search: a machine of `cores`
cores, a model whose batch of b takes `base_ms + per_item_ms * b` on one core, closed-loop clients."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuning.search import Config, MeasureFailed, Measurement, batch_ladder, concurrency_ladder, instance_ladder


@dataclass
class Synthetic:
    cores: int = 2
    base_ms: float = 2.0
    per_item_ms: float = 0.25
    seconds_per_measurement: float = 5.0
    fail: set[int] = field(default_factory=set)  # instance counts whose server "does not start"
    calls: list[tuple[Config, int]] = field(default_factory=list)
    now: float = 0.0

    def clock(self) -> float:
        return self.now

    def figures(self, config: Config, concurrency: int) -> Measurement:
        batch = min(config.max_batch_size, concurrency) if config.batching else 1
        # Instances beyond the cores only contend; a little worse than none for it.
        usable = min(config.instances, self.cores) * (0.95 if config.instances > self.cores else 1.0)
        service_ms = self.base_ms + self.per_item_ms * batch
        capacity = usable * batch / service_ms * 1000
        delay_ms = config.queue_delay_us / 1000 if config.batching and concurrency < config.max_batch_size else 0.0
        latency_ms = max(service_ms, 1000 * concurrency / capacity) + delay_ms
        throughput = 1000 * concurrency / latency_ms
        return Measurement(concurrency=concurrency, throughput=round(throughput, 2), p50_ms=latency_ms,
                           p99_ms=latency_ms * 1.5, seconds=self.seconds_per_measurement)

    def __call__(self, config: Config, concurrency: int) -> Measurement:
        self.calls.append((config, concurrency))
        self.now += self.seconds_per_measurement
        if config.instances in self.fail:
            raise MeasureFailed("its Triton did not start")
        return self.figures(config, concurrency)

    def grid_best(self, p99_target_ms: float, model_max_batch_size: int, concurrency: tuple[int, int]) -> float:
        """The best throughput within the target over every setting and concurrency the search could try."""
        best = 0.0
        for n in instance_ladder(self.cores):
            configs = [Config(n)] + [Config(n, True, b, d) for b in batch_ladder(model_max_batch_size)
                                     for d in (0, 500, 2000, 8000)]
            for config in configs:
                for c in concurrency_ladder(*concurrency):
                    point = self.figures(config, c)
                    if point.meets(p99_target_ms):
                        best = max(best, point.throughput)
        return best
