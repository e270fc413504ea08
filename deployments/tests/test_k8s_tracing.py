"""Tracing on a cluster (docs/observability.md, "Kubernetes"): with tracing on and the collector's egress set, the
rendered Triton pods (a deployment's and a pool's) export their spans to the portal's collector with a resource
naming the pod, and their NetworkPolicy lets them reach the collector's port and nothing more; otherwise nothing of
it is rendered. Pure rendering, validated against two Kubernetes versions' schemas: no cluster runs here."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from deployments.runtimes.kubernetes import checks, manifests, pool_manifests
from deployments.runtimes.kubernetes.config import KubernetesConfig, parse_egress
from deployments.tests.manifests import CONFIG, target, validate_everywhere

URL = "http://otel.observability.svc:4318/v1/traces"
TRACED = dataclasses.replace(CONFIG, traces_url=URL, trace_egress=parse_egress("namespace=observability:4318"))
COLLECTOR_RULE = {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}],
                  "ports": [{"protocol": "TCP", "port": 4318}]}
POOL = pool_manifests.PoolTarget(name="shared", team="", memory_budget_bytes=2**30)


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in objects}


def trace_configs(args: list[str]) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args) if arg == "--trace-config"]


def test_a_traced_deployments_triton_exports_to_the_collector_naming_its_pod() -> None:
    objects = by_kind(manifests.build(target(), "modelport-acme", TRACED))
    [triton] = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert trace_configs(triton["args"]) == [
        "mode=opentelemetry", "rate=0", "level=TIMESTAMPS", f"opentelemetry,url={URL}",
        "opentelemetry,resource=k8s.namespace.name=$(MODELPORT_POD_NAMESPACE)",
        "opentelemetry,resource=k8s.pod.name=$(MODELPORT_POD_NAME)",
        "opentelemetry,resource=modelport.deployment=digits", "opentelemetry,resource=modelport.revision=3",
    ]
    # The kubelet expands $(VAR) in args from the container's env: the downward API's names, nothing secret.
    assert triton["env"] == [
        {"name": "HOME", "value": "/tmp"},
        {"name": "MODELPORT_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MODELPORT_POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    for obj in objects.values():
        validate_everywhere(obj)


def test_a_canary_names_its_deployment_not_its_objects() -> None:
    canary = dataclasses.replace(target(revision=4), name=manifests.canary_name("digits"), deployment="digits")
    args = manifests.build(canary, "ns", TRACED)[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "opentelemetry,resource=modelport.deployment=digits" in trace_configs(args)
    assert "opentelemetry,resource=modelport.revision=4" in trace_configs(args)


def test_the_network_policy_adds_the_collectors_port_and_nothing_more() -> None:
    untraced = by_kind(manifests.build(target(), "modelport-acme", CONFIG))["NetworkPolicy"]["spec"]["egress"]
    traced = by_kind(manifests.build(target(), "modelport-acme", TRACED))["NetworkPolicy"]["spec"]["egress"]
    assert traced == [*untraced, COLLECTOR_RULE]
    by_address = dataclasses.replace(TRACED, traces_url="http://10.0.7.3:4318/v1/traces",
                                     trace_egress=parse_egress("10.0.7.3/32:4318"))
    egress = by_kind(manifests.build(target(), "ns", by_address))["NetworkPolicy"]["spec"]["egress"]
    assert egress[-1] == {"to": [{"ipBlock": {"cidr": "10.0.7.3/32"}}], "ports": [{"protocol": "TCP", "port": 4318}]}


def test_a_pools_triton_is_traced_the_same_way() -> None:
    objects = by_kind(pool_manifests.build(POOL, "modelport-pools", TRACED))
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    [triton] = [c for c in pod["containers"] if c["name"] == manifests.CONTAINER]
    configs = trace_configs(triton["args"])
    assert f"opentelemetry,url={URL}" in configs and "opentelemetry,resource=modelport.pool=shared" in configs
    assert {"name": "MODELPORT_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in triton["env"]
    assert objects["NetworkPolicy"]["spec"]["egress"][-1] == COLLECTOR_RULE
    for obj in objects.values():
        validate_everywhere(obj)


@pytest.mark.parametrize(("config", "problem"), [
    (CONFIG, None),  # tracing off: nothing to say, nothing rendered
    (dataclasses.replace(CONFIG, traces_url=URL), "KUBERNETES_TRACE_EGRESS is not set"),
    (dataclasses.replace(TRACED, trace_egress=parse_egress("namespace=observability")), "TCP port, 4318"),
    (dataclasses.replace(TRACED, trace_egress=parse_egress("namespace=observability:4317")), "TCP port, 4318"),
    (dataclasses.replace(TRACED, trace_egress=parse_egress("namespace=observability:4318/udp")), "TCP port, 4318"),
    (dataclasses.replace(TRACED, traces_url="grpc://otel:4317"), "not an http(s) URL"),
])
def test_pods_are_untraced_and_open_nothing_more_unless_the_collectors_port_is_given(
        config: KubernetesConfig, problem: str | None) -> None:
    assert config.pod_traces_url is None
    if problem is None:
        assert config.trace_problem() is None
    else:
        assert problem in (config.trace_problem() or "")
    objects = by_kind(manifests.build(target(), "ns", config))
    container = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert not trace_configs(container["args"]) and container["env"] == [{"name": "HOME", "value": "/tmp"}]
    assert objects["NetworkPolicy"]["spec"]["egress"] == \
        by_kind(manifests.build(target(), "ns", CONFIG))["NetworkPolicy"]["spec"]["egress"]
    pool = by_kind(pool_manifests.build(POOL, "ns", config))
    assert not [c for c in pool["Deployment"]["spec"]["template"]["spec"]["containers"]
                if trace_configs(c.get("args", []))]


def test_the_settings_give_the_portals_endpoint_and_the_operators_rule(settings: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel.observability.svc:4318")
    settings.KUBERNETES_TRACE_EGRESS = "namespace=observability:4318"
    config = KubernetesConfig.from_settings(settings)
    assert config.pod_traces_url == URL
    assert config.trace_egress == parse_egress("namespace=observability:4318")


def test_the_checks_report_a_bad_rule_and_untraced_pods(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.KUBERNETES_TRACE_EGRESS = "otel.observability.svc:4318"  # a NetworkPolicy cannot name a host
    assert [m.id for m in checks.kubernetes_settings()] == ["modelport.E114"]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", URL)
    settings.KUBERNETES_TRACE_EGRESS = ""
    settings.KUBERNETES_KUBECONFIG = "/dev/null"
    settings.KUBERNETES_S3_BUCKET = "models"
    settings.KUBERNETES_TRITON_EGRESS = ["10.0.5.0/24:9000"]
    messages = checks.kubernetes_settings()
    assert [m.id for m in messages] == ["modelport.W115"]
    assert "KUBERNETES_TRACE_EGRESS is not set" in messages[0].msg
    settings.KUBERNETES_TRACE_EGRESS = "namespace=observability:4318"
    assert checks.kubernetes_settings() == []
