"""The Kubernetes runtime's settings: read from the environment with the typed helpers, into one frozen dataclass
that says what is missing in words a person can act on."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from deployments.runtimes.kubernetes.config import KubernetesConfig
from portal.settings import _env_pairs
from tests.fresh_settings import load_settings


def test_key_value_lists_are_parsed_and_bad_items_fail_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_NAMESPACES", "acme=ml-serving, globex = globex-prod")
    assert _env_pairs("KUBERNETES_NAMESPACES") == {"acme": "ml-serving", "globex": "globex-prod"}
    monkeypatch.setenv("KUBERNETES_NAMESPACES", "acme")
    with pytest.raises(ImproperlyConfigured, match="KUBERNETES_NAMESPACES must be a comma-separated list of "
                                                   "key=value pairs, got 'acme'"):
        _env_pairs("KUBERNETES_NAMESPACES")
    monkeypatch.delenv("KUBERNETES_NAMESPACES")
    assert _env_pairs("KUBERNETES_NAMESPACES", "a=b") == {"a": "b"}


def test_the_config_comes_from_the_settings(settings: Any) -> None:
    settings.KUBERNETES_KUBECONFIG = "/etc/modelport/kubeconfig"
    settings.KUBERNETES_NAMESPACES = {"acme": "ml-serving"}
    settings.KUBERNETES_GPU_TYPES = {"a100": "NVIDIA-A100-SXM4-80GB"}
    settings.KUBERNETES_S3_BUCKET = "models"
    settings.KUBERNETES_TRITON_EGRESS = ["namespace=storage:9000", "10.0.5.0/24:443"]
    settings.KUBERNETES_REPOSITORY_URL_SECONDS = 7200
    config = KubernetesConfig.from_settings(settings)
    assert [rule.to_policy()["to"] for rule in config.egress] == [
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "storage"}}}],
        [{"ipBlock": {"cidr": "10.0.5.0/24"}}]]
    assert config.repository_url_seconds == 7200 and config.init_image == config.image
    assert config.namespace_for("acme") == "ml-serving"
    assert config.gpu_label_value("a100") == "NVIDIA-A100-SXM4-80GB"
    assert config.problems() == []
    assert hash(config)  # frozen and hashable: the API client is cached per config
    assert "s3_secret_access_key" not in repr(config)


def test_it_says_what_to_set_when_nothing_is_configured() -> None:
    problems = KubernetesConfig().problems()
    assert problems[0].startswith("No Kubernetes cluster is configured: set KUBECONFIG")
    assert problems[1].startswith("S3 for model repositories is not configured")
    assert problems[2].startswith("KUBERNETES_TRITON_EGRESS is empty: Triton's pods may connect to nothing but DNS")


def test_a_kubernetes_setting_below_its_minimum_stops_the_portal_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings, imported with one unparseable variable, fail saying which and why. (Quantities, egress rules
    and the URL lifetime's maximum are system checks: portal/tests/test_checks.py.)"""
    with pytest.raises(ImproperlyConfigured, match="^KUBERNETES_REPOSITORY_URL_SECONDS must be at least 3600, got 60$"):
        load_settings(monkeypatch, {"KUBERNETES_REPOSITORY_URL_SECONDS": "60"})


def test_in_cluster_outside_a_pod_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert "does not run in a Kubernetes pod" in (KubernetesConfig(in_cluster=True).cluster_problem() or "")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert KubernetesConfig(in_cluster=True).cluster_problem() is None


def test_no_team_gets_the_namespace_of_the_pools_open_to_every_team() -> None:
    from deployments.runtimes.kubernetes.config import NamespaceRefused

    cfg = KubernetesConfig()
    assert cfg.namespace_for("acme") == "modelport-acme"
    with pytest.raises(NamespaceRefused, match="KUBERNETES_POOL_NAMESPACE"):
        cfg.namespace_for("pools")  # modelport- + pools: the default KUBERNETES_POOL_NAMESPACE
    with pytest.raises(NamespaceRefused):
        KubernetesConfig(namespaces=(("acme", "shared"),), pool_namespace="shared").namespace_for("acme")
    assert cfg.team_namespace("pools") == "modelport-pools"  # unchecked: to find and remove its own objects


def test_the_system_check_refuses_a_team_mapped_to_the_pools_namespace(settings: Any) -> None:
    from deployments.checks import pool_namespace_check

    settings.KUBERNETES_NAMESPACES = {"acme": "modelport-pools"}
    assert [m.id for m in pool_namespace_check()] == ["modelport.E040"]
    settings.KUBERNETES_NAMESPACES = {"acme": "acme-models"}
    assert pool_namespace_check() == []


def test_the_autoscaling_settings_reach_the_config_and_a_bad_one_stops_the_portal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_settings(monkeypatch, {"KUBERNETES_AUTOSCALING": "keda", "KUBERNETES_AUTOSCALING_TARGET_RATIO": "0.5",
                                         "KUBERNETES_KEDA_PROMETHEUS_URL": "http://prometheus:9090",
                                         "KUBERNETES_WORKER_POD_LABELS": "app=reconciler"})
    config = KubernetesConfig.from_settings(loaded)
    assert (config.autoscaling, config.autoscaling_target_ratio) == ("keda", 0.5)
    assert config.keda_prometheus_url == "http://prometheus:9090"
    assert config.worker_pod_labels == (("app", "reconciler"),)
    assert KubernetesConfig.from_settings(load_settings(monkeypatch, {"KUBERNETES_WORKER_POD_LABELS": ""})
                                          ).worker_pod_labels == ()
    with pytest.raises(ImproperlyConfigured, match="^KUBERNETES_AUTOSCALING must be hpa, queue-ratio-hpa or keda"):
        load_settings(monkeypatch, {"KUBERNETES_AUTOSCALING": "cpu"})
    with pytest.raises(ImproperlyConfigured, match="^KUBERNETES_AUTOSCALING_TARGET_RATIO must be at least 0.01"):
        load_settings(monkeypatch, {"KUBERNETES_AUTOSCALING": "hpa", "KUBERNETES_AUTOSCALING_TARGET_RATIO": "0"})


def test_the_system_check_warns_of_keda_without_prometheus(settings: Any) -> None:
    from deployments.runtimes.kubernetes import checks

    settings.KUBERNETES_KUBECONFIG = "/dev/null"
    settings.KUBERNETES_S3_BUCKET = "models"
    settings.KUBERNETES_TRITON_EGRESS = ["10.0.5.0/24:9000"]
    settings.KUBERNETES_AUTOSCALING = "keda"
    settings.KUBERNETES_KEDA_PROMETHEUS_URL = ""
    assert [m.id for m in checks.kubernetes_settings()] == ["modelport.W116"]
    settings.KUBERNETES_KEDA_PROMETHEUS_URL = "http://prometheus:9090"
    assert checks.kubernetes_settings() == []
