"""The held first request to a dedicated cluster deployment scaled to zero (min_replicas 0, KEDA), for both
gateways: while no pod of its revision is ready the request waits here, counted in
`modelport_gateway_held_requests{team, deployment}`, which is what wakes the deployment. The ScaledObject's demand
trigger (deployments/runtimes/kubernetes/manifests.py, demand_query) reads that gauge through Prometheus and KEDA
scales the Deployment from 0 to 1; the gateway sees the pod's Triton answer /v2/health/ready and forwards the request.

Why KEDA's activation and not a patch of the Deployment's replicas from here: KEDA owns the replica count of what it
scales. A Deployment patched to 1 while KEDA's triggers are inactive is scaled back to 0 at KEDA's next poll (its
cooldown counts from the last time a trigger was active, long ago for an idle deployment), so a patch alone does not
hold on a real cluster; and it would give the web pods, which face the internet, a Role that writes to every team's
Deployments. The gauge needs no Kubernetes credentials in the gateway at all.

Bounded, so that holding costs a team only its own: each request is held at most
GATEWAY_SCALE_FROM_ZERO_WAIT_SECONDS, then a 503 with Retry-After (UNAVAILABLE with `retry-after` over gRPC) while
the pod goes on starting; a team has at most GATEWAY_MAX_HELD_PER_TEAM requests held at once in a process (a 503 past
it, before any wait), and its held requests are nobody else's count. Held requests read no body yet (the body is read
when forwarded), and one probe per upstream runs however many requests wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from prometheus_client import Gauge

from gateway import upstream
from gateway.access import Choice, Route
from gateway.protocol import Refusal

HELD = Gauge("modelport_gateway_held_requests",
             "Requests held by the gateway while their deployment, scaled to zero, starts a pod",
             ["team", "deployment"])

# A revision that answered (ready, or a forwarded request) this recently is taken for up: no probe before forwarding.
# KEDA takes a deployment to zero only after minutes without a request, so a request within this of the last one
# finds its pod.
UP_SECONDS = 10.0
PROBE_INTERVAL_SECONDS = 0.5
PROBE_TIMEOUT_SECONDS = 2.0
READY_TARGET = b"/v2/health/ready"


class Wakes:
    def __init__(self) -> None:
        self.pool = upstream.Pool(max_idle_per_host=2, connect_timeout=PROBE_TIMEOUT_SECONDS)
        self.up: dict[str, float] = {}  # HTTP base URL -> when its Triton last answered (time.monotonic())
        self.probes: dict[str, asyncio.Task[None]] = {}  # one per upstream while requests wait for it
        self.until: dict[str, float] = {}  # how long each probe goes on: the last waiter's deadline
        self.held: dict[int, int] = {}  # team id -> requests held now
        self.gauges: dict[tuple[str, str], Any] = {}

    def close(self) -> None:
        for task in list(self.probes.values()):
            task.cancel()
        self.pool.close()

    def answered(self, url: str) -> None:
        """A request to `url` was answered by its Triton: it is up."""
        self.up[url] = time.monotonic()

    def lost(self, url: str) -> None:
        """`url` could not be reached: the next request is held until it is ready again."""
        self.up.pop(url, None)

    def is_up(self, url: str) -> bool:
        seen = self.up.get(url)
        return seen is not None and time.monotonic() - seen < UP_SECONDS

    async def hold(self, route: Route, url: str, team_id: int) -> None:
        """Return once `url` (the chosen revision's Triton, over HTTP) is ready; a Refusal past the bounds."""
        if self.is_up(url):
            return
        wait = settings.GATEWAY_SCALE_FROM_ZERO_WAIT_SECONDS
        limit = settings.GATEWAY_MAX_HELD_PER_TEAM
        if self.held.get(team_id, 0) >= limit:
            raise Refusal(503, f"Deployment {route.name!r} is starting from zero and your team already has {limit} "
                               "requests waiting for its deployments to start (GATEWAY_MAX_HELD_PER_TEAM); retry in a "
                               "few seconds.", {"Retry-After": "5"})
        with self._held(route, team_id):
            self.until[url] = max(self.until.get(url, 0.0), time.monotonic() + wait)
            task = self.probes.get(url)
            if task is None or task.done():
                task = self.probes[url] = asyncio.ensure_future(self._probe(url))
                task.add_done_callback(self._probe_done(url))
            try:
                await asyncio.wait_for(asyncio.shield(task), wait)
            except TimeoutError:
                raise Refusal(503, f"Deployment {route.name!r} was scaled to zero and is starting a server; retry in "
                                   "a few seconds.", {"Retry-After": "5"}) from None
        if not self.is_up(url):  # the probe gave up: its last waiter's time ran out
            raise Refusal(503, f"Deployment {route.name!r} was scaled to zero and is starting a server; retry in a few "
                               "seconds.", {"Retry-After": "5"})

    @contextlib.contextmanager
    def _held(self, route: Route, team_id: int) -> Iterator[None]:
        gauge = self.gauges.get((route.team, route.name))
        if gauge is None:
            gauge = self.gauges[(route.team, route.name)] = HELD.labels(route.team, route.name)
        self.held[team_id] = self.held.get(team_id, 0) + 1
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()
            left = self.held[team_id] - 1
            if left:
                self.held[team_id] = left
            else:
                del self.held[team_id]

    def _probe_done(self, url: str) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            if self.probes.get(url) is task:  # not a newer probe of the same upstream
                del self.probes[url]
                self.until.pop(url, None)
        return done

    async def _probe(self, url: str) -> None:
        """Ask `url` whether it is ready until it is, or until no request waits for it any longer."""
        while time.monotonic() < self.until.get(url, 0.0):
            if await self._ready(url):
                self.answered(url)
                return
            await asyncio.sleep(PROBE_INTERVAL_SECONDS)

    async def _ready(self, url: str) -> bool:
        response = None
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
                response = await self.pool.request("GET", url, READY_TARGET, [], None, None)
                await response.read(64 * 1024)
                return response.status == 200
        except (TimeoutError, upstream.UpstreamError, OSError):
            return False  # no endpoint behind the Service yet (refused, reset, or nothing answers)
        finally:
            if response is not None:
                response.close()


def http_url(route: Route, choice: Choice) -> str:
    """The HTTP base URL of the chosen revision's Triton (the gRPC gateway's choice is a host:port)."""
    return route.canary_url if choice.revision == route.canary_revision and route.canary_url else route.upstream_url


async def wake(wakes: Wakes, route: Route, choice: Choice, team_id: int) -> str:
    """Hold a request to a revision that scales to zero until its Triton is ready; the URL it was held for ("" for
    any other revision, which is forwarded as it is)."""
    if choice.revision not in route.scales_to_zero:
        return ""
    url = http_url(route, choice)
    if url:
        await wakes.hold(route, url, team_id)
    return url

