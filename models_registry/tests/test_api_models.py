from __future__ import annotations

import re

from models_registry.models import Model
from tests.support.people import Person


def test_alice_creates_a_model_in_her_team(alice: Person) -> None:
    response = alice.client().post("/api/v1/models/", {"name": "digits", "description": "8x8 digits"}, format="json")
    assert response.status_code == 201
    assert response.json()["name"] == "digits"
    model = Model.objects.get(name="digits")
    assert model.team == alice.team
    assert model.created_by == alice.user


def test_bob_sees_his_teammates_models(alice: Person, bob: Person) -> None:
    alice.client().post("/api/v1/models/", {"name": "digits"}, format="json")
    assert [m["name"] for m in bob.client().get("/api/v1/models/").json()] == ["digits"]
    assert bob.client().get("/api/v1/models/digits/").status_code == 200


def test_charlie_sees_nothing_of_another_team(alice: Person, charlie: Person) -> None:
    alice.client().post("/api/v1/models/", {"name": "digits"}, format="json")
    client = charlie.client()
    assert client.get("/api/v1/models/").json() == []
    for method in ("get", "patch", "delete"):
        response = getattr(client, method)("/api/v1/models/digits/", {"description": "x"}, format="json")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    assert client.get("/api/v1/models/digits/versions/").status_code == 404
    assert Model.objects.get(name="digits").description == ""


def test_two_teams_may_use_the_same_model_name(alice: Person, charlie: Person) -> None:
    assert alice.client().post("/api/v1/models/", {"name": "digits"}, format="json").status_code == 201
    assert charlie.client().post("/api/v1/models/", {"name": "digits"}, format="json").status_code == 201


def test_it_rejects_a_duplicate_name_with_409(alice: Person) -> None:
    alice.client().post("/api/v1/models/", {"name": "digits"}, format="json")
    response = alice.client().post("/api/v1/models/", {"name": "digits"}, format="json")
    assert response.status_code == 409
    assert "exists already" in response.json()["error"]["message"]


def test_it_rejects_bad_names_and_says_what_is_allowed(alice: Person) -> None:
    for bad in ["Digits", "my_model", "-digits", "digits-", "a" * 64, "", "../etc", "dígits"]:
        response = alice.client().post("/api/v1/models/", {"name": bad}, format="json")
        assert response.status_code == 400, bad
        body = response.json()["error"]
        assert body["code"] == "invalid"
        assert "lowercase letters a-z, digits and hyphens" in body["fields"]["name"][0]
    assert Model.objects.count() == 0


def test_patch_changes_the_description_only(alice: Person) -> None:
    alice.client().post("/api/v1/models/", {"name": "digits"}, format="json")
    response = alice.client().patch("/api/v1/models/digits/", {"description": "new"}, format="json")
    assert response.status_code == 200
    assert Model.objects.get().description == "new"
    response = alice.client().patch("/api/v1/models/digits/", {"name": "renamed"}, format="json")
    assert response.status_code == 400
    assert Model.objects.get().name == "digits"


def test_delete_removes_the_model(alice: Person) -> None:
    alice.client().post("/api/v1/models/", {"name": "digits"}, format="json")
    assert alice.client().delete("/api/v1/models/digits/").status_code == 204
    assert not Model.objects.exists()


def test_the_openapi_schema_and_docs_are_served(alice: Person) -> None:
    client = alice.client()
    schema = client.get("/api/v1/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/models/" in schema.content
    docs = client.get("/api/v1/docs/")
    assert docs.status_code == 200
    # Air-gapped sites: every script and stylesheet comes from the portal itself (a nonce may contain "cdn").
    assert not re.search(rb"""(src|href)\s*=\s*["']?(https?:)?//""", docs.content)
    assert b"/static/" in docs.content


def test_it_refuses_names_the_portal_reserves(alice: Person) -> None:
    response = alice.client().post("/api/v1/models/", {"name": "upload"}, format="json")
    assert response.status_code == 400
    assert "reserved" in response.json()["error"]["fields"]["name"][0]
