"""API tokens: the raw token is shown once, the list shows prefixes and use, and revoking works."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from accounts.models import ApiToken, hash_token
from accounts.tokens import authenticate_token
from audit.models import AuditEntry
from tests.support.people import Person, signed_in
from web import new_token


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


def _stored_sessions() -> str:
    from django.contrib.sessions.backends.db import SessionStore
    from django.contrib.sessions.models import Session

    return "\n".join(repr(SessionStore().decode(s.session_data)) + s.session_data for s in Session.objects.all())


def test_no_session_keeps_the_new_token_before_or_after_it_is_shown(alice: Person) -> None:
    client = signed_in(alice)
    client.post("/tokens/", {"name": "ci"})
    token = ApiToken.objects.get(name="ci")
    pad = client.cookies[new_token.COOKIE_NAME].value
    stored = _stored_sessions()
    page = client.get("/tokens/").content.decode()
    raw = page.split('id="new-token-value">')[1].split("<")[0]
    assert hash_token(raw) == token.digest
    assert raw not in stored and raw.split("_", 2)[2] not in stored
    assert raw not in pad
    assert raw not in _stored_sessions()
    assert client.cookies[new_token.COOKIE_NAME].value == ""  # the pad is deleted once used


def test_a_display_that_expired_unseen_reveals_nothing(alice: Person) -> None:
    client = signed_in(alice)
    client.post("/tokens/", {"name": "ci"})
    token = ApiToken.objects.get(name="ci")
    del client.cookies[new_token.COOKIE_NAME]  # five minutes later the browser has dropped it
    page = client.get("/tokens/").content.decode()
    assert 'id="new-token-value"' not in page
    assert 'id="new-token-expired"' in page
    assert f"mp_{token.prefix}_…" in page
    assert 'id="new-token"' not in client.get("/tokens/").content.decode()  # and only once


def test_a_forged_pad_cookie_shows_no_token_and_no_error(alice: Person) -> None:
    client = signed_in(alice)
    client.post("/tokens/", {"name": "ci"})
    client.cookies[new_token.COOKIE_NAME] = "zz-not-hex"
    response = client.get("/tokens/")
    assert response.status_code == 200
    assert 'id="new-token-expired"' in response.content.decode()


def test_the_tokens_page_is_never_cached(alice: Person) -> None:
    response = signed_in(alice).get("/tokens/")
    assert "no-store" in response["Cache-Control"]


def test_the_page_shows_and_enforces_the_maximum_lifetime(alice: Person, settings: Any) -> None:
    settings.API_TOKEN_MAX_LIFETIME_DAYS = 30
    client = signed_in(alice)
    assert "Tokens live at most 30 days" in client.get("/tokens/").content.decode()
    response = client.post("/tokens/", {"name": "long", "expires_in_days": "31"})
    assert response.status_code == 200
    assert 'id="id_expires_in_days_error"' in response.content.decode()
    assert not ApiToken.objects.filter(name="long").exists()
    client.post("/tokens/", {"name": "default"})
    expires_at = ApiToken.objects.get(name="default").expires_at
    assert expires_at is not None
    assert timedelta(days=29) < expires_at - timezone.now() <= timedelta(days=30)


def test_the_page_creates_a_token_that_may_manage_tokens_only_when_asked(alice: Person) -> None:
    client = signed_in(alice)
    client.post("/tokens/", {"name": "plain"})
    client.post("/tokens/", {"name": "manager", "manage_tokens": "on"})
    assert ApiToken.objects.get(name="plain").scopes == []
    assert ApiToken.objects.get(name="manager").scopes == ["tokens"]
    page = client.get("/tokens/").content.decode()
    assert "<td>tokens</td>" in page
    assert AuditEntry.objects.get(action="token.create", target=ApiToken.objects.get(name="manager").prefix
                                  ).detail["scopes"] == ["tokens"]
