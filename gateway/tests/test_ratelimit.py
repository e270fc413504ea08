"""Rate limits that hold: per user and team whatever they authenticate with (tokens minted and browser sessions
share one budget), and shared by the web processes through Redis when it is configured.

The Redis tests use a real Redis (TEST_REDIS_URL, by default db 5 of the one on 127.0.0.1) and skip, saying so,
when none answers."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from accounts.models import ApiToken
from gateway.ratelimit import RateLimiter
from gateway.tests.fake_upstream import FakeUpstream
from tests.support.gateway_calls import call, make_deployment, run
from tests.support.people import Person, browser_cookies

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/5")


class Clock:
    """The limiter's monotonic clock, moved only by the test: a loaded machine's pause between two checks must not
    refill the bucket under the test's feet."""

    def __init__(self) -> None:
        self.now = 1024.0

    def monotonic(self) -> float:
        return self.now


def test_the_bucket_allows_a_burst_then_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway import ratelimit

    clock = Clock()
    monkeypatch.setattr(ratelimit, "time", clock)
    limiter = RateLimiter(rate=8, burst=3)  # binary fractions of a second: exact sums
    assert [limiter.check("k") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.check("k") == 0.125  # empty: one request's worth at 8/s
    clock.now += 0.0625
    assert limiter.check("k") == 0.0625  # half refilled
    clock.now += 0.0625
    assert limiter.check("k") == 0.0  # one refilled: admitted
    assert limiter.check("k") == 0.125
    assert limiter.check("other") == 0.0
    assert RateLimiter(rate=0, burst=1).check("k") == 0.0  # 0 turns it off


def test_tokens_and_the_browser_session_of_one_user_share_one_limit(
    people: dict[str, Person], gateway_app: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway import ratelimit

    # A stopped clock: no refill however slowly the requests go. And the limit of this process only (CI configures
    # Redis, whose own clock would refill the shared level): sharing through Redis is the tests' below.
    monkeypatch.setattr(ratelimit, "time", Clock())
    settings.REDIS_URL = ""
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


async def synced(limiter: RateLimiter, seconds: float = 10) -> None:
    """One sync that reached Redis: a sync gives up after REDIS_TIMEOUT_SECONDS (as it should in production, where
    the request path must not wait), which a loaded machine can exceed; the next one is the retry."""
    deadline = time.monotonic() + seconds
    while True:
        await limiter.sync()
        if not limiter.redis_failing:
            return
        assert time.monotonic() < deadline, "no sync reached Redis"
        await asyncio.sleep(0.05)


async def until(condition: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_two_processes_share_one_limit_through_redis() -> None:
    redis_or_skip()
    key = ("test", uuid.uuid4().hex)

    async def scenario() -> None:
        # Redis's clock refills the shared level: slowly enough (one request in 20 s) that a loaded machine's
        # syncs do not give the spent burst back before the checks below.
        first = RateLimiter(rate=0.05, burst=10, redis_url=REDIS_URL)
        second = RateLimiter(rate=0.05, burst=10, redis_url=REDIS_URL)
        try:
            assert [first.check(key) for _ in range(10)] == [0.0] * 10
            await synced(first)
            # The other process learns the shared level at its first sync: its own requests then count against
            # what the first one used.
            assert second.check(key) == 0.0
            await synced(second)
            assert second.check(key) > 0
            await synced(first)
            assert first.check(key) > 0
        finally:
            await first.close()
            await second.close()

    run(scenario)


def test_a_limiter_with_redis_down_keeps_limiting_in_its_process(caplog: pytest.LogCaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from deployments.runtimes.local.triton import pick_free_ports
    from gateway import ratelimit

    # Stopped: at 1/s a second of failed syncs (importing the Redis client the first time, on a loaded machine)
    # refilled the bucket before the check that must be limited.
    monkeypatch.setattr(ratelimit, "time", Clock())

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
            assert limiter.syncer is not None
            # The background sync runs every SYNC_SECONDS; on a loaded machine its first one (connecting to Redis)
            # may time out and is simply tried again.
            await until(lambda: not limiter.buckets[key].unsynced and not limiter.buckets[key].fresh)
        finally:
            await limiter.close()

    run(scenario)
