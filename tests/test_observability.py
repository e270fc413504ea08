"""platform/observability: the Prometheus rules pass Prometheus' own checker and their unit tests (promtool, from
Debian's `prometheus` package: `make observability-deps`), the dashboards' queries parse, and every metric the rules
and dashboards read is one that the portal or Triton exposes, so that renaming a metric breaks this test instead of
an operator's alerts."""

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

import gateway.stats
import gateway.stream_figures  # noqa: F401  (registers the stream metrics)

ROOT = Path(__file__).resolve().parents[1]
OBSERVABILITY = ROOT / "platform" / "observability"
RULES = OBSERVABILITY / "prometheus" / "modelport.rules.yml"
RULES_TESTS = OBSERVABILITY / "prometheus" / "modelport.rules.test.yml"
DASHBOARDS = sorted((OBSERVABILITY / "grafana").glob("*.json"))
TRITON_METRICS = OBSERVABILITY / "triton-metrics.txt"
# Prometheus' own series: `up` of each scrape.
PROMETHEUS_OWN = frozenset({"up"})
# The rules an operator adds (one deployment's p99 target: the group modelport-latency-targets says how).
OPERATORS_OWN = frozenset({"modelport:latency_target_seconds"})


def promtool() -> str:
    """The promtool binary; missing, the test is skipped here and fails in CI, where `make test` installs it."""
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is missing: `make observability-deps` installs Debian's prometheus package"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def run_promtool(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=60,
                          check=False)


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


def test_the_name_finder_finds_names_and_nothing_else() -> None:
    expr = ('histogram_quantile(0.99, sum by (team, le) (rate(a_bucket{code=~"5..|429", x="y z"}[$__rate_interval])))'
            ' / on (team) group_left () (b:rec or vector(1)) > bool 0.5 and c offset 5m + 1e3')
    assert metric_names(expr) == {"a_bucket", "b:rec", "c"}


def _rules() -> list[dict[str, Any]]:
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
    """Every sample name the portal's and the gRPC gateway's /metrics can hold, from the process' own registry."""
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count",
                                                                                  "_created")}
    names = set()
    for family in REGISTRY.collect():
        if family.name.startswith("modelport_"):
            names |= {family.name + suffix for suffix in suffixes[family.type]}
    return names


def triton_metric_names() -> set[str]:
    return {line.strip() for line in TRITON_METRICS.read_text().splitlines() if line.strip()
            and not line.startswith("#")}


def test_every_metric_the_rules_and_dashboards_read_is_exposed() -> None:
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    exposed = portal_metric_names() | triton_metric_names() | PROMETHEUS_OWN | OPERATORS_OWN
    # The portal's own, named in gateway/stats.py and gateway/stream_figures.py: a rename there shows here.
    assert {"modelport_gateway_requests_total", "modelport_gateway_request_duration_seconds_bucket",
            "modelport_gateway_stream_first_piece_seconds_bucket"} <= exposed
    queries = [(f"rule {rule.get('record') or rule['alert']}", rule["expr"]) for rule in _rules()]
    queries += list(dashboard_queries())
    assert len(queries) > 30
    unknown = {where: sorted(metric_names(expr) - exposed - recorded) for where, expr in queries}
    assert {where: names for where, names in unknown.items() if names} == {}
    # Labels the rules group by are the ones the series carry: the gateway's team and deployment.
    assert {"team", "deployment"} <= set(gateway.stats.REQUESTS._labelnames)


def test_the_rules_pass_promtool_check() -> None:
    result = run_promtool("check", "rules", RULES.name, cwd=RULES.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_unit_tests_pass() -> None:
    """modelport.rules.test.yml: example series for which each alert fires, and others for which it stays quiet."""
    result = run_promtool("test", "rules", RULES_TESTS.name, cwd=RULES_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = {test["alertname"] for case in yaml.safe_load(RULES_TESTS.read_text())["tests"]
              for test in case.get("alert_rule_test", [])}
    assert tested == {rule["alert"] for rule in _rules() if "alert" in rule}


def test_the_dashboards_queries_parse(tmp_path: Path) -> None:
    """promtool parses each dashboard query as a recording rule's, with Grafana's variables given values."""
    values = {"$__rate_interval": "5m", "$team": "acme", "$deployment": "digits-prod", "$revision": "1"}
    rules = []
    for index, (where, expr) in enumerate(dashboard_queries()):
        for variable, value in values.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"{where}: a variable without a test value: {expr}"
        rules.append({"record": f"dashboard:query_{index}", "expr": expr})
    (tmp_path / "dashboards.rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": rules}]}))
    result = run_promtool("check", "rules", "dashboards.rules.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
