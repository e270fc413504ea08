"""Who may call which deployment: the gateway's access decision, cached for at most a second so that revoking a
token or stopping a deployment takes effect within that time without a database query per request.

Made-up credentials must cost nothing: a token whose prefix no token has is refused from memory (the known
prefixes are topped up by one shared query at most every KNOWN_PREFIX_INTERVAL seconds), and credentials never
seen before get a bounded number of lookups per second, so a flood of them neither queries the database per
request nor pushes the real callers out of the cache.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, KeysView, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections
from django.utils.crypto import constant_time_compare

from accounts.models import TOKEN_PREFIX, ApiToken, Membership
from accounts.tokens import authenticate_token
from deployments.models import Deployment
from deployments.revision_spec import RevisionSpec
from gateway.contract import Contract, contracts_for
from gateway.pool_names import Pooled
from gateway.protocol import Refusal

log = logging.getLogger(__name__)

K = TypeVar("K")
V = TypeVar("V")

KNOWN_PREFIX_INTERVAL = 0.1  # seconds between two top-ups of the known token prefixes
NEW_KEY_LOOKUPS_PER_SECOND = 50.0  # lookups of never-seen tokens or sessions, per gateway process
NEW_KEY_LOOKUP_BURST = 200
STALE_IF_ERROR_SECONDS = 3600.0  # how long a cached answer may stand in while the database is unreachable
# The database is unreachable (PostgreSQL down or restarting, a connection it dropped): only then may an expired
# answer stand in. Not every DatabaseError: a query that fails on a database that is up (a migration half applied
# during a rolling deploy: ProgrammingError) must not keep a revoked token working for an hour.
_UNREACHABLE = (OperationalError, InterfaceError)
MAX_CREDENTIAL_LENGTH = 256


@dataclass(frozen=True)
class Caller:
    user_id: int
    team_id: int
    token_id: int | None  # None: a browser session
    team_name: str = ""  # what a 404 names: the team the request acts for (gateway/not_found.py)


_NO_CONTRACTS: Mapping[str, Contract] = {}


@dataclass(frozen=True)
class Route:
    deployment_id: int
    name: str
    upstream_url: str  # empty while no revision is serving
    status: str
    models: frozenset[str] = frozenset()  # the models the serving revision holds (the metrics label them)
    grpc_target: str = ""  # host:port of the serving Triton's gRPC endpoint; empty while none serves
    revision: int = 0  # the serving revision's number
    # A canary beside it (deployments/canary.py): its revision's number (0: none), its upstreams once it serves
    # (empty while it starts), and the share of requests it takes.
    canary_revision: int = 0
    canary_url: str = ""
    canary_grpc_target: str = ""
    canary_percent: int = 0
    team: str = ""  # the team's name: with `name`, what the metrics label a deployment's series by
    # Per revision number (the serving one's, a canary's), what each of its models takes and gives: Triton's errors
    # are reworded with it and answers missing an output refused (gateway/contract.py).
    contracts: Mapping[int, Mapping[str, Contract]] = field(default_factory=dict, hash=False, compare=False)

    # The revisions served from a pool (shared placement, gateway/pool_names.py): their names there and loads.
    pooled: tuple[Pooled, ...] = ()
    # The revisions (numbers) of a dedicated cluster deployment that scale to zero: a request is held while no pod
    # of theirs is ready (gateway/scale_from_zero.py).
    scales_to_zero: frozenset[int] = frozenset()

    def contract(self, revision: int, model: str) -> Contract | None:
        return self.contracts.get(revision, {}).get(model)

    def pooled_for(self, revision: int) -> Pooled | None:
        return next((p for p in self.pooled if p.revision == revision), None)

    def models_of(self, revision: int) -> KeysView[str]:
        """The models a revision (the serving one's number, a canary's) serves: its spec's, every model its Triton
        loads (a pipeline's steps are entries of the spec too). A view, not a set made per request."""
        return self.contracts.get(revision, _NO_CONTRACTS).keys()


class TtlCache(Generic[K, V]):
    """A small async cache: one lookup in flight per key, answers kept `ttl` seconds from the end of the lookup that
    read them. An answer in use is looked up again in the background in the second half of its life (REFRESH_AT),
    so that callers get the cached one meanwhile instead of all waiting for the lookup when it expires: under load a
    lookup in the gateway's thread waits for the GIL behind the event loop (59 ms, and 500 ms beside a model busy on
    the same cores, were measured), and each expiry held every new request of that caller or deployment for that
    long. An answer is never served past its ttl (a revocation's bound stands) except while the database is
    unreachable: then an expired answer stands in for up to STALE_IF_ERROR_SECONDS. When full, expired entries go
    first, then the oldest: never the whole cache at once."""

    # Of the ttl: an answer older than this is refreshed in the background when it is used. Later means fewer lookups
    # (a key in steady use is looked up about every REFRESH_AT ttl rather than every ttl); earlier leaves a slow
    # lookup more time to land before the answer expires. At 0.75 (125 ms at the default 0.5 s) lookups of 20 to
    # 52 ms were usual at 32 streams with the CPUs full, but one now and then took longer than 125 ms, and every new
    # stream of the deployment waited for it: 31 requests 112 ms at once, the first pieces' p99 (docs/benchmarks.md,
    # "Streaming"). At 0.5 a lookup has 250 ms.
    REFRESH_AT = 0.5

    def __init__(self, ttl: float, loader: Callable[[K], Awaitable[V]], max_size: int = 10_000) -> None:
        self.ttl = ttl
        self.loader = loader
        self.max_size = max_size
        self.entries: dict[K, tuple[float, V]] = {}
        self.pending: dict[K, asyncio.Future[V]] = {}
        self.refreshes: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak references to tasks
        # key -> the expiry of the answer whose refresh failed: not refreshed again before it expires, so that a
        # failing database is not asked once per request for the rest of that answer's life.
        self.refresh_failed: dict[K, float] = {}

    def seen(self, key: K) -> bool:
        return key in self.entries

    def invalidate(self, key: K) -> None:
        """Forget `key`: the next caller looks it up, and a lookup already in flight (which may have read the
        database before the change that made the caller invalidate) answers its own waiters but is not stored."""
        self.entries.pop(key, None)
        self.pending.pop(key, None)
        self.refresh_failed.pop(key, None)

    async def get(self, key: K) -> V:
        now = time.monotonic()
        entry = self.entries.get(key)
        if entry is not None and entry[0] > now:
            if (entry[0] - now < self.ttl * (1 - self.REFRESH_AT) and key not in self.pending
                    and self.refresh_failed.get(key) != entry[0]):
                self._refresh(key, entry)
            return entry[1]
        future = self.pending.get(key)
        if future is not None:
            return await asyncio.shield(future)
        future = asyncio.get_running_loop().create_future()
        self.pending[key] = future
        await self._lookup(key, entry, future, background=False)
        return future.result()  # the answer, the one standing in, or the lookup's error

    def _refresh(self, key: K, entry: tuple[float, V]) -> None:
        """Look `key` up again in a task of its own; a caller that comes once the answer expired waits for it (it
        is the key's lookup in flight). A failed refresh stores nothing: the answer expires as it would have."""
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self.pending[key] = future
        task = asyncio.get_running_loop().create_task(self._lookup(key, entry, future, background=True))
        self.refreshes.add(task)
        task.add_done_callback(self.refreshes.discard)

    async def _lookup(self, key: K, entry: tuple[float, V] | None, future: asyncio.Future[V],
                      background: bool) -> None:
        """The key's lookup in flight (`future`, in `pending`): stores its answer and settles `future` with it; with
        the database unreachable, with the expired answer that stands in; otherwise with the error."""
        try:
            value = await self.loader(key)
        except asyncio.CancelledError:  # the caller went away, or the gateway is stopping
            self._settle(key, future)
            future.cancel()
            raise
        except BaseException as exc:
            if self._settle(key, future) and background:
                self.refresh_failed[key] = entry[0] if entry is not None else 0.0
            if (isinstance(exc, _UNREACHABLE) and entry is not None
                    and time.monotonic() - entry[0] < STALE_IF_ERROR_SECONDS):
                log.warning("database unavailable, using a cached access answer: %s", exc)
                future.set_result(entry[1])
            else:
                future.set_exception(exc)
                future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
                if background:
                    log.error("gateway: refreshing a cached access answer failed", exc_info=exc)
            if not isinstance(exc, Exception):
                raise
            return
        if self._settle(key, future):
            self._store(key, entry, value)
        future.set_result(value)

    def _settle(self, key: K, future: asyncio.Future[V]) -> bool:
        """The lookup of `future` ended: whether it is still the key's own (not invalidated meanwhile)."""
        if self.pending.get(key) is not future:
            return False
        del self.pending[key]
        return True

    def _store(self, key: K, entry: tuple[float, V] | None, value: V) -> None:
        if entry is None and len(self.entries) >= self.max_size:
            self._evict(time.monotonic())
        # Re-inserted at the end, so that eviction (oldest first) reaches the keys in use last.
        self.entries.pop(key, None)
        self.entries[key] = (time.monotonic() + self.ttl, value)
        self.refresh_failed.pop(key, None)

    def _evict(self, now: float) -> None:
        expired = [key for key, (expires, _) in self.entries.items() if expires <= now - STALE_IF_ERROR_SECONDS]
        for key in expired:
            del self.entries[key]
            self.refresh_failed.pop(key, None)
        excess = len(self.entries) - self.max_size + max(1, self.max_size // 10)
        if excess > 0:
            for key in list(self.entries)[:excess]:  # insertion order: the oldest first
                del self.entries[key]
                self.refresh_failed.pop(key, None)


class Budget:
    """A token bucket of `rate` per second up to `burst`; take() says whether one unit was left."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.level = burst
        self.updated = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.level = min(self.burst, self.level + (now - self.updated) * self.rate)
        self.updated = now
        if self.level >= 1.0:
            self.level -= 1.0
            return True
        return False


class KnownPrefixes:
    """The prefixes of all API tokens (mp_<prefix>_<secret>), loaded once and topped up with newer tokens. A
    lookup that misses waits for a top-up that began after it arrived (so a token created a moment ago works at
    once); top-ups are shared by every waiting request and start at most every `interval` seconds."""

    def __init__(self, interval: float = KNOWN_PREFIX_INTERVAL) -> None:
        self.interval = interval
        self.prefixes: set[str] = set()
        self.max_pk = 0
        self.last_started = -math.inf  # when the last completed top-up began
        self.running: asyncio.Future[None] | None = None
        self.load = _threaded(_tokens_after)

    async def contains(self, prefix: str) -> bool:
        if prefix in self.prefixes:
            return True
        arrived = time.monotonic()
        while self.last_started < arrived:
            await self._top_up()
        return prefix in self.prefixes

    async def _top_up(self) -> None:
        if self.running is not None:
            await asyncio.shield(self.running)
            return
        self.running = asyncio.get_running_loop().create_future()
        try:
            wait = self.last_started + self.interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            started = time.monotonic()
            rows = await self.load(self.max_pk)
            for pk, prefix in rows:
                self.prefixes.add(prefix)
                self.max_pk = max(self.max_pk, pk)
            self.last_started = started
            self.running.set_result(None)
        except asyncio.CancelledError:
            self.running.cancel()
            raise
        except BaseException as exc:
            self.running.set_exception(exc)
            self.running.exception()
            raise
        finally:
            self.running = None


def _tokens_after(pk: int) -> list[tuple[int, str]]:
    # Revoked and expired tokens stay in: this only tells made-up prefixes apart, the token lookup decides.
    return list(ApiToken.objects.filter(pk__gt=pk).order_by().values_list("pk", "prefix"))


def _load_token(raw: str) -> Caller | None:
    token = authenticate_token(raw)
    if token is None:
        return None
    return Caller(user_id=token.user_id, team_id=token.team_id, token_id=token.pk, team_name=token.team.name)


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
    memberships = Membership.objects.filter(user=user).select_related("team").order_by("team__name")
    chosen = memberships.filter(team_id=data.get(SESSION_TEAM_KEY)).first() or memberships.first()
    if chosen is None:
        return None
    return Caller(user_id=user.pk, team_id=chosen.team_id, token_id=None, team_name=chosen.team.name)


def _load_route(key: tuple[int, str]) -> Route | None:
    team_id, name = key
    row = (Deployment.objects.filter(team_id=team_id, name=name).exclude(desired_state=Deployment.Desired.DELETED)
           .values("pk", "team__name", "upstream_url", "grpc_upstream", "status", "desired_state",
                   "serving_revision__spec",
                   "serving_revision__number", "canary_revision__number", "canary_revision__spec",
                   "canary_upstream_url", "canary_grpc_upstream", "canary_percent", "serving_revision_id",
                   "canary_revision_id").first())
    if row is None:
        return None
    pooled = _pooled(row["pk"], [(row["serving_revision_id"], row["serving_revision__number"],
                                  row["serving_revision__spec"]),
                                 (row["canary_revision_id"], row["canary_revision__number"],
                                  row["canary_revision__spec"])])
    running = row["desired_state"] == Deployment.Desired.RUNNING
    return Route(deployment_id=row["pk"], name=name, team=row["team__name"],
                 upstream_url=row["upstream_url"] if running else "",
                 status=row["status"],
                 models=_model_names(row["serving_revision__spec"]) | _model_names(row["canary_revision__spec"]),
                 grpc_target=row["grpc_upstream"] if running else "",
                 revision=row["serving_revision__number"] or 0,
                 canary_revision=(row["canary_revision__number"] or 0) if running else 0,
                 canary_url=row["canary_upstream_url"] if running else "",
                 canary_grpc_target=row["canary_grpc_upstream"] if running else "",
                 canary_percent=row["canary_percent"] if running else 0, pooled=pooled,
                 scales_to_zero=frozenset(
                     number for number, spec in ((row["serving_revision__number"], row["serving_revision__spec"]),
                                                 (row["canary_revision__number"], row["canary_revision__spec"]))
                     if number and _scales_to_zero(spec)),
                 contracts={row["serving_revision__number"] or 0: contracts_for(row["serving_revision__spec"]),
                            row["canary_revision__number"] or -1: contracts_for(row["canary_revision__spec"])})


def _pooled(deployment_id: int,
            revisions: list[tuple[int | None, int | None, RevisionSpec | None]]) -> tuple[Pooled, ...]:
    """The shared revisions among the serving and canary ones, decided by their specs, with their loads (one
    query, only when shared). A shared revision whose load row is missing is still pooled (load_id None): the
    gateway must never take it for a dedicated one, whose requests go to the upstream unmapped."""
    from deployments.models import PoolLoad
    from deployments.pool_names import name_prefix

    shared = {pk: number for pk, number, spec in revisions
              if pk is not None and number is not None and spec is not None and spec.placement.shared}
    specs = {pk: spec for pk, _, spec in revisions if pk in shared}
    if not shared:
        return ()
    loads = {load["revision_id"]: load for load in
             PoolLoad.objects.filter(revision_id__in=list(shared)).values("pk", "revision_id", "state")}
    found = []
    for pk, number in shared.items():
        load = loads.get(pk)
        found.append(Pooled(revision=number, prefix=name_prefix(deployment_id, number),
                            load_id=load["pk"] if load is not None else None,
                            loaded=load is not None and load["state"] == PoolLoad.State.LOADED,
                            idle=load is not None and load["state"] == PoolLoad.State.UNLOADED,
                            models=_model_names(specs[pk])))
    return tuple(found)


@dataclass(frozen=True)
class Choice:
    """Where one request goes: the upstream (an HTTP base URL, or a gRPC host:port) and the revision it serves."""

    upstream: str
    revision: int


MAX_PIN_LENGTH = 9


def choose(route: Route, pinned: str | None, grpc: bool = False) -> Choice:
    """The revision that answers this request: the one the client pins with `Modelport-Revision` (the serving or
    the canary revision only), or else the canary for `canary_percent` of the requests, each drawn on its own
    (no request is stuck to a revision unless pinned), and the serving revision for the rest."""
    stable = route.grpc_target if grpc else route.upstream_url
    canary = route.canary_grpc_target if grpc else route.canary_url
    if pinned is not None:
        text = pinned.strip()
        if not text.isascii() or not text.isdigit() or len(text) > MAX_PIN_LENGTH:
            raise Refusal(400, "Modelport-Revision must be a revision number of this deployment, e.g. 3.")
        number = int(text)
        if number and number == route.canary_revision:
            if not canary:
                raise Refusal(503, f"Canary revision {number} of {route.name!r} is starting; retry in a few seconds.",
                              {"Retry-After": "2"})
            return Choice(canary, number)
        if not number or number != route.revision:
            serving = [f"serving: {route.revision}"] if route.revision else []
            serving += [f"canary: {route.canary_revision}"] if route.canary_revision else []
            raise Refusal(404, f"Revision {number} does not serve {route.name!r}"
                               + (f" ({', '.join(serving)})." if serving else "."))
    elif canary and route.canary_percent and secrets.randbelow(10_000) < route.canary_percent * 100:
        return Choice(canary, route.canary_revision)
    if not stable:
        retry = "; retry in a few seconds." if grpc else "."
        raise Refusal(503, f"Deployment {route.name!r} is not ready (status: {route.status}){retry}",
                      {"Retry-After": "2"})
    return Choice(stable, route.revision)


def _scales_to_zero(spec: RevisionSpec | None) -> bool:
    return bool(spec is not None and not spec.placement.shared and spec.autoscaling is not None
                and spec.autoscaling.scales_to_zero)


def _model_names(spec: RevisionSpec | None) -> frozenset[str]:
    return frozenset(spec.model_names) if spec is not None else frozenset()


def _threaded(func: Callable[[K], V]) -> Callable[[K], Awaitable[V]]:
    def load(key: K) -> V:
        # These threads see no request signals: replace a connection PostgreSQL dropped (a restart) before using
        # it, else every lookup fails with "connection already closed" until the process restarts.
        close_old_connections()
        return func(key)

    return sync_to_async(load, thread_sensitive=False)  # type: ignore[return-value]


class Access:
    def __init__(self, ttl: float) -> None:
        self.tokens: TtlCache[str, Caller | None] = TtlCache(ttl, _threaded(_load_token))
        self.sessions: TtlCache[str, Caller | None] = TtlCache(ttl, _threaded(_load_session))
        self.routes: TtlCache[tuple[int, str], Route | None] = TtlCache(ttl, _threaded(_load_route))
        self.prefixes = KnownPrefixes()
        self.new_keys = Budget(NEW_KEY_LOOKUPS_PER_SECOND, NEW_KEY_LOOKUP_BURST)

    async def token(self, raw: str) -> Caller | None:
        if len(raw) > MAX_CREDENTIAL_LENGTH or not raw.startswith(TOKEN_PREFIX):
            return None
        if not self.tokens.seen(raw):
            prefix = raw[len(TOKEN_PREFIX):].partition("_")[0]
            if not await self.prefixes.contains(prefix) or not self.new_keys.take():
                return None
        return await self.tokens.get(raw)

    async def session(self, session_key: str) -> Caller | None:
        if len(session_key) > MAX_CREDENTIAL_LENGTH or not (session_key.isascii() and session_key.isalnum()):
            return None  # Django's session keys are letters and digits
        if not self.sessions.seen(session_key) and not self.new_keys.take():
            return None
        return await self.sessions.get(session_key)
