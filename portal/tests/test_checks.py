"""The settings' system checks (portal/checks.py): each contradiction is reported with its id and a hint, and a
coherent configuration (the development default) passes."""

from __future__ import annotations

from typing import Any

import pytest

from portal import checks

STRONG_KEY = "k" * 20 + "Zq9#mX2$vL8@pW4!nR6%tY1^bH3&jK5*cF7(" + "q" * 10


def ids(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


def test_the_default_configuration_passes_every_check() -> None:
    for check in (checks.secret_key, checks.allowed_hosts, checks.s3_storage, checks.sandbox_settings,
                  checks.kubernetes_settings, checks.limits):
        assert check() == [], check.__name__


def test_it_reports_a_missing_secret_key_with_what_to_run(settings: Any) -> None:
    settings.SECRET_KEY = ""
    settings.PRODUCTION = False
    (message,) = checks.secret_key()
    assert message.id == "modelport.E100"
    assert "secret_key is missing" in message.msg
    assert "manage.py ensure_dirs" in message.hint
    settings.PRODUCTION = True
    (message,) = checks.secret_key()
    assert message.msg == "SECRET_KEY is not set (MODELPORT_ENV=production)."


@pytest.mark.parametrize("key", ["short", "a" * 60, "django-insecure-" + "x1y2z3" * 10])
def test_production_refuses_a_weak_secret_key(settings: Any, key: str) -> None:
    settings.PRODUCTION = True
    settings.SECRET_KEY = key
    assert ids(checks.secret_key()) == ["modelport.E101"]
    settings.PRODUCTION = False  # development takes any key it is given
    assert checks.secret_key() == []


def test_production_accepts_a_strong_secret_key(settings: Any) -> None:
    settings.PRODUCTION = True
    settings.SECRET_KEY = STRONG_KEY
    assert checks.secret_key() == []


def test_production_needs_allowed_hosts(settings: Any) -> None:
    settings.PRODUCTION = True
    settings.ALLOWED_HOSTS = []
    (message,) = checks.allowed_hosts()
    assert message.id == "modelport.E102"
    assert "ALLOWED_HOSTS" in message.hint
    settings.ALLOWED_HOSTS = ["modelport.example.com"]
    assert checks.allowed_hosts() == []


def test_debug_with_a_public_host_is_a_warning(settings: Any) -> None:
    settings.DEBUG = True
    settings.ALLOWED_HOSTS = ["localhost", "127.0.0.1"]
    assert checks.allowed_hosts() == []
    settings.ALLOWED_HOSTS = ["localhost", "modelport.example.com"]
    (message,) = checks.allowed_hosts()
    assert message.id == "modelport.W103"
    assert "(modelport.example.com)" in message.msg
    settings.DEBUG = False
    assert checks.allowed_hosts() == []


@pytest.mark.parametrize("configured", [{"S3_ACCESS_KEY_ID": "AKIA"}, {"S3_ENDPOINT_URL": "http://minio:9000"}])
def test_s3_settings_without_a_bucket_are_an_error(settings: Any, configured: dict[str, str]) -> None:
    settings.S3_BUCKET = ""
    for name, value in configured.items():
        setattr(settings, name, value)
    (message,) = checks.s3_storage()
    assert message.id == "modelport.E104"
    assert "Set S3_BUCKET" in message.hint
    settings.S3_BUCKET = "models"
    assert checks.s3_storage() == []


def test_a_required_sandbox_cannot_be_disabled(settings: Any) -> None:
    settings.SANDBOX_REQUIRED = True
    settings.SANDBOX_ENABLED = False
    assert ids(checks.sandbox_settings()) == ["modelport.E105"]
    settings.SANDBOX_REQUIRED = False
    assert checks.sandbox_settings() == []


def test_bad_sandbox_quantities_and_ports_are_named(settings: Any) -> None:
    settings.SANDBOX_SHM_SIZE = "1GB"
    settings.SANDBOX_DEFAULT_MEMORY = ""  # empty: no limit, which is fine
    settings.SANDBOX_EGRESS_PORTS = ["443", "https", "70000"]
    messages = checks.sandbox_settings()
    assert ids(messages) == ["modelport.E106", "modelport.E107", "modelport.E107"]
    assert messages[0].msg.startswith("SANDBOX_SHM_SIZE: '1GB' is not a Kubernetes quantity")
    assert "'https'" in messages[1].msg and "'70000'" in messages[2].msg


@pytest.mark.parametrize(("name", "value", "start"), [
    ("KUBERNETES_DEFAULT_MEMORY", "4GB", "KUBERNETES_DEFAULT_MEMORY: '4GB' is not a Kubernetes quantity"),
    ("KUBERNETES_DEFAULT_CPU", "9" * 400, "KUBERNETES_DEFAULT_CPU: a value of 400 characters"),
    ("KUBERNETES_SHM_SIZE", "-1Gi", "KUBERNETES_SHM_SIZE: '-1Gi' is not a Kubernetes quantity"),
    ("KUBERNETES_TMP_SIZE", "1e999", "KUBERNETES_TMP_SIZE: '1e999' is more than"),
])
def test_bad_kubernetes_quantities_are_errors(settings: Any, name: str, value: str, start: str) -> None:
    setattr(settings, name, value)
    (message,) = checks.kubernetes_settings()
    assert message.id == "modelport.E110"
    assert message.msg.startswith(start)


def test_bad_kubernetes_egress_and_url_lifetime_are_errors(settings: Any) -> None:
    settings.KUBERNETES_TRITON_EGRESS = ["minio:9000"]
    settings.KUBERNETES_REPOSITORY_URL_SECONDS = 604801
    messages = checks.kubernetes_settings()
    assert ids(messages) == ["modelport.E111", "modelport.E112"]
    assert messages[0].msg.startswith("KUBERNETES_TRITON_EGRESS: 'minio:9000' is neither CIDR")
    assert "604800" in messages[1].hint


def test_a_configured_cluster_without_s3_or_egress_is_a_warning(settings: Any, tmp_path: Any) -> None:
    settings.KUBERNETES_KUBECONFIG = str(tmp_path / "kubeconfig")
    settings.KUBERNETES_S3_BUCKET = ""
    settings.KUBERNETES_TRITON_EGRESS = []
    messages = checks.kubernetes_settings()
    assert ids(messages) == ["modelport.W113", "modelport.W113"]
    assert "set KUBERNETES_S3_BUCKET" in messages[0].msg
    assert "KUBERNETES_TRITON_EGRESS is empty" in messages[1].msg
    settings.KUBERNETES_S3_BUCKET = "repos"
    settings.KUBERNETES_TRITON_EGRESS = ["namespace=storage:9000"]
    assert checks.kubernetes_settings() == []
    settings.KUBERNETES_KUBECONFIG = ""  # no cluster: the Kubernetes runtime is not in use, nothing to warn about
    settings.KUBERNETES_S3_BUCKET = ""
    assert checks.kubernetes_settings() == []


def test_a_request_body_limit_below_the_multipart_upload_limit_is_a_warning(settings: Any) -> None:
    settings.MAX_MULTIPART_UPLOAD_SIZE = 100 * 1024**2
    settings.MAX_REQUEST_BODY_BYTES = 10 * 1024**2
    assert ids(checks.limits()) == ["modelport.W120"]
    settings.MAX_REQUEST_BODY_BYTES = 101 * 1024**2
    assert checks.limits() == []


def test_a_multipart_limit_above_the_artifact_limit_is_a_warning(settings: Any) -> None:
    settings.MAX_UPLOAD_SIZE = 10 * 1024**2
    settings.MAX_MULTIPART_UPLOAD_SIZE = 20 * 1024**2
    settings.MAX_REQUEST_BODY_BYTES = 21 * 1024**2
    assert ids(checks.limits()) == ["modelport.W121"]


def test_a_burst_below_the_rate_is_a_warning_unless_rate_limiting_is_off(settings: Any) -> None:
    settings.GATEWAY_RATE_LIMIT_PER_SECOND = 100.0
    settings.GATEWAY_RATE_LIMIT_BURST = 10
    assert ids(checks.limits()) == ["modelport.W122"]
    settings.GATEWAY_RATE_LIMIT_PER_SECOND = 0.0  # off
    assert checks.limits() == []


def test_a_drain_shorter_than_the_gateway_cache_is_a_warning(settings: Any) -> None:
    settings.GATEWAY_CACHE_TTL_SECONDS = 5.0
    settings.ROLLOUT_DRAIN_SECONDS = 2.0
    (message,) = checks.limits()
    assert message.id == "modelport.W123"
    assert "may still route to a server a rollout has stopped" in message.msg


def test_a_grpc_port_above_65535_is_an_error(settings: Any) -> None:
    settings.GATEWAY_GRPC_PORT = 70000
    assert ids(checks.limits()) == ["modelport.E124"]


def test_the_checks_are_registered_with_django() -> None:
    from django.core.checks.registry import registry

    registered = {check.__name__ for check in registry.get_checks()}
    assert {"secret_key", "allowed_hosts", "s3_storage", "sandbox_settings", "kubernetes_settings",
            "limits"} <= registered



def test_a_bad_scratch_size_is_named(settings: Any) -> None:
    for value, said in (("lots", "is not a Kubernetes quantity"), ("512Ki", "give at least 1Mi")):
        settings.SANDBOX_SCRATCH_SIZE = value
        [message] = checks.sandbox_settings()
        assert message.id == "modelport.E106"
        assert message.msg.startswith(f"SANDBOX_SCRATCH_SIZE: {value!r}") and said in message.msg
