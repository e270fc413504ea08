"""Shared fixtures: a tmp artifact store per test, fast password hashing, and the three users of every access test:
alice (owner, team admin of "acme"), bob (member of "acme"), charlie (another team, "globex": must see nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

# tests/markers.py: a test that starts Triton, a worker or a browser without its marker fails, naming the marker.
pytest_plugins = ["tests.markers", "pytester"]


def pytest_configure(config: pytest.Config) -> None:
    """The run's var/ (portal/test_settings.py) exists before pytest-django creates the test database in it: settings
    create nothing at import (portal/var_dir.py)."""
    from portal.var_dir import ensure_dirs

    ensure_dirs()


@pytest.fixture(autouse=True, scope="session")
def _remove_the_runs_var_dir() -> Iterator[None]:
    yield
    import shutil

    from django.conf import settings

    if "/var/test/run-" in str(settings.VAR_DIR):
        shutil.rmtree(settings.VAR_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fast_and_isolated(settings: Any, tmp_path: Path) -> Iterator[None]:
    from models_registry.storage import get_store

    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    settings.CELERY_TASK_ALWAYS_EAGER = False
    get_store.cache_clear()
    yield
    get_store.cache_clear()


@dataclass
class Person:
    user: Any
    team: Any
    token: str

    def client(self) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token}")
        return client


def make_person(username: str, team_name: str, role: str = "member") -> Person:
    from django.contrib.auth import get_user_model

    from accounts.models import ApiToken, Membership, Team

    user = get_user_model().objects.create_user(username=username, password="password")
    team, _ = Team.objects.get_or_create(name=team_name)
    Membership.objects.create(user=user, team=team, role=role)
    _, raw = ApiToken.issue(user, team, name="test")
    return Person(user=user, team=team, token=raw)


@pytest.fixture
def alice(db: Any) -> Person:
    return make_person("alice", "acme", role="admin")


@pytest.fixture
def bob(alice: Person) -> Person:
    return make_person("bob", "acme")


@pytest.fixture
def charlie(db: Any) -> Person:
    return make_person("charlie", "globex", role="admin")


@pytest.fixture
def eager_tasks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run Celery tasks in-process right away (the test's transaction never commits, so on_commit callbacks run
    at once). The real worker process is tested in tests/test_worker_e2e.py."""
    from django.db import transaction

    from portal.celery import app

    monkeypatch.setattr(transaction, "on_commit", lambda func, using=None, robust=False: func())
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    try:
        yield
    finally:
        app.conf.task_always_eager = False


@pytest.fixture(autouse=True)
def _fresh_sign_in_counters(settings: Any) -> Iterator[None]:
    """Each test starts with no failed sign-ins counted, in this process's memory rather than a Redis that CI's
    broker URL would otherwise share between tests (accounts/tests/test_signin.py tests Redis explicitly)."""
    from accounts import signin

    settings.REDIS_URL = ""
    signin.reset_counters()
    yield
    signin.reset_counters()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `frameworks("torch", ...)` needs those frameworks in the runtime env (default: both). Without
    them it is skipped with the command that adds them; in CI (`make test` installs them) it fails instead, so a
    broken install cannot pass as a skip."""
    marker = item.get_closest_marker("frameworks")
    if marker is None:
        return
    import os

    from django.conf import settings

    from deployments import frameworks
    from deployments.runtimes.local import triton as local_triton

    wanted = list(marker.args) or [f.name for f in frameworks.FRAMEWORKS]
    try:
        installed = frameworks.detect(local_triton.find_runtime_env(settings.MODELPORT_RUNTIME_ENV).site_packages)
    except local_triton.RuntimeEnvError:
        installed = {}
    missing = [name for name in wanted if name not in installed]
    if missing:
        message = (f"the runtime env ({settings.MODELPORT_RUNTIME_ENV}) lacks {', '.join(missing)}: "
                   f"`make runtime-env RUNTIME_EXTRAS={','.join(missing)}`")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
