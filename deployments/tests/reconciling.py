"""The reconciler's test support (a fixture module: nothing here is collected): the clock that timezone.now reads
in these tests, and the helpers that create, change and tick a deployment on the fake runtime. The fixtures that
hand them out (`clock`, `fake`) are in conftest.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from unittest import mock

from django.utils import timezone

from deployments import actions, planning, reconcile
from deployments.model_entry import ModelEntry
from deployments.models import Deployment, Event
from deployments.spec import DynamicBatching
from deployments.tests.fake_runtime import FakeRuntime
from tests.support.people import Person

S = Deployment.Status


class Clock:
    def __init__(self) -> None:
        self.now = timezone.now()

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def request(delay: int = 0) -> planning.DeployRequest:
    batching = DynamicBatching(max_queue_delay_microseconds=delay)
    return planning.DeployRequest(runtime="local", models=(ModelEntry.asked("digits", dynamic_batching=batching),))


def create(person: Person) -> Deployment:
    return actions.create_deployment(person.team, person.user, "digits-prod", planning.plan(person.team, request()))


def change(person: Person, deployment: Deployment, delay: int) -> None:
    actions.update_deployment(Deployment.objects.get(pk=deployment.pk), person.user,
                              planning.plan(person.team, request(delay)))


def tick(deployment: Deployment) -> float | None:
    """One reconcile pass, which never waits: it returns how long the next one should (the task sleeps, not the
    pass). Counted as sleeps in this thread rather than measured in seconds, which a loaded machine stretches."""
    slept: list[float] = []
    this_thread = threading.current_thread()
    sleep = time.sleep

    def noted(seconds: float) -> None:
        if threading.current_thread() is this_thread:
            slept.append(seconds)
        sleep(seconds)

    with mock.patch.object(time, "sleep", noted):
        wait = reconcile.reconcile(deployment.pk)
    assert slept == [], f"a reconcile pass slept {slept}"
    return wait


def ticks_until(deployment: Deployment, done: Callable[[Deployment], bool], clock: Clock, limit: int = 30) -> list[Any]:
    """Tick as the tasks would, moving the clock by each wait; the waits asked for, until `done`."""
    waits = []
    for _ in range(limit):
        wait = tick(deployment)
        waits.append(wait)
        if done(Deployment.objects.get(pk=deployment.pk)):
            return waits
        clock.advance(wait if wait is not None else 5.0)
    raise AssertionError(f"not done after {limit} ticks: {Deployment.objects.get(pk=deployment.pk).status_message}")


def ready(deployment: Deployment) -> bool:
    return deployment.status == S.READY


def serving(alice: Person, fake: FakeRuntime, clock: Clock) -> Deployment:
    """A deployment at rest: serving revision 1, nothing left to retire."""
    deployment = create(alice)
    ticks_until(deployment, lambda d: d.status == S.READY and d.drain_until is None, clock)
    return Deployment.objects.get(pk=deployment.pk)


def events(deployment: Deployment) -> list[str]:
    return [e.message.splitlines()[0] for e in Event.objects.filter(deployment=deployment).order_by("time", "id")]
