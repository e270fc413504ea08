"""Settings read the environment strictly: production refuses weak configuration, bad values fail loudly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from accounts import checks
from portal.env import env_bool, env_int, env_secret

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


def _django_check(env: dict[str, str], *args: str, command: str = "check") -> subprocess.CompletedProcess[str]:
    ours = ("DATABASE_URL", "SECRET_KEY", "MODELPORT_", "DEBUG", "METRICS_TOKEN", "REDIS_URL", "API_TOKEN_")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    return subprocess.run([sys.executable, "manage.py", command, *args], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


STRONG_SECRET_KEY = "k" * 20 + "Zq9#mX2$vL8@pW4!nR6%tY1^bH3&jK5*cF7(" + "q" * 10


def test_production_refuses_to_start_without_a_secret_key(tmp_path: Path) -> None:
    result = _django_check({"MODELPORT_ENV": "production", "ALLOWED_HOSTS": "modelport.example.com",
                            "MODELPORT_VAR_DIR": str(tmp_path)})
    assert result.returncode != 0
    assert "SECRET_KEY (or SECRET_KEY_FILE) must be set" in result.stderr


def test_production_passes_check_deploy(tmp_path: Path) -> None:
    result = _django_check(
        {"MODELPORT_ENV": "production", "ALLOWED_HOSTS": "modelport.example.com", "MODELPORT_VAR_DIR": str(tmp_path),
         "SECRET_KEY": STRONG_SECRET_KEY, "METRICS_TOKEN": "m" * 10 + "Xy7#pQ2$wE9!rT4%"},
        "--deploy", "--fail-level", "WARNING",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_refuses_to_start_with_an_open_metrics_endpoint(tmp_path: Path) -> None:
    """`migrate` runs before every start (make run, compose, the Kubernetes init container) and runs the checks."""
    env = {"MODELPORT_ENV": "production", "ALLOWED_HOSTS": "modelport.example.com", "MODELPORT_VAR_DIR": str(tmp_path),
           "SECRET_KEY": STRONG_SECRET_KEY}
    result = _django_check(env)
    assert result.returncode != 0
    assert "modelport.E001" in result.stderr
    assert "METRICS_TOKEN is not set" in result.stderr
    assert "HINT: Set METRICS_TOKEN" in result.stderr
    weak = _django_check({**env, "METRICS_TOKEN": "secret"})
    assert weak.returncode != 0
    assert "modelport.E002" in weak.stderr
    migrate = _django_check(env, "--noinput", command="migrate")
    assert migrate.returncode != 0
    assert "modelport.E001" in migrate.stderr
    assert not (tmp_path / "modelport.sqlite3").exists() or "Applying" not in migrate.stdout


def test_development_needs_no_metrics_token(settings: Any) -> None:
    settings.PRODUCTION = False
    settings.METRICS_TOKEN = ""
    assert checks.metrics_token() == []
    settings.PRODUCTION = True
    assert [error.id for error in checks.metrics_token()] == ["modelport.E001"]
    settings.METRICS_TOKEN = "x" * 32
    assert checks.metrics_token() == []


def test_redis_url_must_be_redis(tmp_path: Path) -> None:
    result = _django_check({"MODELPORT_VAR_DIR": str(tmp_path), "REDIS_URL": "http://127.0.0.1:6379/0"})
    assert result.returncode != 0
    assert "REDIS_URL must be a redis:// or rediss:// URL" in result.stderr


def test_the_maximum_token_lifetime_cannot_be_negative(tmp_path: Path) -> None:
    result = _django_check({"MODELPORT_VAR_DIR": str(tmp_path), "API_TOKEN_MAX_LIFETIME_DAYS": "-1"})
    assert result.returncode != 0
    assert "API_TOKEN_MAX_LIFETIME_DAYS must be at least 0" in result.stderr
