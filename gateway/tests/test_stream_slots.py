"""Stream slots per team that hold across the gateway's processes (issue 33): decided in the process, shared through
Redis, per process while Redis is away.

The Redis tests use a real Redis (TEST_STREAM_SLOTS_REDIS_URL, by default db 7 of the one on 127.0.0.1, under a key
prefix of the test's own that it deletes after) and skip, saying so, when none answers. Each StreamSlots stands for
one process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from gateway import stream_slots
from gateway.protocol import Refusal
from gateway.stream_slots import StreamSlots
from gateway.tests.stream_slots_support import processes, redis_or_skip, synced
from tests.support.gateway_calls import run

ACME, GLOBEX = 1, 2


def refusal(slots: StreamSlots, team_id: int = ACME, team: str = "acme") -> Refusal:
    with pytest.raises(Refusal) as refused, slots.hold(team_id, team):
        pass
    return refused.value


class Clock:
    """The slots' monotonic clock, moved only by the test."""

    def __init__(self) -> None:
        self.now = 1024.0

    def monotonic(self) -> float:
        return self.now


def test_a_team_past_its_streams_is_refused_in_words_and_other_teams_are_not_touched() -> None:
    slots = StreamSlots(2)
    with contextlib.ExitStack() as held:
        held.enter_context(slots.hold(ACME, "acme"))
        held.enter_context(slots.hold(ACME, "acme"))
        refused = refusal(slots)
        assert (refused.status, refused.headers) == (429, {"Retry-After": "1"})
        assert refused.message == ("Team 'acme' has 2 streams open, the most it may have "
                                   "(GATEWAY_MAX_STREAMS_PER_TEAM=2): close one, or retry when one ends.")
        with slots.hold(GLOBEX, "globex"):
            assert slots.open == {ACME: 2, GLOBEX: 1}
    assert slots.open == {}  # no entry kept per team that ever streamed
    with contextlib.ExitStack() as held:
        for _ in range(100):
            held.enter_context(StreamSlots(0).hold(ACME, "acme"))  # 0: no limit


def test_the_other_processes_streams_count_against_the_team() -> None:
    slots = StreamSlots(3)
    slots.others = {ACME: 2}  # what the last sync answered
    with slots.hold(ACME, "acme"):
        assert refusal(slots).message.startswith("Team 'acme' has 3 streams open")
        with slots.hold(GLOBEX, "globex"):
            pass
    slots.others = {ACME: 3}
    assert refusal(slots).message.startswith("Team 'acme' has 3 streams open")


def test_with_redis_unreachable_the_others_last_totals_count_until_they_would_have_expired(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deployments.runtimes.local.triton import pick_free_ports

    clock = Clock()
    monkeypatch.setattr(stream_slots, "time", clock)
    slots = StreamSlots(2, redis_url=f"redis://127.0.0.1:{pick_free_ports(1)[0]}/0")

    async def scenario() -> None:
        try:
            slots.others, slots.others_at = {ACME: 1}, clock.now  # the last sync that reached Redis
            await slots.sync()
            assert slots.redis_failing and slots.others == {ACME: 1}  # one failed sync does not open the gate
            clock.now += stream_slots.EXPIRE_SECONDS + 0.1
            await slots.sync()
            assert slots.others == {}  # per process now
            with slots.hold(ACME, "acme"), slots.hold(ACME, "acme"):
                assert refusal(slots).status == 429  # the limit still holds in this process
        finally:
            await slots.close()

    with caplog.at_level(logging.WARNING, logger="gateway.stream_slots"):
        run(scenario)
    assert sum("per process while Redis is unreachable" in r.message for r in caplog.records) == 1  # once


def test_the_web_and_grpc_gateways_count_streams_through_the_rate_limits_redis(settings: Any, gateway_app: Any) -> None:
    from gateway.grpc_app import GrpcGateway

    settings.REDIS_URL = "redis://redis.example:6379/3"
    settings.GATEWAY_MAX_STREAMS_PER_TEAM = 5
    for gateway in (gateway_app(), GrpcGateway()):
        assert (gateway.streams.limit, gateway.streams.redis_url) == (5, settings.REDIS_URL)
        assert gateway.limiter.redis_url == settings.REDIS_URL
    settings.GATEWAY_MAX_STREAMS_PER_TEAM = 0
    assert GrpcGateway().streams.redis_url == ""  # no limit: nothing to share


async def until(condition: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_two_processes_share_the_teams_streams_through_redis() -> None:
    redis_or_skip()

    async def scenario() -> None:
        async with processes(2, limit=3) as (first, second):
            with contextlib.ExitStack() as held:
                held.enter_context(first.hold(ACME, "acme"))
                held.enter_context(first.hold(ACME, "acme"))
                await synced(first, second)
                assert second.others == {ACME: 2}
                held.enter_context(second.hold(ACME, "acme"))
                assert refusal(second).message == (
                    "Team 'acme' has 3 streams open, the most it may have (GATEWAY_MAX_STREAMS_PER_TEAM=3): close "
                    "one, or retry when one ends.")
                with second.hold(GLOBEX, "globex"):  # another team is not touched
                    await synced(second, first)
                    assert first.others == {ACME: 1, GLOBEX: 1}
                    assert refusal(first).message.startswith("Team 'acme' has 3 streams open")
            # Streams that end give their slots back in the other process too.
            await synced(first, second, first)
            assert (first.others, second.others) == ({}, {})
            with second.hold(ACME, "acme"):
                pass
            # The background sync, started by the first stream, keeps the others' totals fresh by itself.
            assert first.syncer is not None and second.syncer is not None
            with first.hold(ACME, "acme"):
                await until(lambda: second.others == {ACME: 1})

    run(scenario)


def test_a_process_that_stops_publishing_stops_counting_after_the_expiry() -> None:
    redis_or_skip()

    async def scenario() -> None:
        async with processes(3, limit=2) as (crashed, closed, survivor):
            with crashed.hold(ACME, "acme"), closed.hold(GLOBEX, "globex"):
                await synced(crashed, closed, survivor)
                assert survivor.others == {ACME: 1, GLOBEX: 1}
                # A process that stops cleanly takes its streams with it at once.
                await closed.close()
                await synced(survivor)
                assert survivor.others == {ACME: 1}
                # One that dies (its sync stops, its streams were never closed) counts until its hash expires.
                assert crashed.syncer is not None
                crashed.syncer.cancel()
                stopped = time.monotonic()

                async def forgotten() -> None:
                    while survivor.others:
                        await asyncio.sleep(0.05)
                        await synced(survivor)

                await asyncio.wait_for(forgotten(), 10)
                assert time.monotonic() - stopped >= stream_slots.EXPIRE_SECONDS - 2 * stream_slots.SYNC_SECONDS
                with survivor.hold(ACME, "acme"), survivor.hold(ACME, "acme"):
                    assert refusal(survivor).status == 429

    run(scenario)

