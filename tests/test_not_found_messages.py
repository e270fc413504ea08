"""404s of the API name what was not found and in which team: a token acts for the one team it was made in, and a
user who made the CI token in another team than the UI's must read why their deployment "does not exist"."""

from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient

from models_registry.models import Model
from tests.support.people import Person
from tests.support.versions import make_ready_version


def message(response: Any) -> str:
    assert response.status_code == 404, response.content
    body = response.json()
    assert body["error"]["code"] == "not_found"
    return str(body["error"]["message"])


def test_an_unknown_deployment_names_itself_and_the_team_the_token_acts_for(alice: Person) -> None:
    text = message(alice.client().get("/api/v1/deployments/digits/"))

    assert text == ("There is no deployment named 'digits' in team 'acme', the team this request acts for. "
                    "GET /api/v1/deployments/ lists the team's deployments.")


def test_another_teams_deployment_reads_exactly_like_a_missing_one(alice: Person, charlie: Person) -> None:
    make_ready_version(alice, "digits")
    assert alice.client().post("/api/v1/deployments/", {"name": "digits-prod", "models": [{"model": "digits"}]},
                               format="json").status_code == 201

    theirs = message(charlie.client().get("/api/v1/deployments/digits-prod/"))
    missing = message(charlie.client().get("/api/v1/deployments/digits-dev/"))

    assert theirs == missing.replace("digits-dev", "digits-prod")
    assert "'globex'" in theirs and "acme" not in theirs
    for action in ("stop", "start", "promote", "rollback", "logs/", "events/"):
        method = "get" if action.endswith("/") else "post"
        response = getattr(charlie.client(), method)(f"/api/v1/deployments/digits-prod/{action}")
        assert message(response) == theirs


def test_an_unknown_model_says_how_to_create_it_with_its_version(alice: Person) -> None:
    assert "GET /api/v1/models/ lists" in message(alice.client().get("/api/v1/models/digits/"))
    text = message(alice.client().post("/api/v1/models/digits/versions/", {"upload_id": "x"}, format="json"))
    assert text.startswith("There is no model named 'digits' in team 'acme'")
    assert '"create_model": true' in text


def test_an_unknown_version_lists_the_versions_the_model_has(alice: Person) -> None:
    for _ in range(3):
        make_ready_version(alice, "digits")
    assert Model.objects.get().versions.count() == 3

    text = message(alice.client().get("/api/v1/models/digits/versions/9/"))

    assert text == "Model 'digits' of team 'acme' has no version 9: its versions are 1-3."
    assert message(alice.client().get("/api/v1/models/text/versions/1/")).startswith(
        "There is no model named 'text' in team 'acme'")


def test_an_unknown_tune_and_token_say_where_to_list_them(alice: Person) -> None:
    make_ready_version(alice, "digits")
    alice.client().post("/api/v1/deployments/", {"name": "digits-prod", "models": [{"model": "digits"}]}, format="json")

    assert message(alice.client().get("/api/v1/deployments/digits-prod/tunes/7/")) == (
        "Deployment 'digits-prod' has no tune 7: GET /api/v1/deployments/digits-prod/tunes/ lists its tunes.")
    session = APIClient()
    session.force_login(alice.user)
    assert "GET /api/v1/tokens/ lists them" in message(session.delete("/api/v1/tokens/999/"))
