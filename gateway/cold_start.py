"""The held first request to a shared revision that was unloaded for being idle (issue 24), for both gateways: one
load per revision in this process however many requests wait for it, each held up to POOL_COLD_START_WAIT_SECONDS,
then refused with a 503 and Retry-After (UNAVAILABLE with `retry-after` over gRPC) while the load goes on, so that
a retry finds the revision loaded.

Loads run in a small executor of their own (POOL_GATEWAY_LOAD_THREADS), never the one that looks callers and routes
up, at most POOL_GATEWAY_LOADS_PER_TEAM at once per team (a team's further ones wait their turn, within the hold),
and never behind another team's load: the pool loads each team's models beside the others' and holds its lock only
for the bookkeeping around a load. So no team's cold starts can stall another team's requests or cold starts."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings

from gateway.access import Route, TtlCache
from gateway.pool_names import Pooled
from gateway.protocol import Refusal

log = logging.getLogger(__name__)


class ColdStarts:
    def __init__(self) -> None:
        self.loading: dict[int, asyncio.Future[tuple[bool, str]]] = {}  # loads in flight or queued, per pool load
        self.loading_team: dict[int, int] = {}  # and the team each is for
        self.turns: dict[int, asyncio.Semaphore] = {}  # per team with loads here: POOL_GATEWAY_LOADS_PER_TEAM at once
        self.executor = ThreadPoolExecutor(max_workers=settings.POOL_GATEWAY_LOAD_THREADS,
                                           thread_name_prefix="pool-load")

    def close(self) -> None:
        for task in list(self.loading.values()):
            task.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def hold(self, route: Route, pooled: Pooled, team_id: int,
                   routes: TtlCache[tuple[int, str], Route | None]) -> None:
        load_id = pooled.load_id
        if load_id is None:  # a shared revision with no load (yet): never sent on unmapped
            raise Refusal(503, f"Deployment {route.name!r} is not loaded in its pool yet; retry in a few seconds.",
                          {"Retry-After": "2"})
        task = self.loading.get(load_id)
        if task is None:
            # A team's second idle model woken at once waits its turn within the hold (issue 31), rather than a 503
            # that stock tritonclient does not retry; past the wait the request is a 503 and the load still comes.
            task = asyncio.ensure_future(self._load(load_id, team_id))
            self.loading[load_id] = task
            self.loading_team[load_id] = team_id

            def done(_: object) -> None:
                self.loading.pop(load_id, None)
                self.loading_team.pop(load_id, None)
                if team_id not in self.loading_team.values():
                    self.turns.pop(team_id, None)

            task.add_done_callback(done)
        try:
            busy, failure = await asyncio.wait_for(asyncio.shield(task), settings.POOL_COLD_START_WAIT_SECONDS)
        except TimeoutError:
            raise Refusal(503, f"Deployment {route.name!r} is loading its models (it was idle); retry in a few "
                               "seconds.", {"Retry-After": "2"}) from None
        if busy:
            raise Refusal(503, f"Deployment {route.name!r} is idle and its pool is busy loading another model; "
                               "retry in a few seconds.", {"Retry-After": "2"})
        routes.invalidate((team_id, route.name))  # the next request sees it loaded
        if failure:
            raise Refusal(503, f"Deployment {route.name!r} could not load its models: {failure}",
                          {"Retry-After": "5"})

    async def _load(self, load_id: int, team_id: int) -> tuple[bool, str]:
        turn = self.turns.setdefault(team_id, asyncio.Semaphore(settings.POOL_GATEWAY_LOADS_PER_TEAM))
        async with turn:
            return await asyncio.get_running_loop().run_in_executor(self.executor, _load_in_pool, load_id)


def _load_in_pool(load_id: int) -> tuple[bool, str]:
    """Wake a pool revision through its pool's runtime (Runtime.wake: a local pool loads it here, a cluster pool's
    row is asked for and waited for while the worker has its pods' agents load it), in the load executor: (busy:
    the pool was busy with another load, "" when loaded, else why not)."""
    from django.db import close_old_connections

    from deployments.models import PoolLoad
    from deployments.runtimes.registry import runtime_named

    close_old_connections()
    try:
        runtime = PoolLoad.objects.filter(pk=load_id).values_list("pool__runtime", flat=True).first()
        if runtime is None:
            return False, "its models are no longer in the pool"
        # A local pool's lock is held only for short steps, and the team's while its other load runs: both are
        # waited for within the hold's wait, another team's load never.
        woke = runtime_named(runtime).wake(load_id, settings.POOL_COLD_START_WAIT_SECONDS)
    except Exception as exc:  # the runtime cannot act (no runtime env, a Triton that will not start)
        log.warning("cold start of pool load %s failed: %s", load_id, exc)
        return False, str(exc)
    finally:
        close_old_connections()
    if woke.loading:
        return False, "it is still loading in its pool (it was idle); retry in a few seconds"
    return woke.busy, woke.failure
