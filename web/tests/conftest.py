"""Fixtures of the page tests: alice's ready model and a deployment of it, created through the real actions (the
reconciler is not run: its on_commit never fires inside a test transaction, so a new deployment stays pending)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from conftest import Person
from deployments import actions
from deployments.api import DeploymentInputSerializer
from deployments.models import Deployment
from deployments.tests.conftest import make_ready_version
from models_registry.models import ModelVersion


def signed_in(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


@pytest.fixture
def digits(alice: Person) -> ModelVersion:
    return make_ready_version(alice, "digits")


def deploy(person: Person, name: str = "digits-prod", model: str = "digits", **body: Any) -> Deployment:
    serializer = DeploymentInputSerializer(data={"name": name, "models": [{"model": model}], **body},
                                           context={"team": person.team})
    serializer.is_valid(raise_exception=True)
    data = serializer.validated_data
    return actions.create_deployment(person.team, person.user, name, data["runtime"], data["spec"], data["versions"])


@pytest.fixture
def deployment(alice: Person, digits: ModelVersion) -> Deployment:
    return deploy(alice)
