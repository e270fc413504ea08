"""The worker's side of a tune: the one-tune-per-machine lock, and a whole run recorded (results, frontier,
recommendation, event), with the temporary Tritons and the load generator replaced by the synthetic model (the
real ones run in tests/test_tune_e2e.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from deployments.models import Deployment, Event
from deployments.runtimes.local import triton as local_triton
from models_registry.models import ModelVersion
from tests.support.people import Person
from tuning import runner, search, tasks
from tuning.models import TuneRun
from tuning.tests.synthetic import Synthetic


def queued(deployment: Deployment, **fields: Any) -> TuneRun:
    values: dict[str, Any] = {"deployment": deployment, "team": deployment.team, "p99_target_ms": 20.0,
                              "model_version": ModelVersion.objects.get(model__name="digits", number=1),
                              "budget_seconds": 600, "request_body": {"inputs": [{"name": "x"}]},
                              "concurrency_min": 1, "concurrency_max": 32}
    values.update(fields)
    return TuneRun.objects.create(**values)


class FakeServers:
    """Stands in for runner.Servers: the URL names the setting, so the fake load generator can answer for it."""

    started: list[search.Config] = []

    def __init__(self, tune: TuneRun, spec: Any, entry: Any) -> None:
        self.entry = entry

    def url_for(self, config: search.Config) -> str:
        FakeServers.started.append(config)
        return "http://fake/" + ",".join(str(v) for v in config.to_json().values())

    def close(self) -> None:
        FakeServers.started.append(search.Config(instances=0))  # closing is recorded as a sentinel


@pytest.fixture
def synthetic(monkeypatch: pytest.MonkeyPatch) -> Synthetic:
    model = Synthetic(cores=2)
    FakeServers.started = []
    monkeypatch.setattr(runner, "Servers", FakeServers)
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 2)
    return model


def fake_loadgen(model: Synthetic) -> runner.Measurer:
    def loadgen(url: str, body: bytes, concurrency: int, duration: float, warmup: float) -> search.Measurement:
        n, batching, size, delay = url.removeprefix("http://fake/").split(",")
        assert body == b'{"inputs": [{"name": "x"}]}'
        return model.figures(search.Config(int(n), batching == "True", int(size), int(delay)), concurrency)
    return loadgen


def test_a_run_records_results_frontier_and_recommendation(deployment: Deployment, synthetic: Synthetic) -> None:
    run = queued(deployment)
    assert runner.run(run.pk, fake_loadgen(synthetic)) is None
    run.refresh_from_db()
    assert run.status == "done", run.message
    assert run.recommendation is not None and run.recommendation["settings"]["batching"] is True
    assert run.recommendation["p99_ms"] <= 20
    assert run.configs_done == len(run.results) > 3
    assert run.frontier and all(p["p99_ms"] is not None for p in run.frontier)
    assert run.machine["cores"] and run.machine["gpu"] == "none" and run.host == runner.this_host()
    assert "Recommended" in run.message
    assert Event.objects.filter(deployment=deployment, message__contains=f"Tune {run.pk}: Recommended").exists()
    assert FakeServers.started[-1] == search.Config(instances=0)  # the servers were closed


def test_a_failing_search_ends_the_tune_failed_with_the_reason(deployment: Deployment,
                                                               synthetic: Synthetic) -> None:
    def broken(*args: Any) -> search.Measurement:
        raise OSError("no space left on device")

    run = queued(deployment)
    runner.run(run.pk, broken)
    run.refresh_from_db()
    assert run.status == "failed"
    assert "no space left on device" in run.message
    assert FakeServers.started[-1] == search.Config(instances=0)


def test_a_second_tune_on_the_machine_waits_and_says_whose(deployment: Deployment, charlie: Person,
                                                          synthetic: Synthetic) -> None:
    first = queued(deployment, status=TuneRun.Status.RUNNING, host=runner.this_host(), heartbeat_at=timezone.now())
    mine = queued(deployment)
    waiting = runner.run(mine.pk, fake_loadgen(synthetic))
    assert waiting == "Waiting for another tune on this machine (yours) to finish."
    mine.refresh_from_db()
    assert mine.status == "queued" and mine.message == waiting
    # Another team's deployment on the same machine waits too, and learns nothing of whose tune it waits for.
    other = Deployment.objects.create(team=charlie.team, name="other", runtime="local")
    theirs = queued(other)
    told = runner.run(theirs.pk, fake_loadgen(synthetic))
    assert told == "Waiting for another tune on this machine (another team's) to finish."
    theirs.refresh_from_db()
    assert deployment.team.name not in theirs.message
    first.refresh_from_db()
    assert first.status == "running"


def test_tunes_take_turns_across_teams_whoever_s_task_wakes_first(deployment: Deployment, charlie: Person,
                                                                  synthetic: Synthetic) -> None:
    """Team acme has tuned a minute ago and queued two more before charlie queued one: charlie's runs next, even
    when the task of acme's second tune is the one that finds the machine free."""
    queued(deployment, status=TuneRun.Status.DONE, started_at=timezone.now() - timedelta(minutes=1))
    acme_first, acme_second = queued(deployment), queued(deployment)
    other = Deployment.objects.create(team=charlie.team, name="other", runtime="local")
    charlies = queued(other, model_version=acme_first.model_version)
    assert runner.next_in_line() == charlies.pk
    told = runner.run(acme_second.pk, fake_loadgen(synthetic))
    assert told == "Waiting for its turn: the next tune is the oldest of the team that has waited longest."
    charlies.refresh_from_db()
    acme_first.refresh_from_db()
    acme_second.refresh_from_db()
    # It ran in acme's task (and failed: charlie's bare deployment has no revision to tune).
    assert charlies.started_at is not None and charlies.status == "failed", charlies.message
    assert acme_first.status == acme_second.status == "queued"
    assert deployment.team.name not in charlies.message and charlie.team.name not in acme_second.message
    # Now charlie has tuned last: acme's oldest is next, not its newest.
    assert runner.next_in_line() == acme_first.pk
    assert runner.run(acme_first.pk, fake_loadgen(synthetic)) is None
    assert runner.next_in_line() == acme_second.pk


