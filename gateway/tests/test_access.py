"""Who may call a deployment, decided from a cache: browser sessions need the CSRF header for anything but reads,
made-up tokens cost no database query and cannot push real callers out of the cache, a new token works at once,
a revoked one stops within the cache's lifetime, and the last answers stand in while the database is down."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
from django.db import OperationalError

from accounts.models import ApiToken
from gateway import access
from gateway.access import Budget, TtlCache
from gateway.tests.fake_upstream import FakeUpstream
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person, browser_cookies

INFER = b'{"inputs": [{"name": "input", "shape": [1], "datatype": "FP32", "data": [1]}]}'


def test_a_browser_session_reads_freely_but_must_send_the_csrf_header_to_infer(
    people: dict[str, Person], gateway_app: Any
) -> None:
    alice = people["alice"]
    cookies = browser_cookies(alice)

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, alice, "digits-prod", upstream.url)
            app = gateway_app()
            url = "/serve/digits-prod/v2/models/digits"
            assert (await call(app, "GET", f"{url}/ready", headers={"Cookie": cookies})).status == 200
            for csrf in ({}, {"X-CSRFToken": "wrong"}, {"X-CSRFToken": ""}):
                refused = await call(app, "POST", f"{url}/infer", body=INFER, headers={"Cookie": cookies, **csrf})
                assert refused.status == 403 and "X-CSRFToken" in refused.json()["error"]
            # Another site cannot read the cookie, so it cannot send its value along: the header proves the page.
            ok = await call(app, "POST", f"{url}/infer", body=INFER,
                            headers={"Cookie": cookies, "X-CSRFToken": "abc123"})
            assert ok.status == 200
            assert [r.target for r in upstream.requests] == [b"/v2/models/digits/ready", b"/v2/models/digits/infer"]
            for bogus_key in ("../../etc", "\u00b2\u00b3"):  # superscript digits pass str.isalnum()
                bogus = await call(app, "GET", f"{url}/ready", headers={"Cookie": f"sessionid={bogus_key}"})
                assert bogus.status == 401

    run(scenario)


def test_made_up_tokens_cost_no_query_and_do_not_flush_the_cache(
    people: dict[str, Person], gateway_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = people["alice"]
    lookups: list[str] = []
    top_ups: list[int] = []
    real_authenticate, real_tokens_after = access.authenticate_token, access._tokens_after
    monkeypatch.setattr(access, "authenticate_token", lambda raw: lookups.append(raw) or real_authenticate(raw))
    monkeypatch.setattr(access, "_tokens_after", lambda pk: top_ups.append(pk) or real_tokens_after(pk))

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, alice, "digits-prod", upstream.url)
            app = gateway_app()
            app.access.tokens.max_size = 50
            url = "/serve/digits-prod/v2/health/ready"
            assert (await call(app, "GET", url, token=alice.token)).status == 200
            assert len(lookups) == 1
            made_up = [f"mp_{secrets.token_hex(4)}_{secrets.token_urlsafe(32)}" for _ in range(300)]
            replies = await asyncio.gather(*(call(app, "GET", url, token=t) for t in made_up))
            assert {r.status for r in replies} == {401}
            assert len(lookups) == 1  # not one query per made-up token
            assert len(top_ups) <= 5  # shared top-ups of the known prefixes, at most one per 0.1 s
            assert alice.token in app.access.tokens.entries  # still cached: the flood flushed nothing
            garbage = await call(app, "GET", url, token="not-even-a-token")
            assert garbage.status == 401 and len(lookups) == 1

    run(scenario)


def test_a_token_minted_a_moment_ago_works_at_once_and_a_revoked_one_stops(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    settings.GATEWAY_CACHE_TTL_SECONDS = 0.1
    alice = people["alice"]

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, alice, "digits-prod", upstream.url)
            app = gateway_app()
            url = "/serve/digits-prod/v2/health/ready"
            assert (await call(app, "GET", url, token=alice.token)).status == 200  # the known prefixes are loaded
            token, raw = await asyncio.to_thread(ApiToken.issue, alice.user, alice.team, "new")
            assert (await call(app, "GET", url, token=raw)).status == 200
            await asyncio.to_thread(token.revoke)
            await asyncio.sleep(0.15)
            assert (await call(app, "GET", url, token=raw)).status == 401

    run(scenario)


def test_a_token_created_by_a_revoked_token_stops_at_the_gateway(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    """Issue 30: a CI token (scope "tokens") mints a token through the API; revoking the CI token stops both."""
    from rest_framework.test import APIClient

    from accounts import actions

    settings.GATEWAY_CACHE_TTL_SECONDS = 0.1
    alice = people["alice"]

    def mint() -> tuple[ApiToken, str]:
        ci, ci_raw = actions.issue_token(alice.user, alice.team, name="ci", scopes=["tokens"], by=alice.user,
                                         via="session")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {ci_raw}")
        created = client.post("/api/v1/tokens/", {"name": "minted"}, format="json")
        assert created.status_code == 201
        return ci, created.json()["token"]

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, alice, "digits-prod", upstream.url)
            app = gateway_app()
            url = "/serve/digits-prod/v2/health/ready"
            ci, minted = await asyncio.to_thread(mint)
            assert (await call(app, "GET", url, token=minted)).status == 200
            await asyncio.to_thread(lambda: actions.revoke_token(ci, by=alice.user, via="session"))
            deadline = asyncio.get_running_loop().time() + 30
            while (status := (await call(app, "GET", url, token=minted)).status) != 401:
                assert status == 200 and asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            assert (await call(app, "GET", url, token=alice.token)).status == 200  # not a descendant

    run(scenario)


def test_never_seen_credentials_get_a_bounded_number_of_lookups(
    people: dict[str, Person], gateway_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A teammate who knows a real prefix can make up secrets for it: those lookups are budgeted."""
    alice = people["alice"]
    lookups: list[str] = []
    real_authenticate = access.authenticate_token
    monkeypatch.setattr(access, "authenticate_token", lambda raw: lookups.append(raw) or real_authenticate(raw))

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, alice, "digits-prod", upstream.url)
            app = gateway_app()
            app.access.new_keys = Budget(rate=1.0, burst=10)
            prefix = alice.token.split("_")[1]
            guesses = [f"mp_{prefix}_{secrets.token_urlsafe(32)}" for _ in range(100)]
            replies = await asyncio.gather(*(call(app, "GET", "/serve/digits-prod/v2", token=t) for t in guesses))
            assert {r.status for r in replies} == {401}
            assert len(lookups) <= 11

    run(scenario)


