"""The gateway's request buckets are deleted once no window reads them (REQUEST_STATS_KEEP_HOURS, at least 25 h):
every reader looks at most 24 hours back, and kept forever they grow by a row per deployment and revision every 10
seconds of traffic."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from gateway import stats, tasks
from gateway.models import RequestStats
from infra.schedule import beat_schedule
from tests.support.gateway_calls import make_deployment
from tests.support.people import Person

pytestmark = pytest.mark.django_db


def _bucket(deployment: Any, age: timedelta) -> RequestStats:
    start = timezone.now() - age
    return RequestStats.objects.create(deployment=deployment, revision=1, bucket_start=start, requests=3)


def test_buckets_past_the_kept_hours_are_deleted_and_the_last_24_hours_stay(alice: Person) -> None:
    deployment = make_deployment(alice, "kept", "http://127.0.0.1:9")
    recent = _bucket(deployment, timedelta(minutes=5))
    a_day_ago = _bucket(deployment, timedelta(hours=24, minutes=30))  # the oldest window still reads near it
    old = _bucket(deployment, timedelta(hours=26))
    older = _bucket(deployment, timedelta(days=40))

    assert tasks.prune_request_stats() == 2
    left = set(RequestStats.objects.values_list("pk", flat=True))
    assert left == {recent.pk, a_day_ago.pk}
    assert old.pk not in left and older.pk not in left


def test_the_metrics_api_s_longest_window_still_counts_every_request_after_a_prune(alice: Person) -> None:
    deployment = make_deployment(alice, "window", "http://127.0.0.1:9")
    for hours in (1, 12, 23.9):
        _bucket(deployment, timedelta(hours=hours))
    stats.prune(timezone.now())
    response = alice.client().get("/api/v1/deployments/window/metrics/?minutes=1440")
    assert response.status_code == 200, response.content
    assert response.json()["requests"] == 9


def test_the_keep_setting_cannot_cut_into_the_longest_window(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from infra.env import env_int

    monkeypatch.setenv("REQUEST_STATS_KEEP_HOURS", "2")
    with pytest.raises(ImproperlyConfigured, match="REQUEST_STATS_KEEP_HOURS"):
        env_int("REQUEST_STATS_KEEP_HOURS", 25, minimum=25)


def test_the_prune_runs_periodically_and_expires_rather_than_piling_up() -> None:
    entry = beat_schedule(5.0)["prune-request-stats"]
    assert entry["task"] == "gateway.tasks.prune_request_stats"
    assert entry["options"]["expires"] <= entry["schedule"]
