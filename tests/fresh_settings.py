"""portal/settings.py imported afresh under another environment, in this process: importing it has no side effects
(it creates and writes nothing), so tests of what an environment gives need no subprocess (each cost a second or
more of Django start-up)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

SETTINGS = Path(__file__).resolve().parent.parent / "portal" / "settings.py"


def load_settings(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                  clear: tuple[str, ...] = ("DEBUG", "MODELPORT_", "SECRET_KEY", "METRICS_", "ALLOWED_HOSTS",
                                            "SECURE_")) -> ModuleType:
    """The settings module as a process started with the test run's environment, less the variables starting with
    `clear`, plus `env`. The environment is restored when the test ends (monkeypatch)."""
    for name in list(os.environ):
        if name.startswith(clear):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("fresh_settings", SETTINGS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