def test_the_cache_evicts_the_oldest_entries_not_everything() -> None:
    async def scenario() -> None:
        loads: list[int] = []

        async def loader(key: int) -> str:
            loads.append(key)
            return f"v{key}"

        cache: TtlCache[int, str] = TtlCache(0.2, loader, max_size=100)
        for key in range(100):
            await cache.get(key)
        await asyncio.sleep(0.25)
        await cache.get(0)  # in use: reloaded when it expires, and so the newest again
        await cache.get(100)  # full: the oldest tenth goes, nothing else
        assert len(cache.entries) == 91
        assert 0 in cache.entries and 1 not in cache.entries and 10 not in cache.entries and 11 in cache.entries
        assert await cache.get(100) == "v100" and loads.count(100) == 1

    run(scenario)


def test_a_cached_answer_stands_in_while_the_database_is_down() -> None:
    async def scenario() -> None:
        database_up = True

        async def loader(key: str) -> str:
            if not database_up:
                raise OperationalError("connection refused")
            return "route"

        cache: TtlCache[str, str] = TtlCache(0.01, loader)
        assert await cache.get("digits-prod") == "route"
        database_up = False
        await asyncio.sleep(0.02)
        assert await cache.get("digits-prod") == "route"  # stale, but the deployment keeps serving
        with pytest.raises(OperationalError):
            await cache.get("never-seen")

    run(scenario)


