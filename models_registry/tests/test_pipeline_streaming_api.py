"""Pipelines with a streaming step through the API (issue 33): the version's JSON says it streams, the 400 names the
step, and placement keeps the shared pools' rule (a streaming step is a python model: a team's own pool or a
dedicated server). Step versions are rows only: nothing here runs them."""

from __future__ import annotations

from typing import Any

import pytest

from deployments.models import Pool
from modelport.core.signature import Tensor
from models_registry.models import Model, ModelVersion
from models_registry.tests.pipeline_versions import create_pipeline
from models_registry.tests.streaming_pipelines import CLEAN, TEXTGEN, VERSIONS, definition, step
from tests.support.people import Person

pytestmark = pytest.mark.django_db


def ready_steps(person: Person, *names: str) -> None:
    """Ready python versions of VERSIONS (rows only: nothing here runs them)."""
    for name in names:
        found = VERSIONS[name]
        registry_model = Model.objects.create(team=person.team, name=name)
        ModelVersion.objects.create(model=registry_model, number=1, format="python", status="ready",
                                    signature=found.signature.to_json(), max_batch_size=8,
                                    decoupled=found.decoupled, sha256="0" * 64)


def test_the_api_shows_a_streaming_pipeline_as_decoupled_and_its_400_names_the_step(alice: Person) -> None:
    ready_steps(alice, "clean", "textgen", "join")
    created = create_pipeline(alice, definition(CLEAN, TEXTGEN), name="story")
    assert created.status_code == 201, created.json()
    assert created.json()["decoupled"] is True
    assert ModelVersion.objects.get(model__name="story").decoupled is True

    join = step("join", {"piece": "text_output", "prompt": "prompt"}, {"joined": "joined"})
    refused = create_pipeline(alice, definition(CLEAN, TEXTGEN, join, outputs=(Tensor("joined", "BYTES", (-1, 1)),)),
                              name="story")
    assert refused.status_code == 400
    (message,) = refused.json()["error"]["fields"]["definition.steps[2].input_map"]
    assert message.startswith("step 3 (join): input(s) 'piece' come from step 2 (textgen), which streams")
    assert ModelVersion.objects.filter(model__name="story").count() == 1


def test_a_streaming_pipeline_goes_to_its_teams_own_pool_or_a_dedicated_server_never_to_one_open_to_all(
        alice: Person) -> None:
    ready_steps(alice, "clean", "textgen")
    assert create_pipeline(alice, definition(CLEAN, TEXTGEN), name="story").status_code == 201

    def deploy(name: str, placement: dict[str, Any]) -> Any:
        return alice.client().post("/api/v1/deployments/", {"name": name, "models": [{"model": "story"}],
                                                            "placement": placement}, format="json")

    refused = deploy("story-shared", {"mode": "shared"})
    assert refused.status_code == 400, refused.json()
    message = " ".join(refused.json()["error"]["fields"]["placement"])
    assert "'textgen' is a python model, which runs code a team uploaded" in message and "'dedicated'" in message
    Pool.objects.create(name="acme-own", memory_budget_bytes=2**30, team=alice.team)
    assert deploy("story-own", {"mode": "shared", "pool": "acme-own"}).status_code == 201
    assert deploy("story", {"mode": "dedicated"}).status_code == 201
