"""The tuning tests' one deployment: alice's digits-prod, made through the API as a user makes it."""

from __future__ import annotations

import pytest

from conftest import Person
from deployments.models import Deployment
from models_registry.models import ModelVersion


@pytest.fixture
def deployment(alice: Person, digits: ModelVersion) -> Deployment:
    response = alice.client().post("/api/v1/deployments/", {"name": "digits-prod", "models": [{"model": "digits"}]},
                                   format="json")
    assert response.status_code == 201, response.json()
    return Deployment.objects.get(name="digits-prod")