def test_a_shared_lookup_that_fails_fails_for_every_waiter_and_is_not_cached() -> None:
    async def scenario() -> None:
        calls = 0

        async def loader(key: str) -> str:
            nonlocal calls
            calls += 1
            await asyncio.sleep(0.01)
            if calls == 1:
                raise ValueError("boom")
            return "ok"

        cache: TtlCache[str, str] = TtlCache(60, loader)
        results = await asyncio.gather(cache.get("k"), cache.get("k"), return_exceptions=True)
        assert [type(r) for r in results] == [ValueError, ValueError] and calls == 1
        assert await cache.get("k") == "ok"

    run(scenario)


def test_with_the_database_down_cached_routes_keep_serving_and_the_rest_is_503(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    settings.GATEWAY_CACHE_TTL_SECONDS = 0.05
    alice = people["alice"]

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, alice, "digits-prod", upstream.url)
            app = gateway_app()
            assert (await call(app, "GET", "/serve/digits-prod/v2", token=alice.token)).status == 200

            async def database_down(key: Any) -> Any:
                raise OperationalError("could not connect to server")

            app.access.routes.loader = database_down
            app.access.tokens.loader = database_down
            await asyncio.sleep(0.1)  # every cached answer has expired
            assert (await call(app, "GET", "/serve/digits-prod/v2", token=alice.token)).status == 200
            unknown = await call(app, "GET", "/serve/other/v2", token=alice.token)
            assert unknown.status == 503 and "database is unreachable" in unknown.json()["error"]
            assert unknown.headers[b"retry-after"] == b"5"

    run(scenario)


class _Clock:
    """time.monotonic for the cache under test, moved by hand (asyncio keeps the real one)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _GatedLoader:
    """Answers v1, v2, ...: the first at once, each later one only when `release` is set."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.fail_with: Exception | None = None

    async def __call__(self, key: str) -> str:
        self.calls += 1
        if self.calls > 1:
            await self.release.wait()
        if self.fail_with is not None:
            raise self.fail_with
        return f"v{self.calls}"


async def _refreshed(cache: TtlCache[str, str]) -> None:
    await asyncio.gather(*cache.refreshes)


@pytest.fixture
def cache_clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(access, "time", clock)
    return clock


async def _cached(loader: _GatedLoader) -> TtlCache[str, str]:
    """A cache of ttl 1 s holding the loader's first answer for "k"."""
    cache: TtlCache[str, str] = TtlCache(1.0, loader)
    assert await cache.get("k") == "v1"
    return cache


async def _refresh_held(cache: TtlCache[str, str], clock: _Clock) -> None:
    """Into the answer's second half: a use starts its refresh, which the loader holds."""
    clock.now += 0.8
    assert await cache.get("k") == "v1"


def test_an_answer_near_its_expiry_is_served_at_once_while_it_is_looked_up_again(cache_clock: _Clock) -> None:
    clock = cache_clock

    async def scenario() -> None:
        loader = _GatedLoader()
        cache = await _cached(loader)
        clock.now += 0.4
        assert await cache.get("k") == "v1" and loader.calls == 1  # young: no lookup
        clock.now += 0.2
        # In the second half of its ttl: the caller does not wait for the lookup (the loader is held), and one
        # lookup is in flight however many callers come.
        assert await asyncio.wait_for(cache.get("k"), 1) == "v1"
        assert await asyncio.wait_for(cache.get("k"), 1) == "v1"
        await asyncio.sleep(0)
        assert loader.calls == 2
        loader.release.set()
        await _refreshed(cache)
        assert await cache.get("k") == "v2" and loader.calls == 2

    run(scenario)


