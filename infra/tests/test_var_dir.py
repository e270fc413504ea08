"""Settings create nothing when imported; `manage.py ensure_dirs`, the processes at their start and the broker's
channel create what they need (infra/var_dir.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from infra import var_dir

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], var: Path) -> subprocess.CompletedProcess[str]:
    ours = ("DATABASE_URL", "SECRET_KEY", "MODELPORT_", "DJANGO_SETTINGS_MODULE", "CELERY_BROKER_URL")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    env["MODELPORT_VAR_DIR"] = str(var)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_importing_the_settings_creates_nothing(tmp_path: Path) -> None:
    var = tmp_path / "var"
    result = _run(["-c", "import portal.settings as s; print(repr(s.SECRET_KEY), s.STATIC_ROOT)"], var)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "''"  # no key file: empty, reported by the system check modelport.E100
    assert list(tmp_path.iterdir()) == []


def test_manage_py_help_creates_nothing(tmp_path: Path) -> None:
    var = tmp_path / "var"
    result = _run(["manage.py", "help"], var)
    assert result.returncode == 0, result.stderr
    assert "ensure_dirs" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_ensure_dirs_creates_var_and_a_private_secret_key_once(settings: Any, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SECRET_KEY", raising=False)
    settings.PRODUCTION = False
    settings.VAR_DIR = tmp_path / "var"
    settings.STATIC_ROOT = tmp_path / "var" / "staticfiles"
    call_command("ensure_dirs", stdout=open(os.devnull, "w"))  # noqa: SIM115
    key_file = tmp_path / "var" / "secret_key"
    assert settings.STATIC_ROOT.is_dir()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text()
    assert len(key) >= 50
    assert var_dir.ensure_secret_key() is None  # a second run keeps the key: sessions survive a restart
    assert key_file.read_text() == key


def test_ensure_dirs_writes_no_key_in_production_or_when_one_is_set(settings: Any, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    settings.VAR_DIR = tmp_path
    settings.PRODUCTION = True
    monkeypatch.delenv("SECRET_KEY", raising=False)
    assert var_dir.ensure_secret_key() is None
    settings.PRODUCTION = False
    monkeypatch.setenv("SECRET_KEY", "from-the-environment")
    assert var_dir.ensure_secret_key() is None
    assert not (tmp_path / "secret_key").exists()


def test_a_process_does_not_start_without_a_secret_key(settings: Any, tmp_path: Path) -> None:
    settings.VAR_DIR = tmp_path / "var"
    settings.STATIC_ROOT = tmp_path / "var" / "staticfiles"
    settings.SECRET_KEY = ""
    with pytest.raises(ImproperlyConfigured, match=r"SECRET_KEY is not set\. Set SECRET_KEY .*manage.py ensure_dirs"):
        var_dir.prepare_process()
    assert settings.STATIC_ROOT.is_dir()


def test_the_filesystem_broker_creates_its_folders_when_it_opens(tmp_path: Path) -> None:
    from kombu import Connection

    folders = {"data_folder_in": tmp_path / "celery" / "queue", "data_folder_out": tmp_path / "celery" / "queue",
               "processed_folder": tmp_path / "celery" / "processed", "control_folder": tmp_path / "celery" / "control"}
    options = {name: str(path) for name, path in folders.items()}
    with Connection("filesystem://", transport="infra.kombu_filesystem:Transport",
                    transport_options=options) as connection:
        queue = connection.SimpleQueue("probe")
        queue.put({"n": 1})
        assert queue.get(timeout=1).payload == {"n": 1}
        queue.close()
    assert all(path.is_dir() for path in folders.values())
