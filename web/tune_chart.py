"""A tune's results as an inline SVG drawn on the server (no JavaScript library, no CDN): every measured point,
throughput against p99 latency, the frontier as a line, the target as a dashed vertical line, the recommendation
ringed. Plain functions, no Django models."""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 560, 280
# Room for tick labels of 13 px and axis titles of 14 px: at 10 and 11 px the labels were unreadable once the chart
# was scaled to the panel's width (and a phone's).
LEFT, RIGHT, TOP, BOTTOM = 70, 18, 14, 48


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    step = 10 ** len(str(int(value))) / 10
    for factor in (1, 2, 2.5, 5, 10):
        if value <= step * factor:
            return step * factor
    return value


def _tick(value: float) -> str:
    """A tick label people read at a glance: 1,250 rather than 1250.0, 0.5 rather than 0.50000."""
    if value == int(value) or value >= 100:
        return f"{round(value):,}"
    return f"{value:.2g}" if value < 1 else f"{value:.1f}"


def frontier_svg(results: list[dict[str, Any]], frontier: list[dict[str, Any]], target_ms: float,
                 recommendation: dict[str, Any] | None) -> SafeString:
    """The chart, or an empty string when nothing was measured yet."""
    points = [(float(p["p99_ms"]), float(p["throughput"]), p["errors"] == 0 and p["p99_ms"] <= target_ms)
              for r in results for p in r.get("points", []) if p.get("p99_ms") is not None]
    if not points:
        return mark_safe("")  # noqa: S308 - a constant
    x_max = _nice_max(max(max(x for x, _, _ in points), target_ms) * 1.05)
    y_max = _nice_max(max(y for _, y, _ in points) * 1.05)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return round(LEFT + x / x_max * plot_w, 1)

    def sy(y: float) -> float:
        return round(TOP + plot_h - y / y_max * plot_h, 1)

    ticks = [i / 4 for i in range(5)]
    grid = format_html_join("", (
        '<line x1="{}" y1="{}" x2="{}" y2="{}" class="grid"/>'
        '<text x="{}" y="{}" text-anchor="end" class="tick">{}</text>'
        '<text x="{}" y="{}" text-anchor="middle" class="tick">{}</text>'), (
        (LEFT, sy(t * y_max), WIDTH - RIGHT, sy(t * y_max), LEFT - 8, sy(t * y_max) + 4, _tick(t * y_max),
         sx(t * x_max), HEIGHT - BOTTOM + 20, _tick(t * x_max)) for t in ticks))
    dots = format_html_join("",
                            '<circle cx="{}" cy="{}" r="3.5" class="{}"><title>{} req/s, p99 {} ms</title></circle>',
                            ((sx(x), sy(y), "ok" if ok else "miss", f"{y:.1f}", f"{x:.1f}") for x, y, ok in points))
    line = " ".join(f"{sx(float(p['p99_ms']))},{sy(float(p['throughput']))}" for p in frontier
                    if p.get("p99_ms") is not None)
    ring = ""
    if recommendation and recommendation.get("p99_ms") is not None:
        ring = format_html('<circle cx="{}" cy="{}" r="8" class="recommended"><title>recommended: {}</title></circle>',
                           sx(float(recommendation["p99_ms"])), sy(float(recommendation["throughput"])),
                           recommendation.get("label", ""))
    return format_html(
        '<svg class="tune-chart" id="tune-chart" viewBox="0 0 {w} {h}" role="img" '
        'aria-label="Throughput against p99 latency of each measurement">'
        '<style>.grid{{stroke:#ddd}}.tick{{font-size:13px;fill:#444}}.axis{{font-size:14px;fill:#222;font-weight:600}}'
        '.ok{{fill:#2a7}}.miss{{fill:#bbb}}.front{{fill:none;stroke:#2a7;stroke-width:1.5}}'
        '.target{{stroke:#c33;stroke-dasharray:4 3}}.recommended{{fill:none;stroke:#c70;stroke-width:2}}</style>'
        '{grid}<line x1="{tx}" y1="{top}" x2="{tx}" y2="{bottom}" class="target"><title>target p99 {target} ms'
        '</title></line><polyline points="{line}" class="front"/>{dots}{ring}'
        '<text x="{cx}" y="{h2}" text-anchor="middle" class="axis">p99 latency (ms)</text>'
        '<text x="16" y="{cy}" text-anchor="middle" class="axis" transform="rotate(-90 16 {cy})">requests/s</text>'
        '</svg>',
        w=WIDTH, h=HEIGHT, grid=grid, tx=sx(target_ms), top=TOP, bottom=HEIGHT - BOTTOM, target=f"{target_ms:g}",
        line=line, dots=dots, ring=ring, cx=LEFT + plot_w / 2, h2=HEIGHT - 8, cy=TOP + plot_h / 2)
