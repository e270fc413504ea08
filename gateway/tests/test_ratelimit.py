"""Rate limits that hold: per user and team whatever they authenticate with (tokens minted and browser sessions
share one budget), and shared by the web processes through Redis when it is configured.

The Redis tests use a real Redis (TEST_REDIS_URL, by default db 5 of the one on 127.0.0.1) and skip, saying so,
when none answers."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import Any

import pytest

from accounts.models import ApiToken
from conftest import Person
from gateway.ratelimit import RateLimiter
from gateway.tests.conftest import call, make_deployment, run
from gateway.tests.fake_upstream import FakeUpstream
from gateway.tests.test_access import browser_cookies

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/5")


def test_the_bucket_allows_a_burst_then_the_rate() -> None:
    limiter = RateLimiter(rate=10, burst=3)
    assert [limiter.check("k") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = limiter.check("k")
    assert 0.05 < wait <= 0.1
    assert limiter.check("other") == 0.0
    assert RateLimiter(rate=0, burst=1).check("k") == 0.0  # 0 turns it off


def test_tokens_and_the_browser_session_of_one_user_share_one_limit(
    people: dict[str, Person], gateway_app: Any, settings: Any
) -> None:
    settings.GATEWAY_RATE_LIMIT_PER_SECOND = 0.5
    settings.GATEWAY_RATE_LIMIT_BURST = 6
    alice, bob = people["alice"], people["bob"]
    cookies = browser_cookies(alice)
    minted = [ApiToken.issue(alice.user, alice.team, name=f"extra {n}")[1] for n in range(3)]

    async def scenario() -> None:
        async with FakeUpstream() as upstream:
            await asyncio.to_thread(make_deployment, alice, "digits-prod", upstream.url)
            app = gateway_app()
            url = "/serve/digits-prod/v2/health/ready"
            statuses = []
            for token in [alice.token, *minted, alice.token]:
                statuses.append((await call(app, "GET", url, token=token)).status)
            statuses.append((await call(app, "GET", url, headers={"Cookie": cookies})).status)
            assert statuses == [200] * 6
            for token in minted:
                limited = await call(app, "GET", url, token=token)
                assert limited.status == 429 and int(limited.headers[b"retry-after"]) >= 1
                assert "slow down" in limited.json()["error"]
            assert (await call(app, "GET", url, headers={"Cookie": cookies})).status == 429
            assert (await call(app, "GET", url, token=bob.token)).status == 200  # a teammate has a budget of their own

    run(scenario)


def redis_or_skip() -> None:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5).ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis at {REDIS_URL} ({exc}); set TEST_REDIS_URL")


def test_two_processes_share_one_limit_through_redis() -> None:
    redis_or_skip()
    key = ("test", uuid.uuid4().hex)

    async def scenario() -> None:
        first = RateLimiter(rate=0.5, burst=10, redis_url=REDIS_URL)
        second = RateLimiter(rate=0.5, burst=10, redis_url=REDIS_URL)
        try:
            assert [first.check(key) for _ in range(10)] == [0.0] * 10
            await first.sync()
            # The other process learns the shared level at its first sync: its own requests then count against
            # what the first one used.
            assert second.check(key) == 0.0
            await second.sync()
            assert second.check(key) > 0
            await first.sync()
            assert first.check(key) > 0
        finally:
            await first.close()
            await second.close()

    run(scenario)


def test_a_limiter_with_redis_down_keeps_limiting_in_its_process(caplog: pytest.LogCaptureFixture) -> None:
    from deployments.runtimes.local.triton import pick_free_ports

    unreachable = f"redis://127.0.0.1:{pick_free_ports(1)[0]}/0"

    async def scenario() -> None:
        limiter = RateLimiter(rate=1, burst=2, redis_url=unreachable)
        try:
            assert [limiter.check("k") for _ in range(2)] == [0.0, 0.0]
            await limiter.sync()
            await limiter.sync()
            assert limiter.check("k") > 0
        finally:
            await limiter.close()

    with caplog.at_level(logging.WARNING, logger="gateway.ratelimit"):
        run(scenario)
    assert sum("per process while Redis is unreachable" in r.message for r in caplog.records) == 1  # once


def test_a_redis_sync_adds_no_round_trip_to_a_request() -> None:
    """check() is synchronous: it cannot wait on Redis; syncing runs in its own task every SYNC_SECONDS."""
    redis_or_skip()
    key = ("test", uuid.uuid4().hex)

    async def scenario() -> None:
        limiter = RateLimiter(rate=100, burst=100, redis_url=REDIS_URL)
        try:
            for _ in range(50):
                assert limiter.check(key) == 0.0
            await asyncio.sleep(0.2)  # the background sync has run meanwhile
            assert limiter.syncer is not None and not limiter.buckets[key].unsynced
            assert not limiter.buckets[key].fresh
        finally:
            await limiter.close()

    run(scenario)
