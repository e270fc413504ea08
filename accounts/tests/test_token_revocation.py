"""Issue 30: revoking a token revokes the tokens it created, transitively, from every place that revokes (the API,
the tokens page, the admin), with one audit row per revoked token. (The gateway's side: gateway/tests/test_access.py,
test_a_token_created_by_a_revoked_token_stops_at_the_gateway.)"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from accounts import actions
from accounts.models import ApiToken
from audit.models import AuditEntry
from tests.support.people import Person


def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def mint(raw: str, name: str) -> tuple[ApiToken, str]:
    """What a CI token with the "tokens" scope does: create a token (that may create tokens too) through the API."""
    created = bearer(raw).post("/api/v1/tokens/", {"name": name, "scopes": ["tokens"]}, format="json")
    assert created.status_code == 201, created.content
    return ApiToken.objects.get(pk=created.json()["id"]), created.json()["token"]


@pytest.fixture
def chain(alice: Person) -> list[tuple[ApiToken, str]]:
    """alice's CI token A (scope "tokens", made on the page), B made by A, C made by B."""
    a = actions.issue_token(alice.user, alice.team, name="ci", scopes=["tokens"], by=alice.user, via="session")
    b = mint(a[1], "minted-by-ci")
    c = mint(b[1], "minted-by-minted")
    return [a, b, c]


