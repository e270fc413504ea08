from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken, Membership, Team, hash_token
from conftest import Person


def test_a_token_is_stored_hashed_with_only_a_prefix_in_clear(alice: Person) -> None:
    token = ApiToken.objects.get(user=alice.user)
    assert alice.token not in (token.digest, token.prefix)
    assert token.digest == hash_token(alice.token)
    assert alice.token.startswith(f"mp_{token.prefix}_")


def test_the_api_accepts_a_bearer_token(alice: Person) -> None:
    response = alice.client().get("/api/v1/me/")
    assert response.status_code == 200
    assert response.json()["username"] == "alice"
    assert response.json()["team"] == "acme"
    assert ApiToken.objects.get(user=alice.user).last_used_at is not None


def test_it_answers_401_without_a_token(db: object) -> None:
    response = APIClient().get("/api/v1/models/")
    assert response.status_code == 401
    assert "Bearer" in response.json()["error"]["message"]


def test_it_answers_401_for_a_bad_token(alice: Person) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer mp_nope_nope")
    response = client.get("/api/v1/models/")
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "The API token is invalid, expired or revoked."


def test_a_revoked_token_stops_working(alice: Person) -> None:
    ApiToken.objects.get(user=alice.user).revoke()
    assert alice.client().get("/api/v1/models/").status_code == 401


def test_an_expired_token_stops_working(alice: Person) -> None:
    ApiToken.objects.filter(user=alice.user).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert alice.client().get("/api/v1/models/").status_code == 401


def test_a_token_stops_working_when_its_user_leaves_the_team(alice: Person) -> None:
    Membership.objects.filter(user=alice.user).delete()
    assert alice.client().get("/api/v1/models/").status_code == 401


def test_a_disabled_user_cannot_use_their_token(alice: Person) -> None:
    alice.user.is_active = False
    alice.user.save()
    assert alice.client().get("/api/v1/models/").status_code == 401


def test_users_create_list_and_revoke_their_tokens(alice: Person) -> None:
    client = alice.client()
    created = client.post("/api/v1/tokens/", {"name": "ci", "expires_in_days": 30}, format="json")
    assert created.status_code == 201
    raw = created.json()["token"]
    assert raw.startswith("mp_")
    listed = client.get("/api/v1/tokens/").json()
    assert {t["name"] for t in listed} == {"test", "ci"}
    assert all("token" not in t and "digest" not in t for t in listed)
    assert client.delete(f"/api/v1/tokens/{created.json()['id']}/").status_code == 204
    revoked = APIClient()
    revoked.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert revoked.get("/api/v1/me/").status_code == 401


def test_nobody_revokes_another_users_token(alice: Person, bob: Person) -> None:
    bobs = ApiToken.objects.get(user=bob.user)
    assert alice.client().delete(f"/api/v1/tokens/{bobs.id}/").status_code == 404
    assert ApiToken.objects.get(pk=bobs.pk).revoked_at is None


def test_create_api_token_creates_user_and_team_with_create(db: object) -> None:
    out = StringIO()
    call_command("create_api_token", "--user", "ci-bot", "--team", "ml-team", "--create", stdout=out)
    raw = out.getvalue().strip()
    token = ApiToken.objects.get(digest=hash_token(raw))
    assert token.user.username == "ci-bot"
    assert token.team == Team.objects.get(name="ml-team")


def test_create_api_token_refuses_unknown_users_without_create(db: object) -> None:
    with pytest.raises(CommandError, match="No user 'ghost'"):
        call_command("create_api_token", "--user", "ghost", "--team", "acme")


def test_create_api_token_refuses_a_bad_team_name(db: object) -> None:
    with pytest.raises(CommandError, match="not a valid name"):
        call_command("create_api_token", "--user", "x", "--team", "Bad_Name", "--create")


def test_ensure_admin_prints_a_generated_password_once(db: object) -> None:
    first, second = StringIO(), StringIO()
    call_command("ensure_admin", stdout=first)
    call_command("ensure_admin", stdout=second)
    assert "password:" in first.getvalue()
    password = first.getvalue().split("password:")[1].split()[0]
    assert len(password) >= 12
    assert "password" not in second.getvalue().split("\n")[0].lower() or "exists already" in second.getvalue()
