"""Ready model versions and pipelines the registry's, the deployments' and the pages' tests build on (a fixture module:
nothing here is collected)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from django.core.files.uploadedfile import SimpleUploadedFile

from modelport.core.signature import Signature, parse_signature
from models_registry import actions
from models_registry.inspection import inspect_here
from models_registry.models import Model, ModelVersion
from models_registry.samples import (
    POSTPROCESS_SIGNATURE,
    PREPROCESS_SIGNATURE,
    build_digits_onnx,
    build_postprocess_zip,
    build_preprocess_zip,
)
from tests.support.people import Person


@lru_cache(maxsize=1)
def digits_bytes() -> bytes:
    return build_digits_onnx().SerializeToString()


def ready_version(person: Person, name: str, data: bytes, filename: str,
                  signature: Signature | dict[str, Any] | None = None,
                  **options: Any) -> ModelVersion:
    """A version through the real upload path, inspected in-process."""
    model = Model.objects.filter(team=person.team, name=name).first() or Model.objects.create(team=person.team,
                                                                                              name=name)
    sig = parse_signature(signature) if isinstance(signature, dict) else signature
    version = actions.create_version_from_file(model, person.user, SimpleUploadedFile(filename, data), filename,
                                               signature=sig, **options)
    version = inspect_here(version.pk)
    assert version.status == "ready", version.error
    return version


def digits_steps(person: Person, **digits_options: Any) -> dict[str, ModelVersion]:
    """preprocess, digits and postprocess version 1: the sample pipeline's steps."""
    return {
        "preprocess": ready_version(person, "preprocess", build_preprocess_zip(), "preprocess.zip",
                                    PREPROCESS_SIGNATURE),
        "digits": ready_version(person, "digits", digits_bytes(), "digits.onnx", **digits_options),
        "postprocess": ready_version(person, "postprocess", build_postprocess_zip(), "postprocess.zip",
                                     POSTPROCESS_SIGNATURE),
    }


def create_pipeline(person: Person, definition: Any, name: str = "digits-pipeline", **body: Any) -> Any:
    client = person.client()
    if not Model.objects.filter(team=person.team, name=name).exists():
        client.post("/api/v1/models/", {"name": name}, format="json")
    return client.post(f"/api/v1/models/{name}/versions/", {"format": "ensemble", "definition": definition, **body},
                       format="json")
