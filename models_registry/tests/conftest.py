"""The registry's tests' fixtures."""

from __future__ import annotations

import pytest

from models_registry.models import Model
from tests.support.people import Person


@pytest.fixture
def digits_model(alice: Person) -> Model:
    """alice's model "digits" with no versions yet (`digits`, in the root conftest.py, is a ready version)."""
    return Model.objects.create(team=alice.team, name="digits", created_by=alice.user)