def test_a_refreshed_answer_is_never_served_past_its_ttl(cache_clock: _Clock) -> None:
    clock = cache_clock

    async def scenario() -> None:
        loader = _GatedLoader()
        cache = await _cached(loader)
        await _refresh_held(cache, clock)
        clock.now += 0.3  # expired while the lookup is still in flight: a revocation's bound holds
        waiting = asyncio.ensure_future(cache.get("k"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done()
        loader.release.set()
        assert await waiting == "v2" and loader.calls == 2

    run(scenario)


def test_a_refresh_that_fails_keeps_the_answer_until_it_expires_and_is_not_retried_before(cache_clock: _Clock) -> None:
    clock = cache_clock

    async def scenario() -> None:
        loader = _GatedLoader()
        cache = await _cached(loader)
        stored = cache.entries["k"]
        loader.fail_with = ValueError("boom")
        loader.release.set()
        clock.now += 0.8
        assert await cache.get("k") == "v1"
        await _refreshed(cache)
        assert loader.calls == 2 and cache.entries["k"] == stored  # nothing stored, the expiry unchanged
        clock.now += 0.1
        # Within its ttl still: served, and not looked up again (a failing database is not asked once a request).
        assert await cache.get("k") == "v1"
        assert not cache.refreshes and loader.calls == 2
        clock.now += 0.2  # expired: the caller's own lookup, and its error
        with pytest.raises(ValueError, match="boom"):
            await cache.get("k")
        assert loader.calls == 3

    run(scenario)


def test_a_caller_past_the_expiry_waits_for_the_refresh_and_gets_the_stale_answer_if_the_database_is_down(
        cache_clock: _Clock) -> None:
    clock = cache_clock

    async def scenario() -> None:
        loader = _GatedLoader()
        cache = await _cached(loader)
        await _refresh_held(cache, clock)
        clock.now += 0.3
        waiting = asyncio.ensure_future(cache.get("k"))  # expired: it waits for the refresh in flight
        await asyncio.sleep(0)
        loader.fail_with = OperationalError("connection refused")
        loader.release.set()
        assert await waiting == "v1" and loader.calls == 2

    run(scenario)


def test_a_failing_query_on_a_database_that_is_up_never_serves_an_expired_answer() -> None:
    async def scenario() -> None:
        from django.db import ProgrammingError

        failing = False

        async def loader(key: str) -> str:
            if failing:  # a migration half applied: the database answers, the query fails
                raise ProgrammingError('column "revoked_at" does not exist')
            return "caller"

        cache: TtlCache[str, str] = TtlCache(0.01, loader)
        assert await cache.get("token") == "caller"
        failing = True
        await asyncio.sleep(0.02)
        with pytest.raises(ProgrammingError):
            await cache.get("token")  # not the stale answer: it may be a revoked token's

    run(scenario)


def test_an_invalidated_key_is_looked_up_afresh_and_a_lookup_in_flight_is_not_stored(cache_clock: _Clock) -> None:
    clock = cache_clock

    async def scenario() -> None:
        state = "unloaded"
        release = asyncio.Event()
        calls = 0

        async def loader(key: str) -> str:
            nonlocal calls
            calls += 1
            seen = state  # what the database said when the lookup read it
            if calls == 2:
                await release.wait()
            return seen

        cache: TtlCache[str, str] = TtlCache(1.0, loader)
        assert await cache.get("route") == "unloaded"
        clock.now += 0.8
        assert await cache.get("route") == "unloaded"  # a refresh reads "unloaded" and is held
        await asyncio.sleep(0)
        state = "loaded"  # the cold start loaded the models, and says so (gateway/cold_start.py)
        cache.invalidate("route")
        assert await cache.get("route") == "loaded" and calls == 3  # its own lookup, not the refresh's answer
        release.set()
        await _refreshed(cache)
        assert await cache.get("route") == "loaded" and cache.entries["route"][1] == "loaded"

    run(scenario)
