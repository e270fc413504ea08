"""What a shared deployment's events say of its models coming and going in a pool (issue 31): unloaded while idle,
evicted for another model, loaded again by a request, loaded again after the pool's Triton stopped. Written once
here for both runtimes (deployments/runtimes/local/pool.py, deployments/runtimes/kubernetes/pool_runtime.py).

Unloads and loads on demand repeat for as long as a model is used now and then, so they go through
events.record_repeated: a model woken and unloaded all day long updates one row per kind per
EVENT_REPEAT_WINDOW_SECONDS (a count and the latest figures) instead of adding two rows each time. Each names the
deployment's own pool and figures only, never another deployment or team (an eviction says "another model").
"""

from __future__ import annotations

from deployments.events import record, record_repeated
from deployments.models import Deployment, Event

IDLE_UNLOADED = "pool.idle_unloaded"
EVICTED = "pool.evicted"
LOADED_ON_DEMAND = "pool.loaded_on_demand"


def idle_unloaded(deployment: Deployment, pool: str, unused_seconds: float, after_seconds: float,
                  idle_seconds: int) -> Event:
    """`after_seconds`: what it was kept unused, its idle time or more for a slow loader (POOL_IDLE_UNLOAD_LOAD_FACTOR
    times its last load), which is then said, or its idle time would look ignored."""
    slow = (f": {after_seconds:g} s is POOL_IDLE_UNLOAD_LOAD_FACTOR times its last load, longer than its idle time "
            f"of {idle_seconds} s" if after_seconds > idle_seconds else "")
    return record_repeated(deployment, Event.Kind.INFO, IDLE_UNLOADED, (
        f"Unloaded from pool {pool!r}: unused for {unused_seconds:.0f} s (it unloads after {after_seconds:g} s "
        f"unused{slow}). The next request loads it again."))


def evicted(deployment: Deployment, pool: str, unused_seconds: float) -> Event:
    return record_repeated(deployment, Event.Kind.INFO, EVICTED, (
        f"Unloaded from pool {pool!r} to make room for another model: unused for {unused_seconds:.0f} s (the least "
        "recently used go first). The next request loads it again."))


def loaded_on_demand(deployment: Deployment, pool: str, seconds: float) -> Event:
    return record_repeated(deployment, Event.Kind.INFO, LOADED_ON_DEMAND, (
        f"Loaded again in pool {pool!r} by a request, in {seconds:.1f} s (the request waited for it)."))


def loaded_again(deployment: Deployment, pool: str, seconds: float, restarted_pid: int | None) -> Event:
    """Its models loaded again after the pool's Triton stopped or died (`restarted_pid`: the Triton started since),
    or after a load that failed: said once it is so, never ahead."""
    into = f", into its Triton started again (pid {restarted_pid})" if restarted_pid is not None else ""
    return record(deployment, Event.Kind.INFO, f"Loaded again in pool {pool!r}{into}, in {seconds:.1f} s.")
