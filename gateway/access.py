"""Who may call which deployment: the gateway's access decision, cached for at most a second so that revoking a
token or stopping a deployment takes effect within that time without a database query per request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils.crypto import constant_time_compare

from accounts.models import Membership
from accounts.tokens import authenticate_token
from deployments.models import Deployment

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class Caller:
    user_id: int
    team_id: int
    token_id: int | None  # None: a browser session
    csrf_checked: bool = False


@dataclass(frozen=True)
class Route:
    deployment_id: int
    name: str
    upstream_url: str  # empty while no revision is serving
    status: str


class TtlCache(Generic[K, V]):
    """A small async cache: one lookup in flight per key, answers kept `ttl` seconds."""

    def __init__(self, ttl: float, loader: Callable[[K], Awaitable[V]], max_size: int = 10_000) -> None:
        self.ttl = ttl
        self.loader = loader
        self.max_size = max_size
        self.entries: dict[K, tuple[float, V]] = {}
        self.pending: dict[K, asyncio.Future[V]] = {}

    async def get(self, key: K) -> V:
        now = time.monotonic()
        entry = self.entries.get(key)
        if entry is not None and entry[0] > now:
            return entry[1]
        future = self.pending.get(key)
        if future is not None:
            return await future
        future = asyncio.get_running_loop().create_future()
        self.pending[key] = future
        try:
            value = await self.loader(key)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        finally:
            self.pending.pop(key, None)
        if len(self.entries) >= self.max_size:
            self.entries.clear()
        self.entries[key] = (time.monotonic() + self.ttl, value)
        future.set_result(value)
        return value


def _load_token(raw: str) -> Caller | None:
    token = authenticate_token(raw)
    if token is None:
        return None
    return Caller(user_id=token.user_id, team_id=token.team_id, token_id=token.pk)


def _load_session(session_key: str) -> Caller | None:
    from importlib import import_module

    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model

    from accounts.context import SESSION_TEAM_KEY

    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    data = store.load()
    user_id = data.get(SESSION_KEY)
    if not user_id or not data.get(BACKEND_SESSION_KEY):
        return None
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None or not constant_time_compare(data.get(HASH_SESSION_KEY, ""), user.get_session_auth_hash()):
        return None
    memberships = Membership.objects.filter(user=user).order_by("team__name")
    chosen = memberships.filter(team_id=data.get(SESSION_TEAM_KEY)).first() or memberships.first()
    if chosen is None:
        return None
    return Caller(user_id=user.pk, team_id=chosen.team_id, token_id=None)


def _load_route(key: tuple[int, str]) -> Route | None:
    team_id, name = key
    row = (Deployment.objects.filter(team_id=team_id, name=name).exclude(desired_state=Deployment.Desired.DELETED)
           .values("pk", "upstream_url", "status", "desired_state").first())
    if row is None:
        return None
    upstream = row["upstream_url"] if row["desired_state"] == Deployment.Desired.RUNNING else ""
    return Route(deployment_id=row["pk"], name=name, upstream_url=upstream, status=row["status"])


def _threaded(func: Callable[[K], V]) -> Callable[[K], Awaitable[V]]:
    return sync_to_async(func, thread_sensitive=False)  # type: ignore[return-value]


class Access:
    def __init__(self, ttl: float) -> None:
        self.tokens: TtlCache[str, Caller | None] = TtlCache(ttl, _threaded(_load_token))
        self.sessions: TtlCache[str, Caller | None] = TtlCache(ttl, _threaded(_load_session))
        self.routes: TtlCache[tuple[int, str], Route | None] = TtlCache(ttl, _threaded(_load_route))
