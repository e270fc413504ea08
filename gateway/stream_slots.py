"""Stream slots: the streams a team may have open at once, GATEWAY_MAX_STREAMS_PER_TEAM (issue 33), across all the
gateway's processes (the web workers and the gRPC gateway).

A stream holds a connection, a Triton slot and gateway memory for as long as its model and caller let it, so one
team's streams must not take all of them. Every decision is local and O(1), as the rate limiter's are
(gateway/ratelimit.py): no network round trip per stream. With Redis configured, each process sends its teams' open
counts every SYNC_SECONDS in one round trip (a script that replaces the process's counts, which stop counting
EXPIRE_SECONDS later unless sent again, and answers the totals per team of all the live processes); a stream is
admitted while this process's count plus the others' last known total is under the limit. So the limit holds across
processes, give or take the streams the processes open within one sync interval; a process that crashes stops
counting EXPIRE_SECONDS after its last sync, one that stops cleanly at once. A Redis that is down or slow makes the
limit per process until it is back (the others' last totals are trusted for EXPIRE_SECONDS, as long as their
streams would still count in Redis).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

from gateway.protocol import Refusal

log = logging.getLogger(__name__)

SYNC_SECONDS = 0.1
# A few sync intervals: a process whose event loop stalls for a moment is not forgotten by the others, one that
# crashed stops counting within a second.
EXPIRE_SECONDS = 1.0
REDIS_TIMEOUT_SECONDS = 0.25
KEEP_SECONDS = 60.0  # the keys' own expiry: everything is gone this long after the last process stopped
KEY_PREFIX = "modelport:gateway:streams:"

# The shared state, kept consistent by one script run atomically: a sorted set of the live processes (those with streams
# open, scored by when their counts expire), each one's hash of team -> open streams, and the totals per team over all
# of them, kept up to date by each process's change rather than summed on each sync. Summing every process's hash on
# every sync reads 10 x P^2 x T fields a second (P processes, T teams streaming in each): at 32 processes with 100 teams
# each that took Redis 1.37 ms of CPU a sync, 44% of a core; kept by change, 0.33 ms (11%): a sync's cost follows the
# teams streaming, not the number of processes. A dead process is reaped by the next sync of any other: its counts are
# taken off the totals. Any key lost (a Redis restarted without persistence, an eviction) is noticed (a member without a
# hash, a total below zero, no totals) and the totals are summed again from the hashes, once.
#
# KEYS[1]: the registry; KEYS[2]: the totals; KEYS[3]: this process's hash. ARGV[1]: how long its counts count
# (ms); ARGV[2]: how long the keys are kept (ms, well above ARGV[1], so that a dead process's hash is still there to
# be taken off); then team, count pairs (none: nothing open). Answers the totals, this process's counts included, as
# team, count pairs. Redis's own clock, so that the processes' clocks need not agree. The other processes' hashes
# are named by the registry (a single Redis, as the rate limiter's; not a cluster).
SYNC_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
local rebuild = redis.call('EXISTS', KEYS[2]) == 0
if redis.call('ZSCORE', KEYS[1], KEYS[3]) and redis.call('EXISTS', KEYS[3]) == 0 then
  rebuild = true
end
for _, key in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  if key ~= KEYS[3] then
    local counts = redis.call('HGETALL', key)
    if #counts == 0 then
      rebuild = true
    end
    for i = 1, #counts, 2 do
      local left = redis.call('HINCRBY', KEYS[2], counts[i], -tonumber(counts[i + 1]))
      if left < 0 then
        rebuild = true
      elseif left == 0 then
        redis.call('HDEL', KEYS[2], counts[i])
      end
    end
    redis.call('DEL', key)
    redis.call('ZREM', KEYS[1], key)
  end
end
if rebuild then
  redis.call('DEL', KEYS[2])
  for _, key in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    local counts = redis.call('HGETALL', key)
    if #counts == 0 then
      redis.call('ZREM', KEYS[1], key)
    end
    for i = 1, #counts, 2 do
      redis.call('HINCRBY', KEYS[2], counts[i], tonumber(counts[i + 1]))
    end
  end
end
local change = {}
local old = redis.call('HGETALL', KEYS[3])
for i = 1, #old, 2 do
  change[old[i]] = -tonumber(old[i + 1])
end
for i = 3, #ARGV, 2 do
  change[ARGV[i]] = (change[ARGV[i]] or 0) + tonumber(ARGV[i + 1])
end
for team, by in pairs(change) do
  if by ~= 0 and redis.call('HINCRBY', KEYS[2], team, by) <= 0 then
    redis.call('HDEL', KEYS[2], team)
  end
end
redis.call('DEL', KEYS[3])
if #ARGV > 2 then
  for i = 3, #ARGV, 2 do
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  end
  redis.call('PEXPIRE', KEYS[3], keep)
  redis.call('ZADD', KEYS[1], now + ttl, KEYS[3])
else
  redis.call('ZREM', KEYS[1], KEYS[3])
end
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[2], keep)
return redis.call('HGETALL', KEYS[2])
"""


