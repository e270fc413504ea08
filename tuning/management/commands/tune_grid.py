"""Measure every setting a tune could try (the full grid) with the tune's own measurement: for benchmarks of the
search (bench/tune_grid.py), not for users. Prints one JSON object."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from tuning import runner, search
from tuning.measure import run_loadgen
from tuning.models import TuneRun


class Command(BaseCommand):
    help = "Measure the full grid of settings for a tune's deployment (benchmarks only)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tune", type=int, help="the id of a tune: its target, concurrencies and request")

    def handle(self, *args: Any, **options: Any) -> None:
        tune = TuneRun.objects.select_related("deployment").get(pk=options["tune"])
        spec, entry, model_max = runner.tune_target(tune)
        servers = runner.Servers(tune, spec, entry)
        measure = runner.measurer(tune, servers, run_loadgen)
        target = tune.p99_target_ms
        configs = []
        for n in search.instance_ladder(os.cpu_count() or 1):
            configs.append(search.Config(n))
            configs += [search.Config(n, True, b, d) for b in search.batch_ladder(model_max)
                        for d in (0, *search.DELAY_LADDER_US)]
        started = time.monotonic()
        results = []
        try:
            for config in configs:
                result = search.ConfigResult(config)
                for level in search.concurrency_ladder(tune.concurrency_min, tune.concurrency_max):
                    try:
                        point = measure(config, level)
                    except search.MeasureFailed as exc:
                        result.error = str(exc)
                        break
                    result.points.append(point)
                    if not point.meets(target):
                        break  # more clients only add latency
                results.append(result.to_json(target))
                self.stderr.write(f"{config.label()}: {results[-1]['throughput']:.1f} req/s")
        finally:
            servers.close()
        self.stdout.write(json.dumps({"seconds": round(time.monotonic() - started, 1), "results": results}))
