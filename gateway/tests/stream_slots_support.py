"""Several StreamSlots sharing a real Redis, one for each gateway process a test stands for (the stream-slot tests:
test_stream_slots.py, test_stream_slots_totals.py, test_streams.py). TEST_STREAM_SLOTS_REDIS_URL, by default db 7 of
the one on 127.0.0.1, under a key prefix of each test's own that is deleted after; the tests skip, saying so, when
no Redis answers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from gateway.stream_slots import StreamSlots

REDIS_URL = os.environ.get("TEST_STREAM_SLOTS_REDIS_URL", "redis://127.0.0.1:6379/7")


def redis_or_skip() -> None:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5).ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis at {REDIS_URL} ({exc}); set TEST_STREAM_SLOTS_REDIS_URL")


@contextlib.asynccontextmanager
async def processes(count: int, limit: int) -> AsyncIterator[list[StreamSlots]]:
    """`count` gateway processes sharing the test's own keys in Redis, deleted after."""
    import redis.asyncio as aioredis

    prefix = f"test:stream-slots:{uuid.uuid4().hex}:"
    slots = [StreamSlots(limit, redis_url=REDIS_URL, key_prefix=prefix) for _ in range(count)]
    try:
        yield slots
    finally:
        for each in slots:
            await each.close()
        client = aioredis.Redis.from_url(REDIS_URL)
        keys = [key async for key in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def synced(*slots: StreamSlots, seconds: float = 10) -> None:
    """One sync of each that reached Redis: a sync gives up after REDIS_TIMEOUT_SECONDS (as it should in production),
    which a loaded machine can exceed; the next one is the retry."""
    deadline = time.monotonic() + seconds
    for each in slots:
        while True:
            await each.sync()
            if not each.redis_failing:
                break
            assert time.monotonic() < deadline, "no sync reached Redis"
            await asyncio.sleep(0.05)
