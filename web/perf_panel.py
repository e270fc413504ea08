"""The deployment page's performance panel: the API's figures (performance/report.py) per revision, with each
model's time as a stacked bar drawn on the server in SVG (as the tune chart is, web/tune_chart.py): the gateway's
own share, Triton's queue, and its compute (input, infer, output). No JavaScript."""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from deployments.models import Deployment
from performance.report import performance
from performance.windows import DEFAULT_WINDOW, WINDOWS

# The model's name left of its bar, the bar's total (ms) right of it.
WIDTH, BAR, GAP, LABEL, TOTAL = 560, 18, 10, 150, 70
# The parts of a request's time, in the bar's order, with their labels.
PARTS = (("gateway", "gateway (own)"), ("queue", "queue"), ("compute_input", "compute input"),
         ("compute_infer", "compute infer"), ("compute_output", "compute output"))


def _parts(model: dict[str, Any], gateway_ms: float | None) -> list[tuple[str, str, float]]:
    values = {"gateway": gateway_ms or 0.0, "queue": model.get("queue_ms") or 0.0,
              "compute_input": model.get("compute_input_ms") or 0.0,
              "compute_infer": model.get("compute_infer_ms") or 0.0,
              "compute_output": model.get("compute_output_ms") or 0.0}
    return [(key, label, float(values[key])) for key, label in PARTS]


def _gateway_ms(revision: dict[str, Any], model: dict[str, Any]) -> float | None:
    """The gateway's own time on `model`: what it measured for that model. Rows written before the gateway kept
    its figures per model count under none: with no model's figures in the window, the revision's own time stands
    for the models callers call (not a pipeline's steps), as it did."""
    if any((m.get("gateway") or {}).get("requests") for m in revision["models"]):
        return (model.get("gateway") or {}).get("own_mean_ms")
    return None if model.get("step_of") else revision["gateway"].get("own_mean_ms")


def time_bars(revision: dict[str, Any]) -> SafeString:
    """One stacked bar per model of the revision that had requests (mean ms per request; the gateway's own time on
    each model, as it measured it for that model), all on one scale, named on the left, their total on the right;
    empty without figures."""
    rows = [(m["model"], _parts(m, _gateway_ms(revision, m))) for m in revision["models"]
            if m.get("queue_ms") is not None]
    if not rows:
        return mark_safe("")  # noqa: S308 - a constant
    longest = max(sum(v for _, _, v in parts) for _, parts in rows) or 1.0
    height = len(rows) * (BAR + GAP) + GAP
    scale = (WIDTH - LABEL - TOTAL) / longest
    bars = []
    for index, (name, parts) in enumerate(rows):
        y = GAP + index * (BAR + GAP)
        x = float(LABEL)
        segments = []
        for key, label, value in parts:
            width = value * scale
            if width > 0:
                segments.append((round(x, 1), y, round(width, 1), BAR, key, name, label, f"{value:.3f}"))
            x += width
        total = sum(value for _, _, value in parts)
        bars.append(format_html(
            '<text x="{}" y="{}" text-anchor="end" class="perf-label">{}</text>{}'
            '<text x="{}" y="{}" class="perf-label">{} ms</text>',
            LABEL - 8, y + BAR - 4, name[:24],
            format_html_join("", '<rect x="{}" y="{}" width="{}" height="{}" class="perf-{}">'
                                 '<title>{}: {} {} ms</title></rect>', segments),
            round(x + 6, 1), y + BAR - 4, f"{total:.2f}"))
    return format_html(
        '<svg class="perf-chart" viewBox="0 0 {w} {h}" role="img" preserveAspectRatio="none" '
        'aria-label="Mean time per request of each model, by part">'
        '<style>.perf-gateway{{fill:#888}}.perf-queue{{fill:#d63}}.perf-compute_input{{fill:#69c}}'
        '.perf-compute_infer{{fill:#27a}}.perf-compute_output{{fill:#9bd}}.perf-label{{font-size:13px;fill:#444}}</style>{bars}</svg>',
        w=WIDTH, h=height, bars=mark_safe("".join(bars)))  # noqa: S308 - each bar built by format_html


def batch_words(model: dict[str, Any]) -> str:
    """"1 × 120, 8 × 10": executions per batch size, as Triton formed them."""
    return ", ".join(f"{b['batch_size']} × {b['executions']}" for b in model.get("batch_sizes") or []) or "–"


def panel_context(deployment: Deployment, window: str | None) -> dict[str, Any]:
    """The panel's context: the figures over `window` (the default when it names none), and the other windows."""
    chosen = window if window in WINDOWS else DEFAULT_WINDOW
    report = performance(deployment, WINDOWS[chosen])
    for revision in report["revisions"]:
        revision["bars"] = time_bars(revision)
        for model in revision["models"]:
            model["batch_words"] = batch_words(model)
    return {"perf": report, "perf_window": chosen, "perf_windows": list(WINDOWS), "perf_parts": PARTS}
