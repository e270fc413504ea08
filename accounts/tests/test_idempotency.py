from __future__ import annotations

import uuid

from conftest import Person
from models_registry.models import Model


def test_a_retried_create_with_the_same_key_creates_once_and_replays_the_response(alice: Person) -> None:
    key = str(uuid.uuid4())
    first = alice.client().post("/api/v1/models/", {"name": "digits"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    again = alice.client().post("/api/v1/models/", {"name": "digits"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert Model.objects.count() == 1


def test_the_same_key_for_a_different_request_is_refused(alice: Person) -> None:
    key = str(uuid.uuid4())
    alice.client().post("/api/v1/models/", {"name": "digits"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    response = alice.client().post("/api/v1/models/", {"name": "other"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 422
    assert "different request" in response.json()["error"]["message"]
    assert not Model.objects.filter(name="other").exists()


def test_keys_are_per_user(alice: Person, bob: Person) -> None:
    key = str(uuid.uuid4())
    alice.client().post("/api/v1/models/", {"name": "digits"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    response = bob.client().post("/api/v1/models/", {"name": "other"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 201


def test_a_failed_request_can_be_retried_with_its_key(alice: Person) -> None:
    key = str(uuid.uuid4())
    bad = alice.client().post("/api/v1/models/", {"name": "Bad"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert bad.status_code == 400
    replay = alice.client().post("/api/v1/models/", {"name": "Bad"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert replay.status_code == 400  # a 4xx is an answer too, replayed as such
    assert replay.json() == bad.json()
