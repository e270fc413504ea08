"""The gateway's per-bucket statistics count responses per status code, so that the traffic panels can show what
the errors were; buckets flushed twice into one row add up."""

from __future__ import annotations

from datetime import timedelta

from gateway import stats
from gateway.models import RequestStats
from gateway.stats import summarize
from tests.support.deploying import deploy
from tests.support.people import Person
from tests.support.versions import make_ready_version


def test_codes_are_counted_per_bucket_and_merged_into_one_row(alice: Person) -> None:
    make_ready_version(alice, "digits")
    deployment = deploy(alice)
    collector = stats.StatsCollector()
    for code in (200, 200, 400, 502, 429):
        collector.observe(deployment.pk, deployment.team.name, deployment.name, "digits", code, 0.004)
    stats.flush(collector.take())
    collector.observe(deployment.pk, deployment.team.name, deployment.name, "digits", 200, 0.004)
    stats.flush(collector.take())

    rows = list(RequestStats.objects.filter(deployment=deployment))
    assert sum(r.requests for r in rows) == 6
    merged: dict[str, int] = {}
    for row in rows:
        merged = stats.merge_codes(merged, row.codes)
    assert merged == {"200": 3, "400": 1, "502": 1, "429": 1}
    summary = summarize(rows, timedelta(minutes=5))
    assert summary["codes"] == {"200": 3, "400": 1, "429": 1, "502": 1}
    assert summary["errors"] == 2 and summary["error_rate"] == round(2 / 6, 4)  # 502 and 429; a 400 is the caller's


def test_a_window_without_requests_has_no_error_rate() -> None:
    assert summarize([], timedelta(minutes=5))["error_rate"] is None
