"""`modelport perf`: what it asks, the table it prints with the advice, --json, and a window the portal does not
offer refused before anything is sent (against the fake portal of fake_portal.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelport_cli import main as main_module
from modelport_cli.errors import ExitCode
from modelport_cli.main import main
from modelport_cli.tests.fake_portal import FakePortal, Reply, error_line

PATH = "/api/v1/deployments/digits-prod/performance/"
ADVICE = "Requests to digits wait in Triton's queue 86% of their time (6.00 ms) with full batches: add an instance."
BODY: dict[str, Any] = {
    "deployment": "digits-prod", "window": "1h", "window_seconds": 3600, "snapshot_seconds": 60.0,
    "revisions": [{
        "revision": 3, "role": "serving", "from": "2026-12-03T12:00:00+00:00", "to": "2026-12-03T12:59:00+00:00",
        "snapshots": 60,
        "gateway": {"statistic": "percentiles", "requests": 1200, "errors": 3, "error_rate": 0.0025, "p50_ms": 4.1,
                    "p95_ms": 9.0, "p99_ms": 12.0, "mean_ms": 7.5, "own_mean_ms": 0.4},
        "models": [{"model": "digits", "pipeline": False, "step_of": [], "statistic": "mean", "requests": 1200,
                    "errors": 0, "executions": 400, "inferences": 1200, "request_ms": 7.1, "queue_ms": 6.0,
                    "compute_input_ms": 0.01, "compute_infer_ms": 1.0, "compute_output_ms": 0.02,
                    "queue_share": 0.8559, "mean_batch_size": 3.0,
                    "batch_sizes": [{"batch_size": 1, "executions": 200}, {"batch_size": 5, "executions": 200}],
                    "restarted": True, "advice": [ADVICE],
                    "gateway": {"statistic": "percentiles", "requests": 1190, "errors": 2, "error_rate": 0.0017,
                                "p50_ms": 4.0, "p95_ms": 8.5, "p99_ms": 11.5, "mean_ms": 7.4, "own_mean_ms": 0.3}}],
    }],
}


def test_perf_asks_for_the_window_and_prints_where_the_time_went(portal: FakePortal,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("GET", PATH, Reply(200, BODY))

    assert main(["perf", "digits-prod", "--window", "1h"]) == 0

    assert portal.seen("GET", PATH)[0].query == {"window": ["1h"]}
    out = capsys.readouterr().out
    assert "revision 3 (serving): 2026-12-03T12:00:00+00:00 .. 2026-12-03T12:59:00+00:00, 60 snapshot(s)" in out
    assert "1200 requests, 3 errors; p50 4.100 ms, p95 9.000 ms, p99 12.000 ms; its own time 0.400 ms" in out
    [row] = [line for line in out.splitlines() if line.strip().startswith("digits ")]
    # The gateway's share of digits (requests, errors, p99, its own time), then Triton's.
    assert row.split()[:12] == ["digits", "1190", "2", "11.500", "0.300", "1200", "0", "6.000", "0.010", "1.000",
                                "0.020", "86%"]
    assert "1x200 5x200" in row and "restarted" in row
    assert f"advice: {ADVICE}" in out


def test_perf_json_is_the_portals_answer_and_the_window_defaults_to_15m(portal: FakePortal,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("GET", PATH, Reply(200, BODY))

    assert main(["perf", "digits-prod", "--json"]) == 0

    assert json.loads(capsys.readouterr().out) == BODY
    assert portal.seen("GET", PATH)[0].query == {"window": ["15m"]}


def test_perf_of_a_deployment_that_never_served_says_so(portal: FakePortal,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("GET", PATH, Reply(200, {**BODY, "window": "15m", "revisions": []}))

    assert main(["perf", "digits-prod"]) == 0

    assert capsys.readouterr().out == "digits-prod: no revision served in the last 15m\n"


def test_a_window_the_portal_does_not_offer_is_a_usage_error_before_anything_is_sent(
        portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["perf", "digits-prod", "--window", "10m"]) == ExitCode.USAGE

    assert "invalid choice: '10m'" in capsys.readouterr().err
    assert portal.seen() == []


def test_perf_of_an_unknown_deployment_exits_2(portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["perf", "nope"]) == ExitCode.USAGE

    assert error_line(capsys).startswith("error: Not found.")


def test_the_cli_offers_the_portals_windows() -> None:
    from performance.windows import WINDOWS

    assert main_module.PERF_WINDOWS == tuple(WINDOWS)
