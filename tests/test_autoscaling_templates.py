"""platform/kubernetes/autoscaling: the HPA (through the Prometheus Adapter's external metric) and the KEDA
ScaledObject on Triton's queue-to-compute ratio render from their placeholders into valid objects that scale a
deployment's Triton Deployment, and read only metrics that the rules record or the portal exposes."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from deployments.runtimes.kubernetes import manifests
from tests.support.observability import (
    OPERATORS_OWN,
    PROMETHEUS_OWN,
    ROOT,
    metric_names,
    portal_metric_names,
    rules,
    triton_metric_names,
)

AUTOSCALING = ROOT / "platform" / "kubernetes" / "autoscaling"
ADAPTER_RULES = ROOT / "platform" / "observability" / "prometheus" / "prometheus-adapter-rules.yml"
VALUES = {"NAMESPACE": "team-acme", "TEAM": "acme", "DEPLOYMENT": "digits-prod", "NAME": "digits-prod",
          "MIN_REPLICAS": "1", "MAX_REPLICAS": "8", "TARGET_RATIO": "1", "PROMETHEUS_URL": "http://prometheus:9090"}


def render(path: Path) -> dict[str, Any]:
    """The template with every placeholder given (string.Template.substitute fails on one without a value)."""
    rendered: dict[str, Any] = yaml.safe_load(string.Template(path.read_text()).substitute(VALUES))
    return rendered


def recorded() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def test_the_hpa_scales_the_triton_deployment_on_the_adapters_external_metric() -> None:
    hpa = render(AUTOSCALING / "hpa-queue-compute.yaml.tmpl")
    adapter = yaml.safe_load(ADAPTER_RULES.read_text())["externalRules"]
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["kind"] == "HorizontalPodAutoscaler"
    for version in ("1.31", "1.33"):
        kubernetes_validate.validate(hpa, version, strict=True)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "digits-prod"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 8)
    assert hpa["metadata"]["labels"][manifests.LABEL_TEAM] == "acme"
    assert hpa["metadata"]["labels"][manifests.LABEL_DEPLOYMENT] == "digits-prod"
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == adapter[0]["name"]["as"]
    assert metric["external"]["metric"]["selector"]["matchLabels"] == {"team": "acme", "deployment": "digits-prod"}
    # The adapter reads a recorded series that keeps the namespace its HPA is in.
    series = adapter[0]["seriesQuery"].split("{")[0]
    assert series in recorded()
    [ratio] = [rule for rule in rules() if rule.get("record") == series]
    assert "by (namespace, team, deployment" in ratio["expr"]


def test_the_keda_scaledobject_reads_recorded_and_exposed_metrics() -> None:
    scaled = render(AUTOSCALING / "keda-queue-compute.yaml.tmpl")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["kind"] == "ScaledObject"
    assert scaled["spec"]["scaleTargetRef"]["name"] == "digits-prod"
    exposed = portal_metric_names() | triton_metric_names() | PROMETHEUS_OWN | OPERATORS_OWN | recorded()
    queries = [trigger["metadata"]["query"] for trigger in scaled["spec"]["triggers"]]
    assert queries and all(trigger["type"] == "prometheus" for trigger in scaled["spec"]["triggers"])
    for query in queries:
        assert 'team="acme"' in query and 'deployment="digits-prod"' in query
        assert metric_names(query) and metric_names(query) <= exposed, query
