from __future__ import annotations

from typing import Any

import pytest

from conftest import Person
from models_registry.models import Model, ModelVersion
from tests.artifacts import tiny_onnx


def make_ready_version(person: Person, name: str = "digits", data: bytes | None = None, **fields: Any) -> ModelVersion:
    """A ready ONNX version through the real upload path (the inspection runs in-process)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from models_registry import actions
    from models_registry.inspection import inspect_version

    model = Model.objects.filter(team=person.team, name=name).first() or Model.objects.create(team=person.team, name=name)
    upload = SimpleUploadedFile("model.onnx", data or tiny_onnx())
    version = actions.create_version_from_file(model, person.user, upload, "model.onnx", **fields)
    inspect_version(version.pk)
    version.refresh_from_db()
    assert version.status == "ready", version.error
    return version


@pytest.fixture
def digits_v1(alice: Person) -> ModelVersion:
    return make_ready_version(alice)
