from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient

from audit.models import AuditEntry
from models_registry.models import ModelVersion
from tests.support.people import Person


def test_api_actions_are_written_to_the_audit_log(alice: Person, digits: ModelVersion) -> None:
    client = alice.client()
    client.post("/api/v1/deployments/", {"name": "digits-prod", "models": [{"model": "digits"}]}, format="json")
    client.patch("/api/v1/deployments/digits-prod/", {"resources": {"cpu": "2"}}, format="json")  # a real change
    client.post("/api/v1/deployments/digits-prod/stop")
    client.post("/api/v1/deployments/digits-prod/start")
    actions = list(AuditEntry.objects.order_by("id").values_list("action", "target", "username"))
    assert actions == [
        ("model_version.create", "digits:1", "alice"),
        ("deployment.create", "digits-prod", "alice"),
        ("deployment.update", "digits-prod", "alice"),
        ("deployment.stop", "digits-prod", "alice"),
        ("deployment.start", "digits-prod", "alice"),
    ]
    assert all(entry.team == alice.team for entry in AuditEntry.objects.all())


def test_team_admins_read_their_teams_log(alice: Person, bob: Person, charlie: Person, digits: ModelVersion) -> None:
    charlie.client().post("/api/v1/models/", {"name": "secret"}, format="json")
    response = alice.client().get("/api/v1/audit/")
    assert response.status_code == 200
    assert [e["action"] for e in response.json()] == ["model_version.create"]  # not charlie's model.create
    assert alice.client().get("/api/v1/audit/?action=model.create").json() == []


def test_members_who_are_not_admins_cannot_read_the_log(bob: Person) -> None:
    response = bob.client().get("/api/v1/audit/")
    assert response.status_code == 403
    assert response.json()["error"]["message"] == "Only team admins can do this."


def test_token_creation_and_revocation_are_audited(alice: Person) -> None:
    client = APIClient()
    client.force_login(alice.user)  # token management is for people (or tokens with the "tokens" scope)
    created = client.post("/api/v1/tokens/", {"name": "ci"}, format="json").json()
    client.delete(f"/api/v1/tokens/{created['id']}/")
    assert list(AuditEntry.objects.order_by("id").values_list("action", flat=True)) == ["token.create", "token.revoke"]


def test_a_rejected_change_leaves_no_audit_entry(alice: Person, digits: ModelVersion, settings: Any) -> None:
    response = alice.client().post("/api/v1/deployments/", {"name": "Bad_Name", "models": [{"model": "digits"}]},
                                   format="json")
    assert response.status_code == 400
    assert not AuditEntry.objects.filter(action="deployment.create").exists()
