"""The web process's heap is frozen when its server starts (infra/heap.py): what the process was built with is left
out of the garbage collector's full collections, which scanned all of it and paused every request in flight."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()  # the test process's own heap is the collector's again


def test_the_gateways_startup_freezes_what_is_alive_before_it_says_it_is_ready(gateway_app: Any,
                                                                                unfrozen: None) -> None:
    app = gateway_app()
    built: list[str] = ["alive before the server starts, as the portal's modules and caches are"]
    messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    frozen_when_ready: list[int] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "lifespan.startup.complete":
            frozen_when_ready.append(gc.get_freeze_count())

    assert gc.get_freeze_count() == 0 and any(found is built for found in gc.get_objects())
    asyncio.run(app.lifespan(receive, send))

    assert frozen_when_ready and frozen_when_ready[0] > 0
    # In the permanent generation: no generation the collector scans holds it.
    assert gc.is_tracked(built) and not any(found is built for found in gc.get_objects())


def test_the_portals_urls_and_views_are_loaded_before_the_freeze(gateway_app: Any, unfrozen: None) -> None:
    """The first page or API call imported them after start-up, and every full collection scanned them from then."""
    from django.urls import clear_url_caches, get_resolver

    app = gateway_app()
    clear_url_caches()  # a resolver of its own, made at start-up, as in a fresh server process
    messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        pass

    asyncio.run(app.lifespan(receive, send))
    resolver = get_resolver()
    assert resolver._populated  # its reverse lookup built
    # Made at start-up, before the freeze: in the permanent generation, with its lookup tables.
    assert not any(found is resolver or found is resolver.reverse_dict for found in gc.get_objects())
