"""platform/observability: the Prometheus rules pass Prometheus' own checker and their unit tests (promtool, from
Debian's `prometheus` package: `make observability-deps`), the dashboards' queries parse, and every metric the rules
and dashboards read is one that the portal or Triton exposes, so that renaming a metric breaks this test instead of
an operator's alerts."""

from __future__ import annotations

from pathlib import Path

import yaml

import gateway.stats
from tests.support.observability import (
    OPERATORS_OWN,
    PROMETHEUS_OWN,
    RULES,
    RULES_TESTS,
    dashboard_queries,
    metric_names,
    portal_metric_names,
    rules,
    run_promtool,
    triton_metric_names,
)


def test_the_name_finder_finds_names_and_nothing_else() -> None:
    expr = ('histogram_quantile(0.99, sum by (team, le) (rate(a_bucket{code=~"5..|429", x="y z"}[$__rate_interval])))'
            ' / on (team) group_left () (b:rec or vector(1)) > bool 0.5 and c offset 5m + 1e3')
    assert metric_names(expr) == {"a_bucket", "b:rec", "c"}


def test_every_metric_the_rules_and_dashboards_read_is_exposed() -> None:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    exposed = portal_metric_names() | triton_metric_names() | PROMETHEUS_OWN | OPERATORS_OWN
    # The portal's own, named in gateway/stats.py and gateway/stream_figures.py: a rename there shows here.
    assert {"modelport_gateway_requests_total", "modelport_gateway_request_duration_seconds_bucket",
            "modelport_gateway_stream_first_piece_seconds_bucket"} <= exposed
    queries = [(f"rule {rule.get('record') or rule['alert']}", rule["expr"]) for rule in rules()]
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
    assert tested == {rule["alert"] for rule in rules() if "alert" in rule}


def test_the_dashboards_queries_parse(tmp_path: Path) -> None:
    """promtool parses each dashboard query as a recording rule's, with Grafana's variables given values."""
    values = {"$__rate_interval": "5m", "$team": "acme", "$deployment": "digits-prod", "$revision": "1"}
    queries = []
    for index, (where, expr) in enumerate(dashboard_queries()):
        for variable, value in values.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"{where}: a variable without a test value: {expr}"
        queries.append({"record": f"dashboard:query_{index}", "expr": expr})
    (tmp_path / "dashboards.rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": queries}]}))
    result = run_promtool("check", "rules", "dashboards.rules.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
