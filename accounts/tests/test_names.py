"""Every pattern that checks a user's input matches the whole input: with re.match and "$", a trailing newline
slipped through ("digits\n" was a valid model name)."""

from __future__ import annotations

import dataclasses

import pytest
from django.core.management import CommandError, call_command

from accounts.models import Team
from deployments.runtimes.kubernetes import manifests
from deployments.spec import validate_served_model
from deployments.tests.manifests import CONFIG, model, target
from deployments.tests.values import model as served_model
from infra.names import name_error
from models_registry.models import Model
from tests.support.people import Person


@pytest.mark.parametrize("name", ["digits\n", "digits\r\n", "\ndigits", "digits\n\n", "a\nb", "digits\x00", "digits "])
def test_a_name_with_a_line_break_or_other_stray_character_is_refused(name: str) -> None:
    assert name_error(name) is not None


@pytest.mark.parametrize("name", ["digits", "a", "a-1", "x" * 63])
def test_good_names_still_pass(name: str) -> None:
    assert name_error(name) is None


def test_the_api_refuses_a_model_name_ending_in_a_newline(alice: Person) -> None:
    response = alice.client().post("/api/v1/models/", {"name": "digits\n"}, format="json")
    assert response.status_code == 400
    assert "not a valid name" in response.json()["error"]["message"]
    assert not Model.objects.exists()


def test_create_api_token_refuses_a_team_name_ending_in_a_newline(db: object) -> None:
    with pytest.raises(CommandError, match="not a valid name"):
        call_command("create_api_token", "--user", "ci", "--team", "acme\n", "--create")
    assert not Team.objects.exists()


@pytest.mark.parametrize("name", ["classifier\n", "classifier\r\n"])
def test_a_served_model_name_ending_in_a_newline_is_refused(name: str) -> None:
    errors = validate_served_model(dataclasses.replace(served_model(), name=name), "local")
    assert "name" in errors


@pytest.mark.parametrize("resources, field", [
    ({"memory": "4Gi\n"}, "resources.memory"),
    ({"cpu": "2\n"}, "resources.cpu"),
    ({"gpu": 1, "gpu_type": "a100\n"}, "resources.gpu_type"),
])
def test_kubernetes_quantities_and_labels_ending_in_a_newline_are_refused(resources: dict[str, object],
                                                                          field: str) -> None:
    errors = manifests.check(target(models=[model()], resources=resources), CONFIG)
    assert field in errors
