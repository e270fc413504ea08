"""Deploying through the API against a real Triton and waiting for it, shared by the end-to-end tests (a fixture module:
nothing here is collected)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.files.uploadedfile import SimpleUploadedFile

from deployments.models import Deployment, TritonServer
from models_registry.models import ModelVersion
from tests.processes import wait_for
from tests.support.people import Person


def push(person: Person, path: Path, name: str = "digits") -> ModelVersion:
    client = person.client()
    client.post("/api/v1/models/", {"name": name}, format="json")
    response = client.post(f"/api/v1/models/{name}/versions/",
                           {"file": SimpleUploadedFile(path.name, path.read_bytes())},
                           format="multipart")
    assert response.status_code == 201, response.json()
    number = response.json()["number"]
    wait_for(lambda: client.get(f"/api/v1/models/{name}/versions/{number}/").json()["status"] != "validating",
             30, what="the worker to inspect the upload")
    return ModelVersion.objects.get(model__name=name, number=number)


def deploy(person: Person, name: str, models: list[dict[str, Any]]) -> None:
    response = person.client().post("/api/v1/deployments/", {"name": name, "models": models}, format="json")
    assert response.status_code == 201, response.json()


def status_of(person: Person, name: str) -> dict[str, Any]:
    return person.client().get(f"/api/v1/deployments/{name}/").json()


def wait_status(person: Person, name: str, wanted: str, timeout: float = 90) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        body = status_of(person, name)
        if body["status"] == "failed" and wanted != "failed":
            raise AssertionError(f"deployment failed: {body['status_message']}")
        return body if body["status"] == wanted else None

    return wait_for(reached, timeout, what=f"{name} to be {wanted}")  # type: ignore[no-any-return]


def serving(name: str) -> TritonServer:
    deployment = Deployment.objects.get(name=name)
    return TritonServer.objects.get(revision=deployment.serving_revision, state=TritonServer.State.READY)
