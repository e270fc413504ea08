"""Deleting a model from its page: team admins only, and only while no deployment serves it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from audit.models import AuditEntry
from deployments.models import Deployment
from models_registry.models import Blob, Model, ModelVersion
from tests.support.people import Person, signed_in

PAGE = "/models/digits/"


def test_a_team_admin_deletes_a_model_and_its_files(alice: Person, digits: ModelVersion,
                                                   django_capture_on_commit_callbacks: Any) -> None:
    client = signed_in(alice)
    assert 'id="model-delete"' in client.get(PAGE).content.decode()
    confirm = client.get(f"{PAGE}delete/")
    assert confirm.status_code == 200
    assert "Its 1 version and their files are removed." in confirm.content.decode()
    blob = Blob.objects.get()
    assert (Path(settings.ARTIFACT_ROOT) / blob.key).exists()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"{PAGE}delete/")
    assert response.status_code == 302 and response["Location"] == "/models/"
    assert not Model.objects.exists() and not ModelVersion.objects.exists()
    assert not Blob.objects.exists() and not (Path(settings.ARTIFACT_ROOT) / blob.key).exists()
    assert AuditEntry.objects.filter(action="model.delete", target="digits").exists()
    assert client.get(PAGE).status_code == 404


def test_an_empty_model_left_by_an_earlier_failed_upload_can_be_deleted(alice: Person) -> None:
    Model.objects.create(team=alice.team, name="notes")
    client = signed_in(alice)
    assert "It has no versions." in client.get("/models/notes/delete/").content.decode()
    assert client.post("/models/notes/delete/").status_code == 302
    assert not Model.objects.exists()


def test_a_team_member_who_is_no_admin_cannot_delete_a_model(bob: Person, digits: ModelVersion) -> None:
    client = signed_in(bob)
    assert 'id="model-delete"' not in client.get(PAGE).content.decode()
    page = client.get(f"{PAGE}delete/")
    assert page.status_code == 403
    assert "Only team admins can delete a model" in page.content.decode()
    assert 'id="delete-form"' not in page.content.decode()
    assert client.post(f"{PAGE}delete/").status_code == 403
    assert Model.objects.filter(name="digits").exists()
    assert bob.client().delete("/api/v1/models/digits/").status_code == 403  # nor through the API
    assert Model.objects.filter(name="digits").exists()


def test_another_team_cannot_see_the_model_to_delete(charlie: Person, digits: ModelVersion) -> None:
    client = signed_in(charlie)
    assert client.get(f"{PAGE}delete/").status_code == 404
    assert client.post(f"{PAGE}delete/").status_code == 404
    assert Model.objects.filter(name="digits").exists()


def test_a_model_that_a_deployment_serves_is_not_deleted(alice: Person, deployment: Deployment) -> None:
    client = signed_in(alice)
    page = client.get(f"{PAGE}delete/")
    assert page.status_code == 200
    assert "Deployment digits-prod serves a version of it" in page.content.decode()
    assert 'id="delete-form"' not in page.content.decode()
    assert client.post(f"{PAGE}delete/").status_code == 409
    assert Model.objects.filter(name="digits").exists()
