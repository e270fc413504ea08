from __future__ import annotations

from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from accounts import actions
from accounts.models import ApiToken, Membership, Team, hash_token
from audit.models import AuditEntry
from tests.support.people import Person


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
    actions.revoke_token(ApiToken.objects.get(user=alice.user), by=alice.user, via="session")
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


def scoped(person: Person, *scopes: str) -> APIClient:
    """A client with a new token of `person` in their team, created with `scopes`."""
    _, raw = ApiToken.issue(person.user, person.team, name="manager", scopes=scopes)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_users_create_list_and_revoke_their_tokens(alice: Person) -> None:
    client = scoped(alice, "tokens")
    created = client.post("/api/v1/tokens/", {"name": "ci", "expires_in_days": 30}, format="json")
    assert created.status_code == 201
    assert created["Cache-Control"] == "no-store"
    raw = created.json()["token"]
    assert raw.startswith("mp_")
    assert created.json()["scopes"] == []
    listed = client.get("/api/v1/tokens/").json()
    assert {t["name"] for t in listed} == {"test", "manager", "ci"}
    assert all("token" not in t and "digest" not in t for t in listed)
    assert client.delete(f"/api/v1/tokens/{created.json()['id']}/").status_code == 204
    revoked = APIClient()
    revoked.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert revoked.get("/api/v1/me/").status_code == 401


def test_a_token_without_the_tokens_scope_cannot_list_create_or_revoke_tokens(alice: Person) -> None:
    client = alice.client()  # a plain token: the normal API only
    other, _ = ApiToken.issue(alice.user, alice.team, name="other")
    listed = client.get("/api/v1/tokens/")
    created = client.post("/api/v1/tokens/", {"name": "minted"}, format="json")
    revoked = client.delete(f"/api/v1/tokens/{other.pk}/")
    assert listed.status_code == created.status_code == revoked.status_code == 403
    assert "'tokens' scope" in created.json()["error"]["message"]
    assert not ApiToken.objects.filter(name="minted").exists()
    other.refresh_from_db()
    assert other.revoked_at is None
    assert client.get("/api/v1/models/").status_code == 200  # the normal API still works


def test_a_token_cannot_grant_itself_a_scope_by_minting(alice: Person) -> None:
    """The plain token is refused before the request body is even read, whatever scopes it asks for."""
    response = alice.client().post("/api/v1/tokens/", {"scopes": ["tokens"]}, format="json")
    assert response.status_code == 403
    assert ApiToken.objects.filter(user=alice.user).count() == 1


def test_a_scoped_token_manages_only_its_users_tokens_in_its_own_team(alice: Person, charlie: Person) -> None:
    Membership.objects.create(user=alice.user, team=charlie.team)  # alice is in acme and globex
    in_globex, _ = ApiToken.issue(alice.user, charlie.team, name="globex-ci")
    client = scoped(alice, "tokens")  # acme
    assert {t["team"] for t in client.get("/api/v1/tokens/").json()} == {"acme"}
    assert client.delete(f"/api/v1/tokens/{in_globex.pk}/").status_code == 404
    charlies = ApiToken.objects.get(user=charlie.user)
    assert client.delete(f"/api/v1/tokens/{charlies.pk}/").status_code == 404
    in_globex.refresh_from_db()
    charlies.refresh_from_db()
    assert in_globex.revoked_at is None and charlies.revoked_at is None
    created = client.post("/api/v1/tokens/", {"name": "next"}, format="json").json()
    assert created["team"] == "acme"


def test_a_scoped_token_cannot_see_or_revoke_a_teammates_tokens(alice: Person, bob: Person) -> None:
    bobs = ApiToken.objects.get(user=bob.user)
    client = scoped(alice, "tokens")
    assert bobs.prefix not in {t["prefix"] for t in client.get("/api/v1/tokens/").json()}
    assert client.delete(f"/api/v1/tokens/{bobs.pk}/").status_code == 404
    assert ApiToken.objects.get(pk=bobs.pk).revoked_at is None


def test_a_browser_session_manages_tokens_in_every_team_of_its_user(alice: Person, charlie: Person) -> None:
    Membership.objects.create(user=alice.user, team=charlie.team)
    in_globex, _ = ApiToken.issue(alice.user, charlie.team, name="globex-ci")
    client = APIClient()
    client.force_login(alice.user)
    assert {t["team"] for t in client.get("/api/v1/tokens/").json()} == {"acme", "globex"}
    created = client.post("/api/v1/tokens/", {"name": "deployer", "scopes": ["tokens"]}, format="json")
    assert created.status_code == 201
    assert created.json()["scopes"] == ["tokens"]
    assert client.delete(f"/api/v1/tokens/{in_globex.pk}/").status_code == 204


def test_token_creation_is_audited_with_its_scopes_and_how(alice: Person) -> None:
    manager = scoped(alice, "tokens")
    created = manager.post("/api/v1/tokens/", {"name": "ci", "scopes": ["tokens"]}, format="json").json()
    entry = AuditEntry.objects.get(action="token.create", target=created["prefix"])
    assert entry.detail["scopes"] == ["tokens"]
    assert entry.detail["via"].startswith("token ")


def test_new_tokens_get_the_maximum_lifetime_and_cannot_ask_for_more(alice: Person, settings: Any) -> None:
    settings.API_TOKEN_MAX_LIFETIME_DAYS = 90
    client = scoped(alice, "tokens")
    default = client.post("/api/v1/tokens/", {"name": "default"}, format="json")
    assert default.status_code == 201
    expires = datetime.fromisoformat(default.json()["expires_at"])
    assert timedelta(days=89, hours=23) < expires - timezone.now() <= timedelta(days=90)
    too_long = client.post("/api/v1/tokens/", {"name": "long", "expires_in_days": 91}, format="json")
    assert too_long.status_code == 400
    assert "expires_in_days" in too_long.json()["error"]["fields"]
    assert "90" in too_long.json()["error"]["message"]
    assert not ApiToken.objects.filter(name="long").exists()


