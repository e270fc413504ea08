"""Fixtures of the page tests: alice's ready model and a deployment of it, created through the real actions (the
reconciler is not run: its on_commit never fires inside a test transaction, so a new deployment stays pending)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from conftest import Person
from deployments import actions
from deployments.api import DeploymentInputSerializer, plan_input
from deployments.models import Deployment
from models_registry.models import ModelVersion


def signed_in(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def deploy(person: Person, name: str = "digits-prod", model: str = "digits", **body: Any) -> Deployment:
    """Created as the API creates it (its input parsed by the API's serializer, then planned)."""
    serializer = DeploymentInputSerializer(data={"name": name, "models": [{"model": model}], **body})
    serializer.is_valid(raise_exception=True)
    return actions.create_deployment(person.team, person.user, name, plan_input(person.team, serializer))


@pytest.fixture
def deployment(alice: Person, digits: ModelVersion) -> Deployment:
    return deploy(alice)


def fake_runtime_env(root: Any, *packages: str) -> Any:
    """A runtime env laid out as pip leaves it: the tritonserver binary, and `packages` ("torch-2.13.0")."""
    site = root / "lib" / "python3.11" / "site-packages"
    (site / "pytriton" / "tritonserver" / "bin").mkdir(parents=True)
    (site / "pytriton" / "tritonserver" / "bin" / "tritonserver").write_text("")
    for package in packages:
        name, _, version = package.partition("-")
        (site / name).mkdir()
        (site / name / "__init__.py").write_text("")
        (site / f"{name}-{version}.dist-info").mkdir()
    return root


@pytest.fixture
def bare_runtime_env(settings: Any, tmp_path: Any) -> Any:
    """A runtime env without the framework extras, so that what a page says does not depend on whether this
    machine's var/runtime-env has torch or TensorFlow (`make test` installs both)."""
    settings.MODELPORT_RUNTIME_ENV = fake_runtime_env(tmp_path / "runtime-env")
    return settings.MODELPORT_RUNTIME_ENV
