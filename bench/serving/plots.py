"""Plots of a serving benchmark results file (run.py writes it), with matplotlib in the bench env:

    var/bench-env/bin/python bench/serving/plots.py bench/results/serving.json docs/benchmarks [PREFIX]

PREFIX (default `serving`; `peers` for a --peers-only results file) starts the file names:

- serving-throughput.png: throughput against concurrency, one panel per workload, one line per server (medians,
  bars from the slowest to the fastest repeat), the in-process bound as a dashed line;
- serving-latency.png: p50, p95 and p99 latency per server at the highest concurrency, one panel per workload.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "a": ("tab:red", "-", "o"), "b": ("tab:orange", "-", "s"),
    "c-gateway": ("tab:gray", "-", "^"), "c-direct": ("tab:gray", ":", "^"),
    "d-gateway": ("tab:blue", "-", "D"), "d-direct": ("tab:blue", ":", "D"),
    "e-gateway": ("tab:green", "-", "P"), "e-gateway-json": ("tab:green", "--", "X"),
    "e-direct": ("tab:green", ":", "P"),
    "mlserver": ("tab:purple", "-", "v"), "bentoml": ("tab:brown", "-", "<"), "litserve": ("tab:pink", "-", ">"),
    "e-torchscript-gateway": ("tab:olive", "-", "*"), "e-torchscript-direct": ("tab:olive", ":", "*"),
    "e-savedmodel-gateway": ("tab:cyan", "-", "h"), "e-savedmodel-direct": ("tab:cyan", ":", "h"),
}
LABELS = {
    "a": "a Tornado", "b": "b ThreadingHTTPServer", "c-gateway": "c no batching (gateway)",
    "c-direct": "c no batching (direct)", "d-gateway": "d batching (gateway)", "d-direct": "d batching (direct)",
    "e-gateway": "e batching, 2 inst. (gateway)", "e-gateway-json": "e (gateway), KServe JSON",
    "e-direct": "e batching, 2 inst. (direct)",
    "mlserver": "MLServer (KServe JSON)", "bentoml": "BentoML (JSON)", "litserve": "LitServe (JSON)",
    "e-torchscript-gateway": "e as TorchScript (gateway)", "e-torchscript-direct": "e as TorchScript (direct)",
    "e-savedmodel-gateway": "e as SavedModel (gateway)", "e-savedmodel-direct": "e as SavedModel (direct)",
}


def throughput(document: dict[str, Any], path: Path) -> None:
    results = document["workloads"]
    fig, axes = plt.subplots(1, len(results), figsize=(max(5.2 * len(results), 8.5), 4.4), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        rows = result["summary"]["rows"]
        for server, (color, line, marker) in STYLE.items():
            picked = sorted((r for r in rows if r["server"] == server), key=lambda r: r["concurrency"])
            if not picked:
                continue
            x = [r["concurrency"] for r in picked]
            y = [r["throughput"]["median"] for r in picked]
            err = [[r["throughput"]["median"] - r["throughput"]["min"] for r in picked],
                   [r["throughput"]["max"] - r["throughput"]["median"] for r in picked]]
            ax.errorbar(x, y, yerr=err, color=color, linestyle=line, marker=marker, capsize=3, label=LABELS[server])
        bound = result["summary"].get("bound")
        highest = max(r["throughput"]["max"] for r in rows)
        if bound and bound["median"] <= 1.6 * highest:
            ax.axhline(bound["median"], color="black", linestyle="--", linewidth=1, label="bound (in-process)")
            ax.set_ylim(0, 1.08 * max(highest, bound["median"]))
        else:
            ax.set_ylim(0, 1.15 * highest)
            if bound:  # far above the servers: a line up there would squash them
                ax.text(0.02, 0.97, f"bound (in-process): {bound['median']:,.0f}/s, off the scale",
                        transform=ax.transAxes, va="top", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xticks([r for r in sorted({r["concurrency"] for r in rows})])
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("concurrent clients (closed loop)")
        ax.set_ylabel("requests/s")
        ax.set_title(f"{result['number']}. {result['workload']}")
        ax.grid(alpha=0.3)
    # Every panel's lines: the peers serve only some workloads, so the first panel may lack them.
    legend: dict[str, Any] = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    columns = 5 if len(results) > 1 else 3
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=columns, fontsize=8, frameon=False)
    fig.suptitle("Throughput against concurrency (median of repeats, bars: min to max)")
    fig.tight_layout(rect=(0, 0.04 + 0.035 * -(-len(legend) // columns), 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency(document: dict[str, Any], path: Path) -> None:
    results = document["workloads"]
    fig, axes = plt.subplots(1, len(results), figsize=(max(5.2 * len(results), 8.5), 4.4), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        rows = result["summary"]["rows"]
        top = max(r["concurrency"] for r in rows)
        picked = [r for r in rows if r["concurrency"] == top]
        names = [r["server"] for r in picked]
        width = 0.27
        p99s = sorted(r["p99_ms"]["median"] for r in picked)
        # Linear scale (bars from zero), cut at 2.5x the middle p99: a far outlier is written on its bar instead.
        cap = 2.5 * p99s[len(p99s) // 2]
        for offset, (key, shade) in enumerate((("p50_ms", 1.0), ("p95_ms", 0.65), ("p99_ms", 0.35))):
            x = [i + (offset - 1) * width for i in range(len(picked))]
            values = [r[key]["median"] for r in picked]
            ax.bar(x, [min(v, cap) for v in values], width, alpha=shade,
                   color=[STYLE[n][0] for n in names], label=key.replace("_ms", ""))
            for xi, value in zip(x, values, strict=True):
                if value > cap:
                    ax.text(xi, cap, f"{value:,.0f}", rotation=90, ha="center", va="top", fontsize=7)
        ax.set_ylim(0, cap * 1.02)
        ax.set_xticks(range(len(picked)))
        ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("latency, ms")
        ax.set_title(f"{result['number']}. {result['workload']}, concurrency {top}")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8, title="bars left to right", title_fontsize=8)
    fig.suptitle("Latency percentiles at the highest concurrency (medians of repeats)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    document = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    prefix = sys.argv[3] if len(sys.argv) > 3 else "serving"
    out.mkdir(parents=True, exist_ok=True)
    throughput(document, out / f"{prefix}-throughput.png")
    latency(document, out / f"{prefix}-latency.png")
    print(f"plots: {out}/{prefix}-throughput.png, {out}/{prefix}-latency.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
