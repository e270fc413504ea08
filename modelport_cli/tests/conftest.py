"""The CLI's fixtures: `portal`, the fake portal of fake_portal.py with the CLI pointed at it and its waits cut."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from modelport_cli import client as client_module
from modelport_cli import main as main_module
from modelport_cli import tus
from modelport_cli.tests.fake_portal import TOKEN, FakePortal


@pytest.fixture
def portal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakePortal]:
    monkeypatch.setenv("MODELPORT_TOKEN", TOKEN)
    monkeypatch.setenv("MODELPORT_CACHE_DIR", str(tmp_path / "cache"))
    # No waiting in the fast suite: retries and polls go round at once.
    monkeypatch.setattr(tus, "RETRY_DELAYS", (0.0,) * 6)
    monkeypatch.setattr(client_module, "RETRY_DELAYS", (0.0,) * 3)
    monkeypatch.setattr(main_module, "FIRST_POLL_INTERVAL", 0.01)
    monkeypatch.setattr(main_module, "MAX_POLL_INTERVAL", 0.01)
    with FakePortal() as fake:
        monkeypatch.setenv("MODELPORT_URL", fake.url)
        yield fake
