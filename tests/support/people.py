"""The people of the access tests: alice (owner, admin of "acme"), bob (member of "acme"), charlie (another team,
"globex": must see nothing), each with an API token; and their signed-in browser sessions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.test import Client
from rest_framework.test import APIClient


@dataclass
class Person:
    user: Any
    team: Any
    token: str

    def client(self) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token}")
        return client


def make_person(username: str, team_name: str, role: str = "member") -> Person:
    from django.contrib.auth import get_user_model

    from accounts.models import ApiToken, Membership, Team

    user = get_user_model().objects.create_user(username=username, password="password")
    team, _ = Team.objects.get_or_create(name=team_name)
    Membership.objects.create(user=user, team=team, role=role)
    _, raw = ApiToken.issue(user, team, name="test")
    return Person(user=user, team=team, token=raw)


def signed_in(person: Person) -> Client:
    """Django's test client with `person`'s browser session."""
    client = Client()
    client.force_login(person.user)
    return client


def browser_cookies(person: Person) -> str:
    """The Cookie header of `person`'s browser session, for requests made without Django's test client."""
    from django.conf import settings

    client = signed_in(person)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}; csrftoken=abc123"
