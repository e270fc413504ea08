"""platform/observability: every metric its Prometheus rules and Grafana dashboards read is one that the portal or
Triton exposes, so that renaming a metric breaks this test instead of an operator's alerts. Prometheus' own tools
check them in tests/test_observability_promtool.py."""

from __future__ import annotations

import gateway.stats
from tests.support.observability import (
    OPERATORS_OWN,
    PROMETHEUS_OWN,
    dashboard_queries,
    metric_names,
    portal_metric_names,
    rules,
    triton_metric_names,
)


def test_the_name_finder_finds_names_and_nothing_else() -> None:
    expr = ('histogram_quantile(0.99, sum by (team, le) (rate(a_bucket{code=~"5..|429", x="y z"}[$__rate_interval])))'
            ' / on (team) group_left () (b:rec or vector(1)) > bool 0.5 and c offset 5m + 1e3')
    assert metric_names(expr) == {"a_bucket", "b:rec", "c"}


def test_every_metric_the_rules_and_dashboards_read_is_exposed() -> None:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    exposed = portal_metric_names() | triton_metric_names() | PROMETHEUS_OWN | OPERATORS_OWN
    # The portal's own, named in gateway/stats.py, gateway/stream_figures.py and deployments/portal_metrics.py: a
    # rename there shows here.
    assert {"modelport_gateway_requests_total", "modelport_gateway_request_duration_seconds_bucket",
            "modelport_gateway_stream_first_piece_seconds_bucket", "modelport_pool_memory_budget_bytes",
            "modelport_pool_memory_reserved_bytes", "modelport_canary_rollbacks_total",
            "modelport_worker_queue_messages"} <= exposed
    queries = [(f"rule {rule.get('record') or rule['alert']}", rule["expr"]) for rule in rules()]
    queries += list(dashboard_queries())
    assert len(queries) > 30
    unknown = {where: sorted(metric_names(expr) - exposed - recorded) for where, expr in queries}
    assert {where: names for where, names in unknown.items() if names} == {}
    # Labels the rules and dashboards group by are the ones the gateway's series carry.
    for metric in (gateway.stats.REQUESTS, gateway.stats.LATENCY):
        assert {"team", "deployment", "revision"} <= set(metric._labelnames)
