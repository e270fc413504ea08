"""platform/observability checked by Prometheus' own tool, promtool (Debian's `prometheus` package: `make
observability-deps`; skipped without it, failed under CI=true): the rules, their unit tests with example series
(modelport.rules.test.yml), and the dashboards' queries. About 0.4 s of promtool's CPU: a slow file."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.observability import RULES, RULES_TESTS, dashboard_queries, rules, run_promtool


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
