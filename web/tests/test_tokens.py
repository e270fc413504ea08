"""API tokens: the raw token is shown once, the list shows prefixes and use, and revoking works."""

from __future__ import annotations

from accounts.models import ApiToken, hash_token
from accounts.tokens import authenticate_token
from audit.models import AuditEntry
from conftest import Person
from web.tests.conftest import signed_in


def test_a_new_token_is_shown_once(alice: Person) -> None:
    client = signed_in(alice)
    response = client.post("/tokens/", {"name": "ci deploy", "expires_in_days": "30"})
    assert response.status_code == 302
    token = ApiToken.objects.get(name="ci deploy")
    assert token.user == alice.user and token.team == alice.team
    assert token.expires_at is not None
    page = client.get("/tokens/").content.decode()
    assert 'id="new-token-value"' in page
    raw = page.split('id="new-token-value">')[1].split("<")[0]
    assert hash_token(raw) == token.digest
    assert authenticate_token(raw) == token
    assert AuditEntry.objects.filter(action="token.create", target=token.prefix, username="alice").exists()
    again = client.get("/tokens/").content.decode()
    assert raw not in again
    assert f"mp_{token.prefix}_…" in again


def test_the_list_shows_the_team_and_last_use(alice: Person) -> None:
    authenticate_token(alice.token)
    content = signed_in(alice).get("/tokens/").content.decode()
    assert "acme" in content
    assert "ago" in content  # last used
    assert alice.token not in content


def test_a_bad_expiry_is_shown_beside_its_field(alice: Person) -> None:
    response = signed_in(alice).post("/tokens/", {"name": "x", "expires_in_days": "-3"})
    assert response.status_code == 200
    assert 'id="id_expires_in_days_error"' in response.content.decode()
    assert not ApiToken.objects.filter(name="x").exists()


def test_revoking_a_token(alice: Person) -> None:
    token = ApiToken.objects.get(user=alice.user)
    client = signed_in(alice)
    response = client.post(f"/tokens/{token.pk}/revoke/")
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert authenticate_token(alice.token) is None
    assert AuditEntry.objects.filter(action="token.revoke", target=token.prefix).exists()
    assert f'id="revoke-token-{token.pk}"' not in client.get("/tokens/").content.decode()


def test_bob_cannot_revoke_alices_token(alice: Person, bob: Person) -> None:
    token = ApiToken.objects.get(user=alice.user)
    assert signed_in(bob).post(f"/tokens/{token.pk}/revoke/").status_code == 404
    assert signed_in(bob).get(f"/tokens/{token.pk}/revoke/").status_code == 405
    token.refresh_from_db()
    assert token.revoked_at is None
    assert f"mp_{token.prefix}" not in signed_in(bob).get("/tokens/").content.decode()
