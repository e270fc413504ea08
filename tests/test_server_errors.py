"""No user ever sees a traceback: DEBUG is opt-in, an unexpected error is a JSON 500 on the API and a plain page in
the web UI, and an unreachable database is a 503 with Retry-After (JSON or HTML) wherever it is hit. The real
PostgreSQL outage, with the whole stack, is in tests/test_faults.py; here the database connection is made to fail
in-process so that every code path is covered quickly."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.http import HttpRequest, HttpResponse
from django.test import Client

from tests.fresh_settings import load_settings
from tests.support.people import Person, signed_in

ROOT = Path(__file__).resolve().parent.parent


def test_debug_is_off_unless_a_developer_turns_it_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    var = {"MODELPORT_VAR_DIR": str(tmp_path)}
    assert load_settings(monkeypatch, var).DEBUG is False  # what `make run` gets
    assert load_settings(monkeypatch, {**var, "MODELPORT_ENV": "development"}).DEBUG is False
    assert load_settings(monkeypatch, {**var, "DEBUG": "1"}).DEBUG is True


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("secret internals: /srv/modelport/deployments/api.py line 42")


def _database_down(self: BaseDatabaseWrapper) -> None:
    raise OperationalError('connection to server at "127.0.0.1", port 5432 failed: Connection refused')


@pytest.fixture
def database_down(db: Any) -> Iterator[Callable[[], None]]:
    """Call it once the test's own setup is done: every query after that fails as if PostgreSQL were down. (Undone
    before the test database's own teardown, which needs the connection.)"""
    original = BaseDatabaseWrapper.ensure_connection

    def down() -> None:
        BaseDatabaseWrapper.ensure_connection = _database_down  # type: ignore[method-assign]

    try:
        yield down
    finally:
        BaseDatabaseWrapper.ensure_connection = original  # type: ignore[method-assign]


def test_an_unexpected_api_error_is_a_json_500_without_internals(alice: Person,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("deployments.api.current_team", _boom)
    client = alice.client()
    client.raise_request_exception = False
    response = client.get("/api/v1/deployments/")
    assert response.status_code == 500
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "server_error"
    assert b"secret internals" not in response.content and b"Traceback" not in response.content


def test_an_unexpected_page_error_is_the_plain_500_page(alice: Person, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("web.views._dashboard_live", _boom)
    client = signed_in(alice)
    client.raise_request_exception = False
    response = client.get("/")
    assert response.status_code == 500
    assert b"Something went wrong" in response.content
    assert b"secret internals" not in response.content and b"Traceback" not in response.content


def test_the_api_answers_503_with_a_json_message_while_the_database_is_down(
        alice: Person, database_down: Callable[[], None]) -> None:
    client = alice.client()
    database_down()
    for method, path in [("get", "/api/v1/deployments/"), ("post", "/api/v1/models/"), ("get", "/api/v1/me/")]:
        response = getattr(client, method)(path, {"name": "digits"} if method == "post" else None, format="json")
        assert response.status_code == 503, (path, response.content[:200])
        assert response["Retry-After"] == "5"
        error = response.json()["error"]
        assert error["code"] == "database_unavailable"
        assert "Retry in a few seconds" in error["message"]
        assert b"5432" not in response.content  # nothing about the infrastructure


def test_pages_answer_503_with_an_html_message_while_the_database_is_down(
        alice: Person, database_down: Callable[[], None]) -> None:
    client = signed_in(alice)
    database_down()
    for who, path in [(client, "/"), (client, "/models/"), (client, "/deployments/new/"), (client, "/admin/")]:
        response = who.get(path, HTTP_ACCEPT="text/html")
        assert response.status_code == 503, (path, response.status_code)
        assert response["Content-Type"].startswith("text/html")
        assert b"cannot reach its database" in response.content
        assert b"Traceback" not in response.content and b"5432" not in response.content


def test_a_login_attempt_while_the_database_is_down_is_a_503_not_a_500(alice: Person,
                                                                       database_down: Callable[[], None]) -> None:
    client = Client(enforce_csrf_checks=False)
    database_down()
    response = client.post("/login/", {"username": "alice", "password": "password"}, HTTP_ACCEPT="text/html")
    assert response.status_code == 503


class DatabaseDownInMiddleware:
    """A middleware that hits the dead database before any view runs (as session or auth middleware can)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        raise OperationalError("server closed the connection unexpectedly")


def test_a_database_error_outside_any_view_is_a_503_too(alice: Person, settings: Any) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE[:1], "tests.test_server_errors.DatabaseDownInMiddleware",
                           *settings.MIDDLEWARE[1:]]
    client = alice.client()
    client.raise_request_exception = False
    api = client.get("/api/v1/deployments/")
    assert api.status_code == 503
    assert api.json()["error"]["code"] == "database_unavailable"
    page = client.get("/models/", HTTP_ACCEPT="text/html")
    assert page.status_code == 503
    assert b"cannot reach its database" in page.content


def test_healthz_stays_up_and_reports_the_database(db: Any, database_down: Callable[[], None]) -> None:
    assert Client().get("/healthz").json() == {"status": "ok", "database": "ok"}
    database_down()
    response = Client().get("/healthz")
    assert response.status_code == 200  # a restart would not bring the database back; the gateway keeps serving
    assert response.json() == {"status": "ok", "database": "unavailable"}
