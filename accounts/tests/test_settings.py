"""Settings read the environment strictly: production refuses weak configuration, bad values fail loudly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

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


def _django_check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "SECRET_KEY", "MODELPORT_", "DEBUG"))}
    return subprocess.run([sys.executable, "manage.py", "check", *args], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


def test_production_refuses_to_start_without_a_secret_key(tmp_path: Path) -> None:
    result = _django_check({"MODELPORT_ENV": "production", "ALLOWED_HOSTS": "modelport.example.com",
                            "MODELPORT_VAR_DIR": str(tmp_path)})
    assert result.returncode != 0
    assert "SECRET_KEY (or SECRET_KEY_FILE) must be set" in result.stderr


def test_production_passes_check_deploy(tmp_path: Path) -> None:
    result = _django_check(
        {"MODELPORT_ENV": "production", "ALLOWED_HOSTS": "modelport.example.com", "MODELPORT_VAR_DIR": str(tmp_path),
         "SECRET_KEY": "k" * 20 + "Zq9#mX2$vL8@pW4!nR6%tY1^bH3&jK5*cF7(" + "q" * 10},
        "--deploy", "--fail-level", "WARNING",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
