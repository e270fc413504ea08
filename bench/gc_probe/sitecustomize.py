"""The benchmarks' probe of a process's garbage collections (bench/tracing.py): on PYTHONPATH, Python imports it at
start-up. It adds a gc callback that sums each generation's collections and their CPU time (the collecting thread's),
and keeps the longest; SIGUSR2 writes the sums as JSON to $MODELPORT_GC_PROBE_DIR/<pid>.json (and starts the
longest over). Never part of the
portal: only a benchmark's own processes run with it."""

from __future__ import annotations

import gc
import json
import os
import signal
import time
from typing import Any

_totals: dict[str, list[float]] = {"count": [0, 0, 0], "seconds": [0.0, 0.0, 0.0], "longest": [0.0, 0.0, 0.0]}
_started = [0.0]


def _callback(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[0] = time.thread_time()
        return
    generation = info["generation"]
    spent = time.thread_time() - _started[0]
    _totals["count"][generation] += 1
    _totals["seconds"][generation] += spent
    _totals["longest"][generation] = max(_totals["longest"][generation], spent)


def _write(*_: Any) -> None:
    path = os.path.join(os.environ["MODELPORT_GC_PROBE_DIR"], f"{os.getpid()}.json")
    with open(path + ".part", "w") as out:
        json.dump(_totals, out)
    os.replace(path + ".part", path)
    _totals["longest"] = [0.0, 0.0, 0.0]


if os.environ.get("MODELPORT_GC_PROBE_DIR"):
    gc.callbacks.append(_callback)
    signal.signal(signal.SIGUSR2, _write)
