"""The held first request to a shared revision that was unloaded for being idle (issue 24), for both gateways: one
load per revision in this process however many requests wait for it, each held up to POOL_COLD_START_WAIT_SECONDS,
then refused with a 503 and Retry-After (UNAVAILABLE with `retry-after` over gRPC) while the load goes on, so that
a retry finds the revision loaded.

Loads run in a small executor of their own (POOL_GATEWAY_LOAD_THREADS), never the one that looks callers and routes
up, at most POOL_GATEWAY_LOADS_PER_TEAM at once per team, and never wait for the pool's lock: a load already under
way in the pool is a 503 too. So no team's cold starts can stall another team's requests."""

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
        self.loading: dict[int, asyncio.Future[tuple[bool, str]]] = {}  # loads in flight, per pool load
        self.loading_team: dict[int, int] = {}  # and the team each is for
        self.executor = ThreadPoolExecutor(max_workers=settings.POOL_GATEWAY_LOAD_THREADS,
                                           thread_name_prefix="pool-load")

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def hold(self, route: Route, pooled: Pooled, team_id: int,
                   routes: TtlCache[tuple[int, str], Route | None]) -> None:
        load_id = pooled.load_id
        if load_id is None:  # a shared revision with no load (yet): never sent on unmapped
            raise Refusal(503, f"Deployment {route.name!r} is not loaded in its pool yet; retry in a few seconds.",
                          {"Retry-After": "2"})
        task = self.loading.get(load_id)
        if task is None:
            mine = sum(1 for team in self.loading_team.values() if team == team_id)
            if mine >= settings.POOL_GATEWAY_LOADS_PER_TEAM:
                raise Refusal(503, f"Your team has {mine} deployment(s) loading into a pool; retry "
                                   f"{route.name!r} once they are loaded.", {"Retry-After": "2"})
            task = asyncio.get_running_loop().run_in_executor(self.executor, _load_in_pool, load_id)
            self.loading[load_id] = task
            self.loading_team[load_id] = team_id

            def done(_: object) -> None:
                self.loading.pop(load_id, None)
                self.loading_team.pop(load_id, None)

            task.add_done_callback(done)
        try:
            busy, failure = await asyncio.wait_for(asyncio.shield(task), settings.POOL_COLD_START_WAIT_SECONDS)
        except TimeoutError:
            raise Refusal(503, f"Deployment {route.name!r} is loading its models (it was idle); retry in a few "
                               "seconds.", {"Retry-After": "2"}) from None
        if busy:
            raise Refusal(503, f"Deployment {route.name!r} is idle and its pool is busy loading another model; "
                               "retry in a few seconds.", {"Retry-After": "2"})
        routes.entries.pop((team_id, route.name), None)  # the next request sees it loaded
        if failure:
            raise Refusal(503, f"Deployment {route.name!r} could not load its models: {failure}",
                          {"Retry-After": "5"})


def _load_in_pool(load_id: int) -> tuple[bool, str]:
    """Load a pool revision (deployments/runtimes/local/pool.py) in the load executor: (busy: the pool's lock was
    held, "" when loaded, else why not). A cluster pool's revision is asked for (its row) and waited for while the
    worker has its pods' agents load it (deployments/runtimes/kubernetes/pool_runtime.py)."""
    from django.db import close_old_connections

    from deployments.models import Pool, PoolLoad
    from deployments.runtimes.local.pool import PoolBusy, load_revision

    close_old_connections()
    try:
        if PoolLoad.objects.filter(pk=load_id, pool__runtime=Pool.Runtime.KUBERNETES).exists():
            return False, _wake_on_cluster(load_id)
        done = load_revision(load_id, wait=False)
    except PoolBusy:
        return True, ""
    except Exception as exc:  # the runtime cannot act (no runtime env, a Triton that will not start)
        log.warning("cold start of pool load %s failed: %s", load_id, exc)
        return False, str(exc)
    finally:
        close_old_connections()
    return False, "" if done.state == "loaded" else done.message


def _wake_on_cluster(load_id: int) -> str:
    """"" once loaded, else why not. It waits a second longer than the held request, so that the hold's own wait
    normally answers first (503, Retry-After), the load going on: the worker's next passes finish it."""
    from deployments.runtimes.kubernetes.pool_runtime import wait_loaded, wake

    refusal = wake(load_id)
    if refusal:
        return refusal
    loaded, failure = wait_loaded(load_id, settings.POOL_COLD_START_WAIT_SECONDS + 1)
    if not loaded and not failure:
        return "it is still loading in its pool (it was idle); retry in a few seconds"
    return failure
