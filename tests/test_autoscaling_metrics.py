"""The autoscalers the kubernetes runtime renders on Triton's queue-to-compute ratio (KUBERNETES_AUTOSCALING
queue-ratio-hpa and keda; they replaced platform/kubernetes/autoscaling's templates) read only what the observability
rules record and the Prometheus Adapter serves: the HPA's external metric is the adapter's, over a recorded series that
keeps the namespace its HPA is in, and KEDA's query reads recorded series only."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import yaml

from deployments.revision_spec import RevisionSpec
from deployments.runtimes.kubernetes import manifests
from deployments.runtimes.kubernetes.config import KubernetesConfig
from tests.support.observability import ROOT, metric_names, rules

ADAPTER_RULES = ROOT / "platform" / "observability" / "prometheus" / "prometheus-adapter-rules.yml"
SPEC = RevisionSpec.from_json({
    "runtime": "kubernetes", "replicas": 1, "resources": {},
    "autoscaling": {"min_replicas": 1, "max_replicas": 8, "metric": "cpu", "target": 70},
    "models": [{"name": "digits", "model": "digits", "version": 1, "format": "onnx", "max_batch_size": 8,
                "instance_group": {"count": 1, "kind": "cpu", "gpus": []}, "response_cache": False}]})
TARGET = manifests.Target(team="acme", name="digits-prod", revision=3, spec=SPEC, repository_key="p/r3/")


def recorded() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def rendered(autoscaling: str, kind: str) -> dict[str, Any]:
    config = replace(KubernetesConfig(), autoscaling=autoscaling, keda_prometheus_url="http://prometheus:9090")
    [obj] = [o for o in manifests.build(TARGET, "team-acme", config) if o["kind"] == kind]
    return obj


def test_the_hpa_scales_on_the_adapters_external_metric_over_a_recorded_series() -> None:
    hpa = rendered("queue-ratio-hpa", "HorizontalPodAutoscaler")
    adapter = yaml.safe_load(ADAPTER_RULES.read_text())["externalRules"]
    [metric] = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == adapter[0]["name"]["as"] == manifests.QUEUE_RATIO_METRIC
    # The adapter reads a recorded series that keeps the namespace its HPA is in, and the selector's labels.
    series = adapter[0]["seriesQuery"].split("{")[0]
    assert series == manifests.QUEUE_RATIO_SERIES and series in recorded()
    [ratio] = [rule for rule in rules() if rule.get("record") == series]
    # The ratio divides two recorded rates, each summed by the namespace (and the team and deployment).
    inputs = [rule for rule in rules() if rule.get("record") in metric_names(ratio["expr"])]
    assert len(inputs) == 2 and all("by (namespace, team, deployment" in rule["expr"] for rule in inputs), inputs
    assert set(metric["external"]["metric"]["selector"]["matchLabels"]) <= {"team", "deployment"}


def test_the_keda_scaled_object_reads_recorded_metrics_only() -> None:
    scaled = rendered("keda", "ScaledObject")
    queries = [trigger["metadata"]["query"] for trigger in scaled["spec"]["triggers"]]
    assert queries and all(trigger["type"] == "prometheus" for trigger in scaled["spec"]["triggers"])
    for query in queries:
        assert 'team="acme"' in query and 'deployment="digits-prod"' in query and 'namespace="team-acme"' in query
        assert metric_names(query) and metric_names(query) <= recorded(), query


def test_a_scale_to_zero_scaled_object_wakes_on_the_gateways_own_series() -> None:
    """The demand trigger reads what the gateway exports (no recording rule: a rule's evaluation would add its interval
    to every held request's wait), by the labels the gateway gives its series."""
    from gateway import scale_from_zero, stats

    zero = replace(TARGET, spec=RevisionSpec.from_json({**SPEC.to_json(), "autoscaling": {
        "min_replicas": 0, "max_replicas": 8, "metric": "cpu", "target": 70}}))
    config = replace(KubernetesConfig(), autoscaling="keda", keda_prometheus_url="http://prometheus:9090")
    [scaled] = [o for o in manifests.build(zero, "team-acme", config) if o["kind"] == "ScaledObject"]
    _, demand = scaled["spec"]["triggers"]
    exported = {stats.REQUESTS._name + "_total", scale_from_zero.HELD._name}
    assert metric_names(demand["metadata"]["query"]) == exported
    assert list(stats.REQUESTS._labelnames[:2]) == list(scale_from_zero.HELD._labelnames) == ["team", "deployment"]
