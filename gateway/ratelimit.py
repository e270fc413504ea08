"""Rate limiting per (user, team): a token bucket of GATEWAY_RATE_LIMIT_PER_SECOND requests per second with bursts
of GATEWAY_RATE_LIMIT_BURST, the same for API tokens and browser sessions, so that minting more tokens does not
buy more requests.

Every decision is local and O(1): no network round trip per request. With Redis configured, each process adds up
what it let through and sends it every SYNC_SECONDS in one pipelined round trip; a Lua script keeps the one shared
bucket per key and answers its level, which becomes the process's local level. So the limit holds across web
processes, give or take what the processes admit within one sync interval (at most a burst each), and a Redis
that is down or slow only makes the limit per-process until it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

SYNC_SECONDS = 0.05
REDIS_TIMEOUT_SECONDS = 0.25
MAX_KEYS = 100_000
KEY_PREFIX = "modelport:gateway:ratelimit:"

# KEYS[1]: the bucket; ARGV: rate, burst, requests admitted since the last sync. Returns the level after them.
# Redis's own clock, so that the web processes' clocks need not agree. The debt is bounded by one burst.
SYNC_SCRIPT = """
local rate, burst, used = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'level', 'at')
local level = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
level = math.max(-burst, math.min(burst, level + math.max(0, now - at) * rate) - used)
redis.call('HSET', KEYS[1], 'level', tostring(level), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 60)
return tostring(level)
"""


@dataclass
class _Bucket:
    level: float
    updated: float
    unsynced: int = 0  # admitted since the last sync with Redis
    fresh: bool = True  # not synced yet: the next sync fetches the shared level even if nothing was admitted


class RateLimiter:
    def __init__(self, rate: float, burst: int, redis_url: str = "") -> None:
        self.rate = rate  # requests per second; 0 turns limiting off
        self.burst = float(max(1, burst))
        self.buckets: dict[Any, _Bucket] = {}
        self.redis_url = redis_url if rate > 0 else ""
        self.redis: Any = None
        self.script: Any = None
        self.syncer: asyncio.Task[None] | None = None
        self.redis_failing = False

    def check(self, key: Any) -> float:
        """0 when the request may go ahead, else the seconds to wait before the next one would."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        bucket = self.buckets.get(key)
        if bucket is None:
            if len(self.buckets) >= MAX_KEYS:
                self._forget_idle(now)
            bucket = self.buckets[key] = _Bucket(level=self.burst, updated=now, fresh=bool(self.redis_url))
            if self.redis_url and self.syncer is None:
                self.syncer = asyncio.get_running_loop().create_task(self._sync_forever())
        bucket.level = min(self.burst, bucket.level + (now - bucket.updated) * self.rate)
        bucket.updated = now
        if bucket.level >= 1.0:
            bucket.level -= 1.0
            bucket.unsynced += 1
            return 0.0
        return (1.0 - bucket.level) / self.rate

    def _forget_idle(self, now: float) -> None:
        # A bucket that has refilled completely holds nothing worth keeping.
        full = [key for key, b in self.buckets.items()
                if not b.unsynced and not b.fresh and b.level + (now - b.updated) * self.rate >= self.burst]
        for key in full:
            del self.buckets[key]
        if len(self.buckets) >= MAX_KEYS:
            for key in list(self.buckets)[: MAX_KEYS // 10]:
                del self.buckets[key]

    async def _sync_forever(self) -> None:
        while True:
            await asyncio.sleep(SYNC_SECONDS)
            await self.sync()

    async def sync(self) -> None:
        """Send what this process admitted since the last sync; take the shared levels as the local ones."""
        dirty = [(key, bucket, bucket.unsynced) for key, bucket in self.buckets.items()
                 if bucket.unsynced or bucket.fresh]
        if not dirty:
            return
        try:
            if self.redis is None:
                import redis.asyncio as aioredis

                self.redis = aioredis.Redis.from_url(self.redis_url, socket_timeout=REDIS_TIMEOUT_SECONDS,
                                                     socket_connect_timeout=REDIS_TIMEOUT_SECONDS)
                self.script = self.redis.register_script(SYNC_SCRIPT)
            async with asyncio.timeout(REDIS_TIMEOUT_SECONDS * 2):
                async with self.redis.pipeline(transaction=False) as pipe:
                    for key, _, used in dirty:
                        await self.script(keys=[_redis_key(key)], args=[self.rate, self.burst, used], client=pipe)
                    levels = await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - any Redis trouble: keep limiting locally, try again later
            if not self.redis_failing:
                log.warning("rate limits are per process while Redis is unreachable: %r", exc)
            self.redis_failing = True
            return
        if self.redis_failing:
            log.warning("rate limits are shared through Redis again")
            self.redis_failing = False
        now = time.monotonic()
        for (_, bucket, used), level in zip(dirty, levels, strict=True):
            bucket.unsynced -= used
            bucket.fresh = False
            # Admitted here since the script ran are not in the shared level yet.
            bucket.level = float(level) - bucket.unsynced
            bucket.updated = now

    async def close(self) -> None:
        if self.syncer is not None:
            self.syncer.cancel()
            with contextlib.suppress(BaseException):
                await self.syncer
            self.syncer = None
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.sync()
                await self.redis.aclose()
            self.redis = None


def _redis_key(key: Any) -> str:
    if isinstance(key, tuple):
        return KEY_PREFIX + ":".join(str(part) for part in key)
    return KEY_PREFIX + str(key)


def retry_after_header(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))
