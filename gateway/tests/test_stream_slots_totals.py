"""The shared totals of the stream slots (gateway/stream_slots.py) against their plain definition, over a random
sequence of what befalls the processes, with the real Redis of gateway/tests/test_stream_slots.py (and its skip)."""

from __future__ import annotations

import random

import redis

from gateway.stream_slots import StreamSlots
from gateway.tests.stream_slots_support import REDIS_URL, processes, redis_or_skip, synced
from tests.support.gateway_calls import run


def test_the_shared_totals_are_the_sum_of_the_live_processes_counts_whatever_befalls_them() -> None:
    """The script keeps the totals per team by each process's change rather than summing every process's counts on
    each sync: after any sequence of changes, clean stops, crashes (a process whose counts expired, its score set in
    the past here rather than waited for) and keys lost (Redis restarted, a key evicted), once every process has
    synced twice each one's `others` is the sum of the other live processes' counts, the plain definition."""
    redis_or_skip()
    client = redis.Redis.from_url(REDIS_URL)
    rng = random.Random(33)

    async def scenario() -> None:
        async with processes(4, limit=10**6) as slots:
            live = list(slots)
            prefix = live[0].registry.removesuffix("processes")
            for step in range(60):
                action = rng.choice(["change", "change", "change", "close", "crash", "crash, its hash lost",
                                     "lose totals", "lose a hash"])
                chosen = rng.choice(live)
                if action == "change":
                    chosen.open = {team: n for team in range(1, 6) if (n := rng.choice([0, 0, 1, 2, 5]))}
                elif action == "close":
                    await chosen.close()
                elif action.startswith("crash"):
                    client.zadd(chosen.registry, {chosen.key: 0})  # its counts have expired
                    if action.endswith("lost"):
                        client.delete(chosen.key)
                elif action == "lose totals":
                    client.delete(chosen.totals)
                else:
                    client.delete(chosen.key)
                if action == "close" or action.startswith("crash"):
                    live.remove(chosen)
                    fresh = StreamSlots(10**6, redis_url=REDIS_URL, key_prefix=prefix)
                    slots.append(fresh)  # closed at the end with the rest
                    live.append(fresh)
                for _ in range(2):
                    for each in rng.sample(live, len(live)):
                        await synced(each)
                for each in live:
                    expected: dict[int, int] = {}
                    for other in live:
                        if other is not each:
                            for team, n in other.open.items():
                                expected[team] = expected.get(team, 0) + n
                    assert each.others == expected, (step, action)

    try:
        run(scenario, timeout=60)
    finally:
        client.close()
