"""One measurement: the project's closed-loop load generator (tuning/loadgen.py) against a Triton's KServe v2 infer
endpoint for a few seconds at a concurrency, in a subprocess of its own (it must not share this worker's interpreter,
and its CPU time is counted separately: os.wait4's rusage).

Why loadgen and not Triton's perf_analyzer: the PyPI `perf-analyzer` needs glibc 2.38 and does not run on this
machine; the binary in the tritonclient wheel runs only with libraries from the runtime env's private directory made
findable by hand. loadgen runs wherever the portal runs. Its own CPU cost per request is measured by
bench/tune_grid.py and reported in docs/benchmarks.md ("Tuning").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuning.search import MeasureFailed, Measurement

LOADGEN = Path(__file__).resolve().parent / "loadgen.py"


def run_loadgen(url: str, body: bytes, concurrency: int, duration: float, warmup: float) -> Measurement:
    """Closed-loop load on `url` (POST `body`) by `concurrency` clients for `duration` s after `warmup` s."""
    with tempfile.NamedTemporaryFile(prefix="tune-body-", suffix=".json") as file:
        file.write(body)
        file.flush()
        argv = [sys.executable, str(LOADGEN), "--url", url, "--body", file.name, "--header",
                "Content-Type: application/json", "--concurrency", str(concurrency), "--duration", str(duration),
                "--warmup", str(warmup)]
        started = time.monotonic()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            process = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, close_fds=True)
            deadline = started + warmup + duration + 60
            while True:
                pid, status, usage = os.wait4(process.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:
                    process.kill()
                    _, status, usage = os.wait4(process.pid, 0)
                    break
                time.sleep(0.05)
            process.returncode = os.waitstatus_to_exitcode(status)  # already reaped: keep Popen from waiting again
            out.seek(0)
            err.seek(0)
            output, errors = out.read(), err.read()
    seconds = time.monotonic() - started
    if process.returncode != 0:
        raise MeasureFailed(f"the load generator failed (exit {process.returncode}): "
                            f"{errors.decode(errors='replace').strip()[-300:]}")
    data: dict[str, Any] = json.loads(output)
    return Measurement(concurrency=concurrency, throughput=float(data["throughput"]), p50_ms=data["p50_ms"],
                       p99_ms=data["p99_ms"], errors=int(data["errors"]), seconds=round(seconds, 3),
                       loadgen_cpu_s=round(usage.ru_utime + usage.ru_stime, 3), requests=int(data["requests"]))