class StreamSlots:
    """The streams each team has open, at most `limit` (0: no limit) across the processes sharing `redis_url`, or in
    this process without it. `open` holds this process's counts and `others` the other processes' last known
    totals, both only for teams with streams open: no entry is kept per team that ever streamed."""

    def __init__(self, limit: int, redis_url: str = "", key_prefix: str = KEY_PREFIX) -> None:
        self.limit = limit
        self.open: dict[int, int] = {}
        self.others: dict[int, int] = {}
        self.others_at = 0.0  # monotonic time of the last sync that answered the others' totals
        self.redis_url = redis_url if limit > 0 else ""
        self.registry = key_prefix + "processes"
        self.totals = key_prefix + "totals"
        self.key = f"{key_prefix}process:{uuid.uuid4().hex}"
        self.redis: Any = None
        self.script: Any = None
        self.syncer: asyncio.Task[None] | None = None
        self.redis_failing = False

    @contextlib.contextmanager
    def hold(self, team_id: int, team: str) -> Iterator[None]:
        mine = self.open.get(team_id, 0)
        held = mine + self.others.get(team_id, 0)
        if self.limit and held >= self.limit:
            raise Refusal(429, f"Team '{team}' has {held} streams open, the most it may have "
                               f"(GATEWAY_MAX_STREAMS_PER_TEAM={self.limit}): close one, or retry when one ends.",
                          {"Retry-After": "1"})
        if self.redis_url and self.syncer is None:
            self.syncer = asyncio.get_running_loop().create_task(self._sync_forever())
        self.open[team_id] = mine + 1
        try:
            yield
        finally:
            left = self.open[team_id] - 1
            if left:
                self.open[team_id] = left
            else:
                del self.open[team_id]  # no entry kept per team that ever streamed

    async def _sync_forever(self) -> None:
        # Also while this process has nothing open: its view of the others' streams stays fresh for the next one.
        while True:
            await asyncio.sleep(SYNC_SECONDS)
            await self.sync()

    async def sync(self) -> None:
        """Publish this process's open counts; take the other live processes' totals as the others' ones."""
        await self._sync(dict(self.open))

    async def _sync(self, sent: dict[int, int]) -> None:
        counts = [str(part) for team_id, n in sent.items() for part in (team_id, n)]
        try:
            if self.redis is None:
                import redis.asyncio as aioredis

                self.redis = aioredis.Redis.from_url(self.redis_url, socket_timeout=REDIS_TIMEOUT_SECONDS,
                                                     socket_connect_timeout=REDIS_TIMEOUT_SECONDS)
                self.script = self.redis.register_script(SYNC_SCRIPT)
            async with asyncio.timeout(REDIS_TIMEOUT_SECONDS * 2):
                totals = await self.script(keys=[self.registry, self.totals, self.key],
                                           args=[int(EXPIRE_SECONDS * 1000), int(KEEP_SECONDS * 1000), *counts])
        except Exception as exc:  # noqa: BLE001 - any Redis trouble: keep counting locally, try again later
            if not self.redis_failing:
                log.warning("stream slots are per process while Redis is unreachable: %r", exc)
            self.redis_failing = True
            # Past the expiry the others' streams would no longer count in Redis either.
            if self.others and time.monotonic() - self.others_at > EXPIRE_SECONDS:
                self.others = {}
            return
        if self.redis_failing:
            log.warning("stream slots are shared through Redis again")
            self.redis_failing = False
        # The totals include what this process sent, which is `sent` however many streams came and went since.
        others = {}
        for i in range(0, len(totals), 2):
            team_id = int(totals[i])
            n = int(totals[i + 1]) - sent.get(team_id, 0)
            if n > 0:
                others[team_id] = n
        self.others = others
        self.others_at = time.monotonic()

    async def close(self) -> None:
        """Stop syncing; this process's streams stop counting for the others at once, not at the expiry."""
        if self.syncer is not None:
            self.syncer.cancel()
            with contextlib.suppress(BaseException):
                await self.syncer
            self.syncer = None
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self._sync({})  # the streams still open end with the process
            with contextlib.suppress(Exception):
                await self.redis.aclose()
            self.redis = None
