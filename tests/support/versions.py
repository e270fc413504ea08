"""Ready model versions made through the real upload path."""

from __future__ import annotations

from typing import Any

from models_registry.models import Model, ModelVersion
from tests.artifacts import tiny_onnx
from tests.support.people import Person


def make_ready_version(person: Person, name: str = "digits", data: bytes | None = None, **fields: Any) -> ModelVersion:
    """A ready ONNX version through the real upload path (the inspection runs in-process, or in the live worker of a
    test that has one, whichever claims it first)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from models_registry import actions
    from models_registry.inspection import inspect_here

    model = (Model.objects.filter(team=person.team, name=name).first()
             or Model.objects.create(team=person.team, name=name))
    upload = SimpleUploadedFile("model.onnx", data or tiny_onnx())
    version = actions.create_version_from_file(model, person.user, upload, "model.onnx", **fields)
    version = inspect_here(version.pk)
    assert version.status == "ready", version.error
    return version