def test_a_team_that_never_tuned_goes_before_one_that_did(deployment: Deployment, charlie: Person) -> None:
    queued(deployment, status=TuneRun.Status.DONE, started_at=timezone.now() - timedelta(days=30))
    acme = queued(deployment)
    other = Deployment.objects.create(team=charlie.team, name="other", runtime="local")
    charlies = queued(other, model_version=acme.model_version)
    assert runner.next_in_line() == charlies.pk
    TuneRun.objects.filter(pk=charlies.pk).update(cancel_requested=True)  # a cancelled one holds no turn
    assert runner.next_in_line() == acme.pk


def test_a_tune_whose_worker_died_no_longer_holds_the_machine(deployment: Deployment, synthetic: Synthetic) -> None:
    stale = timezone.now() - timedelta(seconds=runner.STALE_SECONDS + 1)
    dead = queued(deployment, status=TuneRun.Status.RUNNING, host=runner.this_host(), heartbeat_at=stale)
    run = queued(deployment)
    assert runner.run(run.pk, fake_loadgen(synthetic)) is None
    dead.refresh_from_db()
    run.refresh_from_db()
    assert dead.status == "failed" and "no heartbeat" in dead.message
    assert run.status == "done"


def test_a_tune_on_another_machine_is_no_obstacle(deployment: Deployment, synthetic: Synthetic) -> None:
    queued(deployment, status=TuneRun.Status.RUNNING, host="elsewhere", heartbeat_at=timezone.now())
    run = queued(deployment)
    assert runner.run(run.pk, fake_loadgen(synthetic)) is None
    run.refresh_from_db()
    assert run.status == "done"


def test_a_cancelled_queued_tune_never_starts(deployment: Deployment, synthetic: Synthetic) -> None:
    run = queued(deployment, cancel_requested=True)
    runner.run(run.pk, fake_loadgen(synthetic))
    run.refresh_from_db()
    assert run.status == "cancelled" and FakeServers.started == []


