"""Does a tune find what a full grid finds? On a throwaway Modelport (bench/stack.py): push the CNN sample, deploy
it (stopped at once, so that its own Triton does not compete), run a tune through the API as a user would, then
measure every setting the tune could have tried with the same measurement (`manage.py tune_grid`), and compare the
recommendation with the grid's best within the target. Also reports the load generator's own CPU per request.

    .venv/bin/python bench/tune_grid.py [--p99-ms 100] [--budget 120] [--concurrency 2 16] [--write-docs]

Writes bench/results/tune_grid.json; with --write-docs, replaces the "Tuning" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

import django  # noqa: E402

django.setup()

from bench.stack import running_stack  # noqa: E402
from models_registry.samples import make_resnet_onnx  # noqa: E402
from tuning.search import REPEATS  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "tune_grid.json"
DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- tune_grid: begin -->", "<!-- tune_grid: end -->"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p99-ms", type=float, default=100.0)
    parser.add_argument("--budget", type=int, default=120)
    parser.add_argument("--concurrency", type=int, nargs=2, default=(2, 16))
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    with running_stack() as stack, tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resnet.onnx"
        make_resnet_onnx(path)
        stack.push("resnet", path)
        stack.api("POST", "/api/v1/deployments/", json={"name": "cnn", "models": [{"model": "resnet"}]})
        stack.api("POST", "/api/v1/deployments/cnn/stop")
        time.sleep(5)
        started = time.monotonic()
        tune = stack.api("POST", "/api/v1/deployments/cnn/tune", json={
            "p99_ms": args.p99_ms, "budget_seconds": args.budget, "concurrency_min": args.concurrency[0],
            "concurrency_max": args.concurrency[1]}).json()
        while tune["status"] in ("queued", "running"):
            time.sleep(2)
            tune = stack.api("GET", f"/api/v1/deployments/cnn/tunes/{tune['id']}/").json()
        tune_seconds = time.monotonic() - started
        grid = json.loads(stack.manage("tune_grid", str(tune["id"])).strip().splitlines()[-1])
    report = summarise(args, tune, tune_seconds, grid)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"report": report, "tune": tune, "grid": grid}, indent=1))
    text = markdown(report)
    print(text)
    if args.write_docs:
        docs = DOCS.read_text()
        if BEGIN in docs:
            docs = docs[:docs.index(BEGIN)] + text + docs[docs.index(END) + len(END):]
        else:
            docs = docs.rstrip() + "\n\n" + text + "\n"
        DOCS.write_text(docs)
    return 0


def summarise(args: argparse.Namespace, tune: dict[str, Any], tune_seconds: float,
              grid: dict[str, Any]) -> dict[str, Any]:
    meeting = [r for r in grid["results"] if r["meets_target"]]
    best = max(meeting, key=lambda r: r["throughput"]) if meeting else None
    recommended = tune["recommendation"]
    same = next((r for r in grid["results"] if recommended and r["settings"] == recommended["settings"]), None)
    points = [p for r in grid["results"] for p in r["points"]]
    cpu = sum(p["loadgen_cpu_s"] for p in points)
    requests = sum(p["requests"] for p in points)
    return {
        "machine": tune["machine"], "python": platform.python_version(), "p99_ms": args.p99_ms,
        "budget_s": args.budget, "concurrency": list(args.concurrency),
        "tune_seconds": round(tune_seconds, 1), "tune_status": tune["status"], "tune_partial": tune["partial"],
        "tune_configs": len(tune["results"]),
        "tune_measurements": sum(len(r["points"]) + len(r.get("repeats", [])) for r in tune["results"]),
        "recommended": recommended,
        "grid_seconds": grid["seconds"], "grid_configs": len(grid["results"]),
        "grid_measurements": len(points),
        "grid_best": best, "grid_of_recommended": same,
        "ratio_tune_vs_grid_best": round(recommended["throughput"] / best["throughput"], 3)
        if recommended and best else None,
        "ratio_grid_recommended_vs_grid_best": round(same["throughput"] / best["throughput"], 3)
        if same and best else None,
        "loadgen_cpu_us_per_request": round(cpu / requests * 1e6, 1) if requests else None,
        "grid_rows": [(r["label"], r["throughput"], r["p99_ms"], r["concurrency"]) for r in grid["results"]],
    }


def markdown(r: dict[str, Any]) -> str:
    def fmt(row: dict[str, Any] | None) -> str:
        if not row:
            return "none"
        return (f"{row['label']}: {row['throughput']:.1f} req/s, p99 {row['p99_ms']:.1f} ms "
                f"at {row['concurrency']} clients")

    within = r["ratio_tune_vs_grid_best"]
    lines = [
        BEGIN,
        "## Tuning",
        "",
        f"`.venv/bin/python bench/tune_grid.py --p99-ms {r['p99_ms']:g} --budget {r['budget_s']} --concurrency "
        f"{r['concurrency'][0]} {r['concurrency'][1]} --write-docs` on {r['machine'].get('cpu_model', '?')}, "
        f"{r['machine'].get('cores')} cores, no GPU (a machine shared with other work: expect noise). The CNN sample "
        f"(ResNet-style, FP32 [1, 3, 64, 64]), JSON requests straight to the temporary Tritons, target p99 ≤ "
        f"{r['p99_ms']:g} ms, clients {r['concurrency'][0]}..{r['concurrency'][1]}.",
        "",
        "| | settings measured | load tests | wall time | best within the target |",
        "|---|---|---|---|---|",
        f"| tune (budget {r['budget_s']} s{', partial' if r['tune_partial'] else ''}) | {r['tune_configs']} | "
        f"{r['tune_measurements']} | {r['tune_seconds']:.0f} s | {fmt(r['recommended'])} |",
        f"| full grid | {r['grid_configs']} | {r['grid_measurements']} | {r['grid_seconds']:.0f} s | "
        f"{fmt(r['grid_best'])} |",
        "",
        f"- Recommended vs the grid's best: **{within if within is not None else 'n/a'}** of its throughput "
        f"(target: at least 0.9); the grid's own measurement of the recommended setting: "
        f"{r['ratio_grid_recommended_vs_grid_best']} of the best ({fmt(r['grid_of_recommended'])}). Two runs of one "
        "setting differ by this machine's noise as well.",
        f"- The tune's decision (its close calls measured {REPEATS} more times each, interleaved): "
        f"{(r['recommended'] or {}).get('note') or 'nothing to compare'}",
        f"- Load generator (tuning/loadgen.py, Python asyncio + aiohttp, closed loop, a subprocess per measurement): "
        f"{r['loadgen_cpu_us_per_request']} µs of its own CPU per request, start-up and warm-up included. "
        "Triton's perf_analyzer was not used: the PyPI build needs glibc 2.38 (this machine has less), and the "
        "binary in the tritonclient wheel needs libraries from the runtime env made findable by hand.",
        "",
        "The grid, each setting's best point within the target (0: none met it):",
        "",
        "| setting | req/s | p99 ms | clients |",
        "|---|---|---|---|",
        *[f"| {label} | {tp:.1f} | {p99 if p99 is None else f'{p99:.1f}'} | {c} |" for label, tp, p99, c in
          r["grid_rows"]],
        END,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
