"""Fixtures of the page tests: a runtime env whose frameworks do not depend on this machine's (alice's ready model
and a deployment of it, `digits` and `deployment`, are in the root conftest.py: the tuning tests use them too)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.deploying import fake_runtime_env


@pytest.fixture
def bare_runtime_env(settings: Any, tmp_path: Any) -> Any:
    """A runtime env without the framework extras, so that what a page says does not depend on whether this
    machine's var/runtime-env has torch or TensorFlow (`make test` installs both)."""
    settings.MODELPORT_RUNTIME_ENV = fake_runtime_env(tmp_path / "runtime-env")
    return settings.MODELPORT_RUNTIME_ENV
