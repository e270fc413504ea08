"""`modelport tune`: what it sends, how it waits, the table it prints, --apply, and its failures' exit codes
(against the fake portal of fake_portal.py)."""

from __future__ import annotations

from typing import Any

import pytest

from modelport_cli.errors import ExitCode
from modelport_cli.main import _duration, main
from modelport_cli.tests.fake_portal import FakePortal, Reply, api_error, error_line

BASE = "/api/v1/deployments/digits-prod"
SETTINGS = {"instances": 2, "batching": True, "max_batch_size": 16, "queue_delay_us": 500}
DONE: dict[str, Any] = {
    "id": 7, "deployment": "digits-prod", "model": "digits", "version": 1, "status": "done", "partial": False,
    "message": "Recommended: 2 inst, batch 16, delay 500 µs.", "p99_target_ms": 20.0,
    "machine": {"hostname": "box", "cores": 2},
    "results": [{"settings": {"instances": 1, "batching": False, "max_batch_size": 0, "queue_delay_us": 0},
                 "label": "1 inst, batching off", "throughput": 150.0, "p50_ms": 4.0, "p99_ms": 9.0,
                 "concurrency": 2, "meets_target": True, "error": ""},
                {"settings": SETTINGS, "label": "2 inst, batch 16, delay 500 µs", "throughput": 610.5, "p50_ms": 8.0,
                 "p99_ms": 17.5, "concurrency": 8, "meets_target": True, "error": ""}],
    "recommendation": {"settings": SETTINGS, "label": "2 inst, batch 16, delay 500 µs", "throughput": 610.5,
                       "p99_ms": 17.5},
    "applied_revision": None,
}


def test_durations_read_as_seconds() -> None:
    assert [_duration(t) for t in ("90", "90s", "10m", "1h")] == [90, 90, 600, 3600]
    with pytest.raises(Exception, match="not a duration"):
        _duration("ten minutes")


