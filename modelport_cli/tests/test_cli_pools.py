"""Shared servers from the CLI (issue 24): `modelport deploy --shared [--pool P] [--idle-unload 10m]` and
`--dedicated`, only what is given sent on an existing deployment (the API's PATCH keeps the rest), `modelport pools`,
and the placement in `modelport status` (against the fake portal of test_cli.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelport_cli.errors import ExitCode
from modelport_cli.main import main
from modelport_cli.tests.fake_portal import FakePortal, Reply, api_error, deployment, error_line, existing

MiB = 2**20


def test_deploy_shared_sends_the_placement_with_the_pool_and_the_idle_time_in_seconds(portal: FakePortal) -> None:
    portal.on("POST", "/api/v1/deployments/", Reply(201, deployment()))

    assert main(["deploy", "a", "--model", "digits:1", "--shared"]) == 0
    assert main(["deploy", "b", "--model", "digits:1", "--shared", "--pool", "acme-gpu", "--idle-unload", "10m"]) == 0
    assert main(["deploy", "c", "--model", "digits:1", "--shared", "--idle-unload", "never"]) == 0
    assert main(["deploy", "d", "--model", "digits:1", "--dedicated"]) == 0
    assert main(["deploy", "e", "--model", "digits:1"]) == 0

    sent = [r.json().get("placement") for r in portal.seen("POST", "/api/v1/deployments/")]
    assert sent == [{"mode": "shared"}, {"mode": "shared", "pool": "acme-gpu", "idle_unload_seconds": 600},
                    {"mode": "shared", "idle_unload_seconds": 0}, {"mode": "dedicated"},
                    None]  # nothing said: the portal's default, as for the API


@pytest.mark.parametrize(("given", "seconds"), [("90s", 90), ("90", 90), ("1h", 3600), ("0", 0)])
def test_idle_unload_takes_durations(portal: FakePortal, given: str, seconds: int) -> None:
    portal.on("POST", "/api/v1/deployments/", Reply(201, deployment()))
    assert main(["deploy", "a", "--model", "digits", "--shared", "--idle-unload", given]) == 0
    assert portal.seen("POST")[0].json()["placement"]["idle_unload_seconds"] == seconds


def test_on_an_existing_deployment_only_the_placement_given_changes(portal: FakePortal) -> None:
    existing(portal)

    assert main(["deploy", "digits-prod", "--model", "digits", "--idle-unload", "5m"]) == 0
    assert main(["deploy", "digits-prod", "--model", "digits"]) == 0
    assert main(["deploy", "digits-prod", "--model", "digits", "--dedicated"]) == 0

    first, second, third = (r.json() for r in portal.seen("PATCH", "/api/v1/deployments/digits-prod/"))
    # No mode, no pool: the portal keeps them (its PATCH merges a placement of the same mode).
    assert first["placement"] == {"idle_unload_seconds": 300}
    assert "placement" not in second
    assert third["placement"] == {"mode": "dedicated"}


def test_a_canary_carries_the_placement_too(portal: FakePortal) -> None:
    portal.on("GET", "/api/v1/deployments/digits-prod/", Reply(200, deployment()))
    portal.on("PATCH", "/api/v1/deployments/digits-prod/", Reply(200, deployment(
        revision=2, canary={"revision": 2, "percent": 10, "state": "starting"})))

    assert main(["deploy", "digits-prod", "--model", "digits", "--shared", "--canary", "10"]) == 0

    (patch,) = portal.seen("PATCH")
    assert patch.json()["placement"] == {"mode": "shared"}
    assert patch.json()["rollout"] == {"strategy": "canary", "percent": 10}


@pytest.mark.parametrize("argv", [
    ["--dedicated", "--pool", "shared"],
    ["--dedicated", "--idle-unload", "10m"],
    ["--shared", "--dedicated"],
    ["--shared", "--idle-unload", "ten minutes"],
    ["--shared", "--idle-unload", "-5m"],
    ["--shared", "--pool", "../../etc"],
    ["--shared", "--pool", "UPPER CASE"],
])
def test_contradictory_or_bad_placement_options_exit_2_before_anything_is_sent(
        portal: FakePortal, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "a", "--model", "digits", *argv]) == ExitCode.USAGE
    assert error_line(capsys)
    assert not portal.requests


def test_the_portals_refusal_of_a_placement_is_one_line_with_its_reason(
        portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("POST", "/api/v1/deployments/", api_error(400, "Invalid input.", "invalid", {"placement": [
        "model 'tool' is a python model, which runs code a team uploaded: deploy it with placement mode "
        "'dedicated'"]}))

    assert main(["deploy", "tool", "--model", "tool", "--shared"]) == 1

    line = error_line(capsys)
    assert "placement" in line and "runs code a team uploaded" in line and "'dedicated'" in line


POOLS = [
    {"name": "acme-gpu", "runtime": "local", "teams": "yours", "memory_budget_bytes": 2**30,
     "memory_used_bytes": 256 * MiB, "models_loaded": 2, "idle_unload_seconds": 0},
    {"name": "shared", "runtime": "local", "teams": "all", "memory_budget_bytes": 2 * 2**30,
     "memory_used_bytes": 0, "models_loaded": 0, "idle_unload_seconds": 600},
]


def test_pools_lists_each_pools_capacity(portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("GET", "/api/v1/pools/", Reply(200, POOLS))

    assert main(["pools"]) == 0

    own, shared = capsys.readouterr().out.splitlines()
    assert own.startswith("acme-gpu") and "your team" in own and "256.0 MiB of 1.0 GiB used" in own
    assert "2 model(s) loaded" in own and "idle unload never" in own
    assert shared.startswith("shared") and "every team, ONNX only" in shared and "idle unload 10m" in shared
    assert portal.seen("GET")[0].query == {}


def test_pools_with_a_model_says_how_many_more_fit(portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    fits = {"model": "digits", "version": 3, "memory_bytes": 300 * MiB, "fits": True, "copies": 6, "message": ""}
    unmeasured = {**fits, "memory_bytes": None, "fits": None, "copies": None}
    portal.on("GET", "/api/v1/pools/", Reply(200, [{**POOLS[0], "fit": unmeasured}, {**POOLS[1], "fit": fits}]))

    assert main(["pools", "--model", "digits:3"]) == 0

    own, shared = capsys.readouterr().out.splitlines()
    assert "digits:3 not measured yet" in own
    assert "digits:3 fits 6 more (300.0 MiB each)" in shared
    assert portal.seen("GET")[0].query == {"model": ["digits"], "version": ["3"]}

    assert main(["pools", "--model", "digits", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[1]["fit"]["copies"] == 6
    assert portal.seen("GET")[1].query == {"model": ["digits"]}


def test_pools_of_an_unknown_model_exits_2_with_the_portals_reason(
        portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    portal.on("GET", "/api/v1/pools/", api_error(404, "No ready model version 'nope' in team acme.", "not_found"))
    assert main(["pools", "--model", "nope"]) == ExitCode.USAGE
    assert "nope" in error_line(capsys)


def test_status_shows_the_pool_loaded_or_idle_and_the_cold_start(
        portal: FakePortal, capsys: pytest.CaptureFixture[str]) -> None:
    placement: dict[str, Any] = {"mode": "shared", "pool": "shared", "idle_unload_seconds": 600, "state": "loaded",
                                 "cold_start_seconds": 0.8372, "memory_bytes": 42 * MiB}
    portal.on("GET", "/api/v1/deployments/digits-prod/", [Reply(200, deployment(placement=placement)),
                                                           Reply(200, deployment(placement={"mode": "dedicated"}))])

    assert main(["status", "digits-prod"]) == 0
    assert ("placement: shared in pool shared: loaded, cold start 0.84 s, memory 42.0 MiB, unloaded after 10m "
            "unused") in capsys.readouterr().out
    assert main(["status", "digits-prod"]) == 0
    assert "placement: dedicated" in capsys.readouterr().out