def signed_in(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def revocations(*tokens: ApiToken) -> dict[str, dict[str, Any]]:
    return {e.target: e.detail for e in AuditEntry.objects.filter(action="token.revoke",
                                                                  target__in=[t.prefix for t in tokens])}


def test_a_token_remembers_the_token_that_created_it(chain: list[tuple[ApiToken, str]]) -> None:
    (a, _), (b, _), (c, _) = chain
    assert (a.created_by, b.created_by, c.created_by) == (None, a, b)
    assert AuditEntry.objects.get(action="token.create", target=c.prefix).detail["via"] == f"token {b.prefix}"


def test_revoking_a_token_through_the_api_revokes_what_it_created(alice: Person,
                                                                  chain: list[tuple[ApiToken, str]]) -> None:
    (a, a_raw), (b, b_raw), (c, c_raw) = chain
    for raw in (a_raw, b_raw, c_raw):
        assert bearer(raw).get("/api/v1/me/").status_code == 200
    assert signed_in(alice).delete(f"/api/v1/tokens/{a.pk}/").status_code == 204
    for raw in (a_raw, b_raw, c_raw):
        refused = bearer(raw).get("/api/v1/me/")
        assert refused.status_code == 401
        assert refused.json()["error"]["message"] == "The API token is invalid, expired or revoked."
    assert alice.client().get("/api/v1/me/").status_code == 200  # her token from elsewhere is no descendant
    # One audit row per revoked token; those taken along name the one revoked.
    assert revocations(a, b, c) == {
        a.prefix: {"name": "ci", "via": "session"},
        b.prefix: {"name": "minted-by-ci", "via": "session", "revoked_with": a.prefix},
        c.prefix: {"name": "minted-by-minted", "via": "session", "revoked_with": a.prefix},
    }
    assert AuditEntry.objects.filter(action="token.revoke").count() == 3


def test_a_token_revoking_its_child_revokes_the_grandchild_and_keeps_itself(
    chain: list[tuple[ApiToken, str]]
) -> None:
    (a, a_raw), (b, b_raw), (c, c_raw) = chain
    assert bearer(a_raw).delete(f"/api/v1/tokens/{b.pk}/").status_code == 204
    assert bearer(a_raw).get("/api/v1/me/").status_code == 200
    assert bearer(b_raw).get("/api/v1/me/").status_code == 401
    assert bearer(c_raw).get("/api/v1/me/").status_code == 401
    assert revocations(b, c)[c.prefix] == {"name": "minted-by-minted", "via": f"token {a.prefix}",
                                           "revoked_with": b.prefix}


def test_revoking_on_the_tokens_page_revokes_what_it_created(alice: Person,
                                                             chain: list[tuple[ApiToken, str]]) -> None:
    (a, _), (b, b_raw), (c, c_raw) = chain
    page = signed_in(alice)
    response = page.post(f"/tokens/{a.pk}/revoke/", follow=True)
    assert "and 2 token(s) it created" in response.content.decode()
    assert bearer(b_raw).get("/api/v1/me/").status_code == 401
    assert bearer(c_raw).get("/api/v1/me/").status_code == 401
    assert set(revocations(a, b, c)) == {a.prefix, b.prefix, c.prefix}


def test_the_admins_revoke_action_revokes_what_they_created(chain: list[tuple[ApiToken, str]]) -> None:
    (a, _), (b, b_raw), (c, c_raw) = chain
    operator = Client()
    operator.force_login(get_user_model().objects.create_superuser("olivia", "olivia@example.com", "password"))
    response = operator.post("/admin/accounts/apitoken/", {"action": "revoke_tokens",
                                                           "_selected_action": [str(a.pk)]}, follow=True)
    assert "Revoked 3 token(s)." in response.content.decode()
    assert bearer(b_raw).get("/api/v1/me/").status_code == 401
    assert bearer(c_raw).get("/api/v1/me/").status_code == 401
    rows = AuditEntry.objects.filter(action="token.revoke")
    assert {(r.target, r.username, r.detail["via"]) for r in rows} == {
        (t.prefix, "olivia", "admin") for t in (a, b, c)}
    # The change form cannot un-revoke (nor revoke around the action): revoked_at is read-only there.
    form = operator.get(f"/admin/accounts/apitoken/{b.pk}/change/").content.decode()
    assert 'name="revoked_at' not in form


def test_revoking_a_revoked_token_again_reaches_children_left_working(chain: list[tuple[ApiToken, str]]) -> None:
    """A token revoked by an older version (one row, no cascade): revoking it again stops what it created."""
    (a, a_raw), (b, b_raw), _ = chain
    ApiToken.objects.filter(pk=a.pk).update(revoked_at=b.created_at)  # as the old revoke() left it
    assert bearer(b_raw).get("/api/v1/me/").status_code == 200
    revoked = actions.revoke_token(ApiToken.objects.get(pk=a.pk), by=None, via="admin")
    assert [t.name for t in revoked] == ["minted-by-ci", "minted-by-minted"]
    assert bearer(b_raw).get("/api/v1/me/").status_code == 401
    assert not AuditEntry.objects.filter(action="token.revoke", target=a.prefix).exists()  # revoked already


def test_a_revoked_token_cannot_create_a_token(alice: Person, chain: list[tuple[ApiToken, str]]) -> None:
    """The creator is checked again under a lock: a revocation racing a creation cannot leave a live child."""
    (a, _), _, _ = chain
    stale = ApiToken.objects.get(pk=a.pk)  # as the request authenticated it
    actions.revoke_token(a, by=alice.user, via="session")
    before = ApiToken.objects.count()
    with pytest.raises(actions.CreatorRevoked):
        actions.issue_token(alice.user, alice.team, name="late", by=alice.user, via=f"token {a.prefix}",
                            created_by=stale)
    assert ApiToken.objects.count() == before
    assert not AuditEntry.objects.filter(action="token.create", detail__name="late").exists()


def test_the_migration_links_old_tokens_from_the_audit_log_and_revokes_what_revoked_ones_made(
    alice: Person, bob: Person
) -> None:
    """Tokens made before created_by existed: the audit log's "via token <prefix>" links them, and the children of
    tokens revoked by then are revoked, each with an audit row."""
    migration = importlib.import_module("accounts.migrations.0006_token_created_by")
    parent, _ = ApiToken.issue(alice.user, alice.team, name="old-ci", scopes=["tokens"])
    child, child_raw = ApiToken.issue(alice.user, alice.team, name="old-minted")
    kept, kept_raw = ApiToken.issue(bob.user, bob.team, name="bobs")
    AuditEntry.objects.create(team=alice.team, user=alice.user, username="alice", action="token.create",
                              target=child.prefix, detail={"name": "old-minted", "via": f"token {parent.prefix}"})
    AuditEntry.objects.create(team=bob.team, user=bob.user, username="bob", action="token.create",
                              target=kept.prefix, detail={"name": "bobs", "via": "token deadbeef"})  # no such token
    ApiToken.objects.filter(pk=parent.pk).update(revoked_at=child.created_at)
    migration.link_and_revoke(apps, None)
    child.refresh_from_db()
    kept.refresh_from_db()
    assert child.created_by_id == parent.pk and child.revoked_at is not None
    assert kept.created_by_id is None and kept.revoked_at is None
    assert bearer(child_raw).get("/api/v1/me/").status_code == 401
    assert bearer(kept_raw).get("/api/v1/me/").status_code == 200
    row = AuditEntry.objects.get(action="token.revoke", target=child.prefix)
    assert row.detail == {"name": "old-minted", "via": "migration", "revoked_with": parent.prefix}
    assert row.user is None


def test_a_token_revoked_while_it_creates_a_token_gets_401(alice: Person, chain: list[tuple[ApiToken, str]],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The revocation lands between the request's authentication and the creation: the API answers as if it had
    landed before, and nothing is created."""
    (a, a_raw), _, _ = chain
    real_issue = actions.issue_token

    def revoked_meanwhile(*args: Any, **kwargs: Any) -> Any:
        actions.revoke_token(ApiToken.objects.get(pk=a.pk), by=alice.user, via="session")
        return real_issue(*args, **kwargs)

    monkeypatch.setattr(actions, "issue_token", revoked_meanwhile)
    before = ApiToken.objects.count()
    refused = bearer(a_raw).post("/api/v1/tokens/", {"name": "late"}, format="json")
    assert refused.status_code == 401
    assert refused.json()["error"]["message"] == "The API token is invalid, expired or revoked."
    assert ApiToken.objects.count() == before


def test_tokens_are_issued_and_revoked_only_through_accounts_actions() -> None:
    """The API, the tokens page, the admin and create_api_token all issue and revoke through accounts/actions.py, so
    every token has its one "token.create" row and every revocation its "token.revoke" rows. A module that called
    ApiToken.issue() or revoke() itself would change tokens with no audit row (tests set up with the model alone)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    allowed = {"accounts/models.py", "accounts/actions.py"}
    calls, read = {}, 0
    for app in ("accounts", "audit", "models_registry", "deployments", "gateway", "tuning", "web", "portal"):
        for path in sorted((root / app).rglob("*.py")):
            where = str(path.relative_to(root))
            if "/tests/" in where or "/migrations/" in where or where in allowed:
                continue
            read += 1
            text = path.read_text()
            found = [call for call in ("ApiToken.issue(", ".revoke(") if call in text]
            if found:
                calls[where] = found
    assert read > 100
    assert calls == {}, "issue and revoke with accounts.actions.issue_token / revoke_token: " + repr(calls)