def test_tune_waits_and_prints_the_table(portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("POST", f"{BASE}/tune", Reply(202, {**DONE, "status": "queued", "results": [], "message": "Queued."}))
    portal.on("GET", f"{BASE}/tunes/7/", [Reply(200, {**DONE, "status": "running", "message": "Measured 1."}),
                                          Reply(200, DONE)])
    assert main(["tune", "digits-prod", "--p99-ms", "20", "--budget", "10m"]) == ExitCode.OK
    [sent] = portal.seen("POST", f"{BASE}/tune")
    assert sent.json() == {"p99_ms": 20.0, "budget_seconds": 600, "concurrency_min": 1, "concurrency_max": 16}
    out = capsys.readouterr().out
    assert "tune 7 of digits-prod (digits:1) on box, 2 cores: target p99 <= 20.0 ms" in out
    assert "*2 inst, batch 16, delay 500 µs" in out and "610.5" in out and "17.5" in out
    assert " 1 inst, batching off" in out
    assert not portal.seen("POST", f"{BASE}/tunes/7/apply")


def test_apply_rolls_the_recommendation_out(portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("POST", f"{BASE}/tune", Reply(202, {**DONE, "status": "queued"}))
    portal.on("GET", f"{BASE}/tunes/7/", Reply(200, DONE))
    portal.on("POST", f"{BASE}/tunes/7/apply", Reply(200, {**DONE, "applied_revision": 3}))
    assert main(["tune", "digits-prod", "--p99-ms", "20", "--budget", "60", "--apply"]) == ExitCode.OK
    assert "applied: revision 3 rolls out" in capsys.readouterr().out


def test_apply_with_canary_rolls_the_recommendation_out_as_a_canary(portal: FakePortal) -> None:
    portal.on("POST", f"{BASE}/tune", Reply(202, {**DONE, "status": "queued"}))
    portal.on("GET", f"{BASE}/tunes/7/", Reply(200, DONE))
    portal.on("POST", f"{BASE}/tunes/7/apply", Reply(200, {**DONE, "applied_revision": 3}))
    assert main(["tune", "digits-prod", "--p99-ms", "20", "--budget", "60", "--apply", "--canary", "10"]) \
        == ExitCode.OK
    [sent] = portal.seen("POST", f"{BASE}/tunes/7/apply")
    assert sent.json() == {"rollout": {"strategy": "canary", "percent": 10}, "narrow": False}


NARROWS = ("Applying this tune would narrow what clients may send: digits: max_batch_size 64 → 16 (a request of "
           "more than 16 rows, accepted today, would be refused with a 400).")
CHANGES = [{"model": "digits", "setting": "max_batch_size", "before": 64, "after": 16, "narrows": True,
            "why": "a request of more than 16 rows, accepted today, would be refused with a 400"}]


def _tuned(fake: FakePortal) -> None:
    fake.on("POST", f"{BASE}/tune", Reply(202, {**DONE, "status": "queued"}))
    fake.on("GET", f"{BASE}/tunes/7/", Reply(200, DONE))

    def apply(seen: Any) -> Reply:
        if seen.json().get("narrow"):
            return Reply(200, {**DONE, "applied_revision": 3, "changes": CHANGES})
        return Reply(400, {"error": {"code": "invalid", "message": f"narrow: {NARROWS}",
                                     "fields": {"narrow": [NARROWS]}}})

    fake.on("POST", f"{BASE}/tunes/7/apply", apply)


def test_apply_that_narrows_stops_with_the_change_unless_narrow_is_given(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    _tuned(portal)
    assert main(["tune", "digits-prod", "--p99-ms", "20", "--budget", "60", "--apply"]) == ExitCode.USAGE
    line = error_line(capsys)
    assert "max_batch_size 64 → 16" in line and "add --narrow" in line
    assert main(["tune", "digits-prod", "--p99-ms", "20", "--budget", "60", "--apply", "--narrow"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "applied: revision 3 rolls out" in out
    assert "changed digits: max_batch_size 64 -> 16 (a request of more than 16 rows" in out


def test_apply_that_narrows_asks_on_a_terminal(portal: FakePortal, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
                                                capsys: pytest.CaptureFixture[str]) -> None:
    _tuned(portal)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    answers = iter(["n", "y"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(answers))
    assert main(["tune", "digits-prod", "--p99-ms", "20", "--budget", "60", "--apply"]) == ExitCode.USAGE
    assert "max_batch_size 64 → 16" in capsys.readouterr().err
    assert main(["tune", "digits-prod", "--p99-ms", "20", "--budget", "60", "--apply"]) == ExitCode.OK
    assert [r.json()["narrow"] for r in portal.seen("POST", f"{BASE}/tunes/7/apply")] == [False, False, True]


def test_canary_without_apply_is_a_usage_error(portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "digits-prod", "--p99-ms", "20", "--canary", "10"]) == ExitCode.USAGE
    assert "add --apply" in error_line(capsys)
    assert not portal.seen("POST")


def test_a_failed_tune_exits_4_with_its_reason(portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("POST", f"{BASE}/tune", Reply(202, {**DONE, "status": "queued"}))
    portal.on("GET", f"{BASE}/tunes/7/", Reply(200, {**DONE, "status": "failed", "message": "disk full"}))
    assert main(["tune", "digits-prod", "--p99-ms", "20", "--budget", "60"]) == ExitCode.DEPLOYMENT_FAILED
    assert error_line(capsys) == "error: tune 7 failed: disk full"


def test_the_portals_validation_is_exit_1_with_its_message(portal: FakePortal,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("POST", f"{BASE}/tune", api_error(400, "Invalid input.", fields={
        "budget_seconds": ["Ensure this value is greater than or equal to 30."]}))
    assert main(["tune", "digits-prod", "--p99-ms", "20", "--budget", "10"]) == ExitCode.ERROR
    assert "budget_seconds" in error_line(capsys)


def test_a_bad_duration_is_a_usage_error(portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "digits-prod", "--p99-ms", "20", "--budget", "soon"]) == ExitCode.USAGE
    assert not portal.seen()


CURRENT = {"instances": 1, "batching": True, "max_batch_size": 8, "queue_delay_us": 0}
KEPT: dict[str, Any] = {
    **DONE,
    "message": ("Keep the current setting: 1 inst, batch 8, delay 0 µs: 1000 req/s at p99 9.0 ms. 1 inst, batching "
                "off measured 3.0% more than the current setting, within noise (3.0% apart, spread 5.0%): the "
                "current setting is kept."),
    "results": [{"settings": CURRENT, "label": "1 inst, batch 8, delay 0 µs", "throughput": 1000.0, "p50_ms": 4.0,
                 "p99_ms": 9.0, "concurrency": 8, "meets_target": True, "error": "", "missed": "", "current": True,
                 "samples": [1000.0, 960.0, 1010.0], "spread_pct": 5.0},
                {"settings": {"instances": 1, "batching": False, "max_batch_size": 0, "queue_delay_us": 0},
                 "label": "1 inst, batching off", "throughput": 1030.0, "p50_ms": 4.0, "p99_ms": 9.5,
                 "concurrency": 8, "meets_target": True, "error": "", "missed": "", "current": False,
                 "samples": [1060.0, 1010.0, 1030.0], "spread_pct": 4.9},
                {"settings": {"instances": 2, "batching": False, "max_batch_size": 0, "queue_delay_us": 0},
                 "label": "2 inst, batching off", "throughput": 0.0, "p50_ms": None, "p99_ms": None,
                 "concurrency": None, "meets_target": False, "error": "", "current": False, "samples": [],
                 "missed": "p99 ≤ 20 ms not met at any concurrency measured (16 clients: p99 31.0 ms; 8 clients: "
                           "p99 24.5 ms)"}],
    "recommendation": {"settings": CURRENT, "label": "1 inst, batch 8, delay 0 µs", "throughput": 1000.0,
                       "p99_ms": 9.0, "current": True, "kept_current": True, "within_noise": True,
                       "note": "within noise (3.0% apart, spread 5.0%)"},
}


def test_the_table_says_why_a_setting_missed_and_which_runs_were_compared(
        portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("POST", f"{BASE}/tune", Reply(202, {**KEPT, "status": "queued"}))
    portal.on("GET", f"{BASE}/tunes/7/", Reply(200, KEPT))
    portal.on("POST", f"{BASE}/tunes/7/apply", Reply(200, {**KEPT, "applied_revision": 1, "changes": []}))
    assert main(["tune", "digits-prod", "--p99-ms", "20", "--budget", "60", "--apply"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "(current) (median of 3 runs, spread 5.0%)" in out
    assert ("2 inst, batching off" in out and "(missed: p99 ≤ 20 ms not met at any concurrency measured (16 clients: "
            "p99 31.0 ms; 8 clients: p99 24.5 ms))" in out)
    assert "within noise (3.0% apart, spread 5.0%): the current setting is kept." in out
    assert "applied: nothing changes, revision 1 serves these settings already" in out
    assert "rolls out" not in out