def test_without_a_maximum_a_token_may_never_expire(alice: Person, settings: Any) -> None:
    settings.API_TOKEN_MAX_LIFETIME_DAYS = 0
    client = APIClient()
    client.force_login(alice.user)
    response = client.post("/api/v1/tokens/", {"name": "forever"}, format="json")
    assert response.status_code == 201
    assert response.json()["expires_at"] is None


def test_a_token_created_by_a_token_never_outlives_it(alice: Person) -> None:
    parent, raw = ApiToken.issue(alice.user, alice.team, name="short", expires_in=timedelta(days=2), scopes=["tokens"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    child = client.post("/api/v1/tokens/", {"name": "child", "expires_in_days": 300}, format="json").json()
    assert datetime.fromisoformat(child["expires_at"]) == parent.expires_at
    grandchild = client.post("/api/v1/tokens/", {"name": "default"}, format="json").json()
    assert datetime.fromisoformat(grandchild["expires_at"]) == parent.expires_at


@pytest.mark.parametrize("body", [
    {"scopes": ["admin"]},
    {"scopes": "tokens"},
    {"scopes": ["tokens", "tokens"]},
    {"scopes": [None]},
    {"expires_in_days": 0},
    {"expires_in_days": -1},
    {"expires_in_days": 10**30},
    {"expires_in_days": "1e9"},
    {"expires_in_days": 1.5},
    {"name": "x" * 101},
    {"name": "nul\x00byte"},
    {"name": ["a"]},
])
def test_hostile_token_requests_get_a_400_with_the_field(alice: Person, body: dict[str, Any]) -> None:
    response = scoped(alice, "tokens").post("/api/v1/tokens/", body, format="json")
    assert response.status_code == 400, response.content
    fields = {key.split("[")[0] for key in response.json()["error"]["fields"]}
    assert fields and fields <= {"scopes", "expires_in_days", "name"}
    assert ApiToken.objects.filter(user=alice.user).count() == 2


def test_revoking_an_unknown_or_huge_token_id_is_a_404(alice: Person) -> None:
    client = scoped(alice, "tokens")
    assert client.delete("/api/v1/tokens/999999/").status_code == 404
    assert client.delete(f"/api/v1/tokens/{10**30}/").status_code == 404


def test_the_schema_documents_the_token_endpoints_answers() -> None:
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    tokens = schema["paths"]["/api/v1/tokens/"]
    assert set(tokens["post"]["responses"]) == {"201", "400", "401", "403", "409", "413", "415", "422", "503"}
    assert set(tokens["get"]["responses"]) == {"200", "400", "401", "403", "503"}
    detail = schema["paths"]["/api/v1/tokens/{token_id}/"]["delete"]["responses"]
    assert set(detail) == {"204", "400", "401", "403", "404", "503"}
    created = schema["components"]["schemas"]["NewToken"]
    assert "token" in created["required"]
    request_body = schema["components"]["schemas"]["TokenCreateRequest"]["properties"]
    scopes_enum = request_body["scopes"]["items"]["$ref"].rsplit("/", 1)[1]
    assert schema["components"]["schemas"][scopes_enum]["enum"] == ["tokens"]
    assert request_body["expires_in_days"]["maximum"] == 365


def test_create_api_token_creates_user_and_team_with_create(db: object) -> None:
    out = StringIO()
    call_command("create_api_token", "--user", "ci-bot", "--team", "ml-team", "--create", stdout=out)
    raw = out.getvalue().strip()
    token = ApiToken.objects.get(digest=hash_token(raw))
    assert token.user.username == "ci-bot"
    assert token.team == Team.objects.get(name="ml-team")
    # In the audit log like every token (accounts/actions.py), made by the system rather than a person.
    entry = AuditEntry.objects.get(action="token.create", target=token.prefix)
    assert entry.user is None and entry.detail["via"] == "command"


def test_create_api_token_refuses_unknown_users_without_create(db: object) -> None:
    with pytest.raises(CommandError, match="No user 'ghost'"):
        call_command("create_api_token", "--user", "ghost", "--team", "acme")


def test_create_api_token_gives_a_scope_when_asked(db: object) -> None:
    out = StringIO()
    call_command("create_api_token", "--user", "ci-bot", "--team", "ml-team", "--create", "--scope", "tokens",
                 stdout=out)
    assert ApiToken.objects.get(digest=hash_token(out.getvalue().strip())).scopes == ["tokens"]
    plain = StringIO()
    call_command("create_api_token", "--user", "ci-bot", "--team", "ml-team", stdout=plain)
    assert ApiToken.objects.get(digest=hash_token(plain.getvalue().strip())).scopes == []


def test_create_api_token_refuses_a_lifetime_over_the_maximum(db: object, settings: Any) -> None:
    settings.API_TOKEN_MAX_LIFETIME_DAYS = 30
    with pytest.raises(CommandError, match="between 1 and 30 days"):
        call_command("create_api_token", "--user", "x", "--team", "acme", "--create", "--expires-days", "31")
    with pytest.raises(CommandError, match="between 1 and 30 days"):
        call_command("create_api_token", "--user", "x", "--team", "acme", "--create", "--expires-days", str(10**12))
    assert not ApiToken.objects.exists()


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