def test_a_waiting_tune_queues_itself_again(deployment: Deployment, synthetic: Synthetic,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    queued(deployment, status=TuneRun.Status.RUNNING, host=runner.this_host(), heartbeat_at=timezone.now())
    run = queued(deployment)
    sent: list[tuple[Any, int]] = []
    monkeypatch.setattr(tasks.run_tune, "apply_async", lambda args, countdown: sent.append((args, countdown)))
    tasks.run_tune(run.pk)
    assert sent == [((run.pk,), runner.WAIT_SECONDS)]


def test_the_settings_of_a_config_go_into_the_spec(deployment: Deployment) -> None:
    spec = deployment.revision.spec
    [entry] = spec.models
    tuned = runner.apply_config(spec, entry, search.Config(4, True, 32, 500))
    [model] = tuned.models
    assert model.instance_group.count == 4 and model.max_batch_size == 32
    assert model.dynamic_batching is not None and model.dynamic_batching.max_queue_delay_microseconds == 500
    off = runner.apply_config(spec, entry, search.Config(2)).models[0]
    assert off.dynamic_batching is None and off.max_batch_size == entry.max_batch_size


def test_the_sweep_stops_temporary_tritons_of_tunes_that_no_longer_run(
        deployment: Deployment, charlie: Person, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, settings: Any) -> None:
    """A worker killed mid-tune leaves its temporary Triton (the team's model, its memory) running: the sweep marks
    the tune failed once its heartbeat is long gone and stops the servers of tunes that do not run; a live tune's
    server and a young one are left alone."""
    settings.VAR_DIR = tmp_path
    prefix = f"{tmp_path / 'tuning'}/"
    long_ago = timezone.now() - timedelta(hours=1)
    dead = queued(deployment, status=TuneRun.Status.RUNNING, host=runner.this_host(), heartbeat_at=long_ago)
    live = queued(Deployment.objects.create(team=deployment.team, name="live", runtime="local"),
                  status=TuneRun.Status.RUNNING, host="elsewhere", heartbeat_at=timezone.now())
    over = queued(Deployment.objects.create(team=charlie.team, name="over", runtime="local"),
                  status=TuneRun.Status.DONE)
    servers = {101: dead.pk, 102: live.pk, 103: over.pk, 104: over.pk}
    for tune_id in set(servers.values()):
        (tmp_path / "tuning" / str(tune_id) / "c1" / "repository").mkdir(parents=True)
    stopped: list[int] = []
    monkeypatch.setattr(local_triton, "find_servers", lambda p: sorted(
        pid for pid, tune_id in servers.items() if pid not in stopped and f"{prefix}{tune_id}/".startswith(p)))
    monkeypatch.setattr(runner, "_tune_id", lambda pid, p: servers[pid] if p == prefix else None)
    monkeypatch.setattr(local_triton, "process_age", lambda pid: 5.0 if pid == 104 else 3600.0)
    monkeypatch.setattr(local_triton, "stop_server", lambda pid, grace_seconds: stopped.append(pid) or True)
    monkeypatch.setattr(runner, "_mtime", lambda path: 0.0)

    done = runner.sweep_servers()

    assert sorted(stopped) == [101, 103]
    dead.refresh_from_db()
    assert dead.status == "failed" and "no heartbeat" in dead.message
    live.refresh_from_db()
    assert live.status == "running"
    assert not (tmp_path / "tuning" / str(dead.pk)).exists()
    assert (tmp_path / "tuning" / str(live.pk)).exists()
    assert (tmp_path / "tuning" / str(over.pk)).exists()  # its young server (104) still runs there
    assert any(f"tune {dead.pk}" in line for line in done)


def test_a_temporary_triton_is_known_by_its_repository(tmp_path: Any) -> None:
    prefix = f"{tmp_path}/tuning/"
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                                f"--model-repository={prefix}42/c3/repository"])
    try:
        for _ in range(100):  # cmdline is briefly empty right after exec
            if runner._tune_id(process.pid, prefix) is not None:
                break
            time.sleep(0.02)
        assert runner._tune_id(process.pid, prefix) == 42
        assert runner._tune_id(process.pid, f"{tmp_path}/other/") is None
    finally:
        process.kill()
        process.wait()


