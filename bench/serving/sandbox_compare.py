"""Serving runs with and without the sandbox, side by side (issue 11: the sandbox must not slow serving).

    SANDBOX_ENABLED=false .venv/bin/python -m bench.serving.run --quick --workloads 1,2 \
        --servers d-direct,e-gateway,e-direct --output /tmp/off-1.json --no-plots     # then the same without
    .venv/bin/python bench/serving/sandbox_compare.py /tmp/off-1.json /tmp/on-1.json ...  #   SANDBOX_ENABLED, in turns

Each results file of run.py records whether every deployment's Triton ran sandboxed; this sorts the runs into
"off" and "on" by that (a file whose deployments were mixed is refused), and prints a Markdown table per workload,
endpoint and concurrency: the median throughput (min–max over the files), p99, and Triton's CPU time per request,
with the ratios on/off, then the geometric means of the ratios. Standard library only.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

Key = tuple[str, str, int]


def sandbox_mode(document: dict[str, Any]) -> str:
    """"on" when every deployment of every workload ran sandboxed, "off" when none did."""
    flags = [flag for workload in document["workloads"] for flag in workload.get("sandboxed", {}).values()]
    if flags and all(flag is True for flag in flags):
        return "on"
    if flags and all(flag is False for flag in flags):
        return "off"
    raise ValueError(f"not one sandbox setting for every deployment: {flags or 'none recorded'}")


def collect(documents: list[dict[str, Any]]) -> dict[tuple[Key, str], list[dict[str, Any]]]:
    runs: dict[tuple[Key, str], list[dict[str, Any]]] = {}
    for document in documents:
        mode = sandbox_mode(document)
        for workload in document["workloads"]:
            for run in workload["runs"]:
                runs.setdefault(((workload["workload"], run["server"], run["concurrency"]), mode), []).append(run)
    return runs


def _median(runs: list[dict[str, Any]], field: str) -> float:
    return statistics.median(r["cpu_ms_per_request"]["triton"] if field == "triton_cpu" else r[field] for r in runs)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def table(documents: list[dict[str, Any]]) -> str:
    runs = collect(documents)
    keys = sorted({key for key, _ in runs}, key=lambda k: (k[0], k[1], k[2]))
    lines = ["| workload | endpoint | clients | req/s off | req/s on | on/off | p99 ms off | p99 ms on | "
             "Triton CPU ms/req off | on | on/off |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    throughput, cpu_loaded = [], []
    for key in keys:
        off, on = runs.get((key, "off")), runs.get((key, "on"))
        if not off or not on:
            continue
        rate = {m: _median(r, "throughput") for m, r in (("off", off), ("on", on))}
        cpu = {m: _median(r, "triton_cpu") for m, r in (("off", off), ("on", on))}
        spread = {m: f"{min(x['throughput'] for x in r):.0f}–{max(x['throughput'] for x in r):.0f}"
                  for m, r in (("off", off), ("on", on))}
        throughput.append(rate["on"] / rate["off"])
        if key[2] > 1:  # with one client the server idles between requests, which its CPU per request counts
            cpu_loaded.append(cpu["on"] / cpu["off"])
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {rate['off']:.0f} ({spread['off']}) | "
                     f"{rate['on']:.0f} ({spread['on']}) | {rate['on'] / rate['off']:.2f} | "
                     f"{_median(off, 'p99_ms'):.1f} | {_median(on, 'p99_ms'):.1f} | {cpu['off']:.3f} | "
                     f"{cpu['on']:.3f} | {cpu['on'] / cpu['off']:.2f} |")
    if throughput:
        lines += ["", f"Geometric mean of on/off: throughput {_geomean(throughput):.2f} over {len(throughput)} cells "
                  f"({min(throughput):.2f} to {max(throughput):.2f})"
                  + (f"; Triton CPU per request with more than one client {_geomean(cpu_loaded):.2f} over "
                     f"{len(cpu_loaded)} cells ({min(cpu_loaded):.2f} to {max(cpu_loaded):.2f})" if cpu_loaded else "")
                  + "."]
    return "\n".join(lines)


def main() -> int:
    documents = [json.loads(Path(name).read_text()) for name in sys.argv[1:]]
    if not documents:
        print(__doc__)
        return 2
    for name, document in zip(sys.argv[1:], documents, strict=True):
        print(f"{name}: sandbox {sandbox_mode(document)}, load average {document['machine']['loadavg_before']} "
              f"-> {document['machine'].get('loadavg_after')}, Modelport {document['versions']['git']}")
    print()
    print(table(documents))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
