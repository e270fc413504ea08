"""Slow tests are opt-in by marker: a test that starts Triton, a worker (or the portal's other processes) or a
browser without its marker fails at once, naming the marker to add, instead of silently joining the fast suite
(`-m "not triton and not worker and not browser ..."`).

A pytest plugin (the root conftest.py loads it): it knows which test is running, so that the helpers that start
those things (tests/processes.py, tests/faults.py, the browser fixture) can call `require(...)`, and it wraps the
local runtime's `start_server` for every test that is not marked `triton`. tests/test_markers.py proves it."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import Any, NoReturn

import pytest

_running: list[pytest.Item] = []  # a stack: pytester runs a session inside a test


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files tests/slow_files.py names are marked `slow`: `make test-fast` leaves them out."""
    from tests.slow_files import is_slow

    for item in items:
        if is_slow(item.nodeid):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


def _refuse(item: pytest.Item, marker: str, what: str) -> NoReturn:
    pytest.fail(f"{item.nodeid} {what} but is not marked @pytest.mark.{marker}: add the marker (the fast suite, "
                f"which runs every unmarked test, must not {what}).", pytrace=False)


def require(marker: str, what: str) -> None:
    """Fail the running test unless it carries `marker`; `what` says what it was about to do."""
    if _running and _running[-1].get_closest_marker(marker) is None:
        _refuse(_running[-1], marker, what)


@pytest.fixture(autouse=True)
def _triton_needs_its_marker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every local Triton, the runtime's or a test's own, is started by this one function."""
    if request.node.get_closest_marker("triton") is None:
        from deployments.runtimes.local import triton

        item = request.node

        def refuse(*args: Any, **kwargs: Any) -> NoReturn:
            _refuse(item, "triton", "starts a real Triton server")

        refused: Callable[..., Any] = refuse
        monkeypatch.setattr(triton, "start_server", refused)
    yield
