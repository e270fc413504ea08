"""The registry's tests' fixtures."""

from __future__ import annotations

import pytest

from models_registry.models import Model
from models_registry.sample_models import textgen
from tests.support.people import Person


@pytest.fixture
def digits_model(alice: Person) -> Model:
    """alice's model "digits" with no versions yet (`digits`, in the root conftest.py, is a ready version)."""
    return Model.objects.create(team=alice.team, name="digits", created_by=alice.user)


@pytest.fixture(scope="module")
def textgen_model() -> textgen.CharModel:
    """The sample text generator trained as `make samples` trains it (half a second), once per test module."""
    from models_registry.samples import train_textgen

    return textgen.CharModel(textgen.load_counts(train_textgen().weights))
