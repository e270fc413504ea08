"""Settings read the environment strictly: production refuses weak configuration, bad values fail loudly."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from accounts import checks
from infra.env import env_bool, env_int, env_secret
from tests.fresh_settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_env_bool_rejects_nonsense(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="X_FLAG must be one of"):
        env_bool("X_FLAG")


def test_env_int_rejects_non_integers_and_values_below_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_INT", "ten")
    with pytest.raises(ImproperlyConfigured, match="must be an integer"):
        env_int("X_INT", 1)
    monkeypatch.setenv("X_INT", "0")
    with pytest.raises(ImproperlyConfigured, match="at least 1"):
        env_int("X_INT", 1, minimum=1)


def test_env_secret_reads_the_file_variant(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t\n")
    monkeypatch.setenv("X_SECRET_FILE", str(secret))
    assert env_secret("X_SECRET") == "s3cr3t"


STRONG_SECRET_KEY = "k" * 20 + "Zq9#mX2$vL8@pW4!nR6%tY1^bH3&jK5*cF7(" + "q" * 10


def production_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str) -> dict[str, Any]:
    """portal/settings.py imported afresh with a production environment, as the settings that differ from the
    tests' own: what override_settings needs to run the checks against it in-process."""
    from django.conf import settings

    module = load_settings(monkeypatch, {"MODELPORT_ENV": "production", "ALLOWED_HOSTS": "modelport.example.com",
                                         "MODELPORT_VAR_DIR": str(tmp_path), **env})
    keep = {"DATABASES", "INSTALLED_APPS", "PASSWORD_HASHERS", "LOGGING"}  # the test database and app registry
    return {name: value for name, value in vars(module).items()
            if name.isupper() and name not in keep and getattr(settings, name, object()) != value}


def check_errors(*args: str) -> str:
    """`manage.py check` in this process: its report, empty when it passes."""
    try:
        call_command("check", *args, stdout=io.StringIO(), stderr=io.StringIO())
    except SystemCheckError as exc:
        return str(exc)
    return ""


STRONG_METRICS_TOKEN = "m" * 10 + "Xy7#pQ2$wE9!rT4%"


def test_production_refuses_to_start_without_a_secret_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The system check modelport.E100 (portal/checks.py) stops `check` and `migrate`; nothing is written."""
    with override_settings(**production_settings(monkeypatch, tmp_path, METRICS_TOKEN=STRONG_METRICS_TOKEN)):
        report = check_errors()
    assert "(modelport.E100) SECRET_KEY is not set (MODELPORT_ENV=production)." in report
    assert "HINT: Set SECRET_KEY (or SECRET_KEY_FILE)" in report
    assert list(tmp_path.iterdir()) == []


def test_production_passes_check_deploy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    production = production_settings(monkeypatch, tmp_path, SECRET_KEY=STRONG_SECRET_KEY,
                                     METRICS_TOKEN=STRONG_METRICS_TOKEN)
    assert production["SECURE_SSL_REDIRECT"] is True and production["SESSION_COOKIE_SECURE"] is True
    with override_settings(**production):
        try:
            call_command("check", "--deploy", "--fail-level", "WARNING", stdout=io.StringIO(), stderr=io.StringIO())
        except SystemCheckError as exc:
            pytest.fail(str(exc))


def test_production_refuses_to_start_with_an_open_metrics_endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                  db: Any) -> None:
    """`migrate` runs before every start (make run, compose, the Kubernetes init container) and runs the checks."""
    production = production_settings(monkeypatch, tmp_path, SECRET_KEY=STRONG_SECRET_KEY)
    with override_settings(**production):
        assert "modelport.E00" not in check_errors()  # no token: /metrics is closed, which is safe
        with override_settings(METRICS_OPEN=True):
            report = check_errors()
            assert "modelport.E001" in report
            assert "METRICS_OPEN is true without METRICS_TOKEN" in report
            assert "HINT: Set METRICS_TOKEN" in report
            with pytest.raises(SystemCheckError, match="modelport.E001"):
                call_command("migrate", "--noinput", skip_checks=False, stdout=io.StringIO(), stderr=io.StringIO())
        with override_settings(METRICS_TOKEN="secret"):
            assert "modelport.E002" in check_errors()


def test_development_may_open_metrics_and_production_needs_a_token_for_it(settings: Any) -> None:
    settings.PRODUCTION = False
    settings.METRICS_TOKEN = ""
    settings.METRICS_OPEN = True
    assert checks.metrics_token() == []
    settings.PRODUCTION = True
    assert [error.id for error in checks.metrics_token()] == ["modelport.E001"]
    settings.METRICS_OPEN = False
    assert checks.metrics_token() == []
    settings.METRICS_TOKEN = "x" * 32
    assert checks.metrics_token() == []


def test_redis_url_must_be_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"^REDIS_URL must be a redis:// or rediss:// URL$"):
        load_settings(monkeypatch, {"MODELPORT_VAR_DIR": str(tmp_path), "REDIS_URL": "http://127.0.0.1:6379/0"})


def test_the_maximum_token_lifetime_cannot_be_negative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"^API_TOKEN_MAX_LIFETIME_DAYS must be at least 0, got -1$"):
        load_settings(monkeypatch, {"MODELPORT_VAR_DIR": str(tmp_path), "API_TOKEN_MAX_LIFETIME_DAYS": "-1"})
