"""What the tests of platform/observability share: where its files are, promtool, the metric names a query reads,
and the names the portal and Triton expose."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

import gateway.stats  # noqa: F401  (registers the gateway's metrics)
import gateway.stream_figures  # noqa: F401  (registers the stream metrics)
from deployments.portal_metrics import PortalState

ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY = ROOT / "platform" / "observability"
RULES = OBSERVABILITY / "prometheus" / "modelport.rules.yml"
RULES_TESTS = OBSERVABILITY / "prometheus" / "modelport.rules.test.yml"
DASHBOARDS = sorted((OBSERVABILITY / "grafana").glob("*.json"))
TRITON_METRICS = OBSERVABILITY / "triton-metrics.txt"
# Prometheus' own series: `up` of each scrape.
PROMETHEUS_OWN = frozenset({"up"})
# The rules an operator adds (one deployment's p99 target: the group modelport-latency-targets says how).
OPERATORS_OWN = frozenset({"modelport:latency_target_seconds"})


def require_binary(name: str) -> str:
    """The path of Prometheus' binary `name` (promtool, prometheus); missing, the test is skipped here and fails in
    CI, where `make test` installs it."""
    found = shutil.which(name)
    if found is None:
        message = f"{name} is missing: `make observability-deps` installs Debian's prometheus package"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def run_promtool(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_binary("promtool"), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=60, check=False)


# --- The metric names a query reads ---------------------------------------------------------------------------

_KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                       "offset", "inf", "nan"})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NAME = re.compile(r"(?<![\w:$.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")
_NUMBER_SUFFIX = re.compile(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)?[smhdwy]?\b", re.IGNORECASE)


def metric_names(expr: str) -> set[str]:
    """The metric names (and recording rules' names) that a PromQL expression selects. Not a parser: it strips what
    holds no name (strings, label matchers, ranges, grouping clauses, numbers) and keeps the identifiers that are
    not a function's name or a keyword."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    text = _NUMBER_SUFFIX.sub("", text)
    return {name for name, call in _NAME.findall(text) if not call and name.lower() not in _KEYWORDS}


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable of the dashboards."""
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                yield f"{path.name}: {panel['title']}", target["expr"]
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                match = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"]["query"])
                assert match, f"{path.name}: variable {variable['name']} is not label_values(query, label)"
                yield f"{path.name}: variable {variable['name']}", match[1]


def portal_metric_names() -> set[str]:
    """Every sample name the portal's and the gRPC gateway's /metrics can hold, from the process' own registry and
    the portal's state collector (its families described, no database read)."""
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count",
                                                                                  "_created")}
    names = set()
    for family in (*REGISTRY.collect(), *PortalState().describe()):
        if family.name.startswith("modelport_"):
            names |= {family.name + suffix for suffix in suffixes[family.type]}
    return names


def triton_metric_names() -> set[str]:
    return {line.strip() for line in TRITON_METRICS.read_text().splitlines() if line.strip()
            and not line.startswith("#")}