def test_deleting_the_deployment_stops_its_tune(deployment: Deployment, synthetic: Synthetic) -> None:
    """A tune must not go on starting temporary Tritons of a deployment that was deleted (for up to its budget)."""
    measured: list[int] = []
    loadgen = fake_loadgen(synthetic)

    def deleting(url: str, body: bytes, concurrency: int, duration: float, warmup: float) -> search.Measurement:
        measured.append(concurrency)
        Deployment.objects.filter(pk=deployment.pk).update(desired_state=Deployment.Desired.DELETED)
        return loadgen(url, body, concurrency, duration, warmup)

    run = queued(deployment)
    runner.run(run.pk, deleting)
    run.refresh_from_db()
    assert run.status == "cancelled" and "deployment was deleted" in run.message
    assert len(measured) == 1
    assert FakeServers.started[-1] == search.Config(instances=0)  # its server was stopped
    # A queued one never starts.
    other = queued(deployment)
    assert runner.run(other.pk, loadgen) is None
    other.refresh_from_db()
    assert other.status == "cancelled" and "deployment was deleted" in other.message


def test_a_tune_within_noise_of_what_serves_keeps_it_and_apply_changes_nothing(alice: Person,
                                                                               deployment: Deployment,
                                                                               synthetic: Synthetic) -> None:
    """The newcomer's tune: every setting is as fast as the one that serves, and the first measurement of each other
    one happens to come out 6% higher. The close calls are measured again, the tune keeps the current setting and
    says it is within noise, and Apply rolls nothing out (before, it switched to whichever drew the luckiest run)."""
    [entry] = deployment.revision.spec.models
    current = runner.current_config(entry)
    runs: dict[str, int] = {}

    def loadgen(url: str, body: bytes, concurrency: int, duration: float, warmup: float) -> search.Measurement:
        n = runs[url] = runs.get(url, 0) + 1
        first = 1.0 if url == "http://fake/" + ",".join(str(v) for v in current.to_json().values()) else 1.06
        factor = first if n == 1 else (0.96 if n % 2 == 0 else 1.04)
        return search.Measurement(concurrency=concurrency, throughput=1000.0 * factor, p50_ms=5.0, p99_ms=10.0)

    run = queued(deployment)
    assert runner.run(run.pk, loadgen) is None
    run.refresh_from_db()
    assert run.status == "done", run.message
    assert run.recommendation["settings"] == current.to_json()
    assert run.recommendation["current"] and run.recommendation["kept_current"]
    assert run.recommendation["within_noise"] and run.recommendation["runs"] == 1 + search.REPEATS
    # The other setting: 1060, 960, 1040 (median 1040, spread 9.6%); the current: 1000, 960, 1040 (median 1000).
    assert run.message.startswith(f"Keep the current setting: {current.label()}: 1000 req/s")
    assert "measured 4.0% more than the current setting, within noise (4.0% apart, spread 9.6%)" in run.message
    [row] = [r for r in run.results if r["current"]]
    assert row["samples"] == [1000.0, 960.0, 1040.0] and row["throughput"] == 1000.0 and row["spread_pct"] == 8.0
    response = alice.client().post(f"/api/v1/deployments/digits-prod/tunes/{run.pk}/apply")
    assert response.status_code == 200, response.json()
    assert response.json()["changes"] == [] and response.json()["applied_revision"] == 1
    assert deployment.revisions.count() == 1


def test_each_missed_setting_says_why_in_the_recorded_results(deployment: Deployment, synthetic: Synthetic) -> None:
    run = queued(deployment, p99_target_ms=1.0)  # the synthetic model answers in 2 ms at best
    assert runner.run(run.pk, fake_loadgen(synthetic)) is None
    run.refresh_from_db()
    assert run.recommendation is None and run.results
    for row in run.results:
        assert not row["meets_target"]
        assert row["missed"].startswith("p99 ≤ 1 ms not met at any concurrency measured (32 clients: p99 "), row
        assert row["missed"].count("clients: p99") == len(row["points"])


def test_the_current_setting_is_what_a_tune_names_it(deployment: Deployment) -> None:
    """Applying the current setting as a tune names it renders the very spec that serves."""
    spec = deployment.revision.spec
    [entry] = spec.models
    assert runner.apply_config(spec, entry, runner.current_config(entry)) == spec
