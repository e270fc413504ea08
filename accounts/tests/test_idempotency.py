from __future__ import annotations

import importlib
import json
import uuid

from rest_framework.test import APIClient

from accounts.models import ApiToken, IdempotencyRecord
from models_registry.models import Model
from tests.support.people import Person


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


def test_a_retried_token_creation_names_the_token_but_no_record_keeps_its_value(alice: Person) -> None:
    client = APIClient()
    client.force_login(alice.user)
    key = str(uuid.uuid4())
    first = client.post("/api/v1/tokens/", {"name": "ci"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201
    raw = first.json()["token"]
    record = IdempotencyRecord.objects.get(key=key)
    assert raw not in json.dumps(record.response_body)
    assert raw.split("_", 2)[2] not in json.dumps(record.response_body)
    again = client.post("/api/v1/tokens/", {"name": "ci"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert again.status_code == 409
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["error"]["code"] == "token_already_created"
    assert f"id {first.json()['id']}" in again.json()["error"]["message"]
    assert raw not in again.content.decode()
    assert ApiToken.objects.filter(name="ci").count() == 1


def test_the_upgrade_forgets_raw_tokens_kept_by_earlier_versions(alice: Person) -> None:
    """Migration 0004 on rows as the previous version wrote them: a token creation's whole 201 body in its
    idempotency record, and the token itself in the session until the tokens page showed it."""
    from django.apps import apps
    from django.contrib.sessions.backends.db import SessionStore

    migration = importlib.import_module("accounts.migrations.0004_forget_stored_raw_tokens")
    kept = IdempotencyRecord.objects.create(user=alice.user, key="a", request_hash="h", status_code=201,
                                            response_body={"id": 1, "token": "mp_abcd_secret"})
    other = IdempotencyRecord.objects.create(user=alice.user, key="b", request_hash="h", status_code=201,
                                             response_body={"name": "digits"})
    session = SessionStore()
    session["web_new_token"] = {"id": 1, "raw": "mp_abcd_secret"}
    session["team_id"] = alice.team.pk
    session.create()

    migration.forget_raw_tokens(apps, None)

    assert not IdempotencyRecord.objects.filter(pk=kept.pk).exists()
    assert IdempotencyRecord.objects.filter(pk=other.pk).exists()
    data = SessionStore(session_key=session.session_key).load()
    assert "web_new_token" not in data
    assert data["team_id"] == alice.team.pk  # the rest of the session is kept
