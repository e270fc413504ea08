"""Worker starvation (issue 21): another team's stop is answered within seconds while one team's uploads spin in
inspection until their time limit and its tune measures, with the worker lanes `make run` starts (infra/lanes.py:
real Celery worker processes, one per lane). The same scenario against the old layout (one worker, two threads, every
queue) fails: the tune holds one thread, a spinning inspection the other, and the stop waits for the inspection to
reach its time limit (strict xfail, so a regression to one shared worker shows).

The spinning inspections are real inspection work: TorchScript files whose forward never returns, whose trial run
(modelport/core/trial_run.py, in the runtime env) spins until TRIAL_RUN_TIMEOUT_SECONDS. The tune is a real one of
a tiny ONNX model (tuning/runner.py): temporary Tritons started through the local runtime's sandboxed launcher and
measured by the load generator, with a latency target no setting meets, so that every setting is measured at each
concurrency and the tune is still measuring when the stop comes. Team B's deployment is on the local runtime with
no Triton running, so its stop is a reconcile tick and nothing else."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile

from deployments.models import Deployment
from deployments.runtimes.local import triton as local_triton
from infra.lanes import LANES, Lane
from infra.queues import Queue
from models_registry.models import ModelVersion
from tests import processes
from tests.support.people import Person, make_person
from tests.support.versions import make_ready_version
from tuning.api import MIN_P99_MS
from tuning.models import TuneRun

pytestmark = [pytest.mark.worker, pytest.mark.triton, pytest.mark.frameworks("torch"),
              pytest.mark.django_db(transaction=True)]

TRIAL_RUN_SECONDS = 20  # how long each spinning inspection holds its worker slot
STOP_WITHIN_SECONDS = 6.0
TUNE_BUDGET_SECONDS = 60  # long enough to be measuring still when the stop comes, on a loaded machine
OLD_LAYOUT = (Lane("all", (Queue.RECONCILE, Queue.INSPECTION, Queue.TUNE), "threads", 2),)  # before the lanes

SPIN = """
import sys
import torch

class Spin(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        i = 0
        while i >= 0:
            i += 1
        return x

torch.jit.save(torch.jit.script(Spin()), sys.argv[1])
"""
SIGNATURE = {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}],
             "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 4]}]}


@pytest.fixture(scope="module")
def spin_pt(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    from django.conf import settings

    folder = tmp_path_factory.mktemp("spin")
    (folder / "build.py").write_text(textwrap.dedent(SPIN))
    python = Path(settings.MODELPORT_RUNTIME_ENV) / "bin" / "python"
    done = subprocess.run([str(python), str(folder / "build.py"), str(folder / "spin.pt")], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return (folder / "spin.pt").read_bytes()


@pytest.fixture
def scene(transactional_db: Any) -> tuple[Person, Person]:
    """Team A with a deployment of a tiny ONNX model to tune (stopped: the tune starts temporary Tritons of its own,
    and a running deployment would only add a server), team B with nothing yet."""
    team_a, team_b = make_person("alice", "acme", role="admin"), make_person("charlie", "globex", role="admin")
    make_ready_version(team_a, "tiny")
    response = team_a.client().post("/api/v1/deployments/", {"name": "a-tuned", "models": [{"model": "tiny"}]},
                                    format="json")
    assert response.status_code == 201, response.json()
    Deployment.objects.filter(name="a-tuned").update(desired_state=Deployment.Desired.STOPPED,
                                                     status=Deployment.Status.STOPPED)
    return team_a, team_b


@pytest.fixture
def workers(request: pytest.FixtureRequest, scene: tuple[Person, Person], tmp_path: Path) -> Iterator[None]:
    processes.purge_broker()  # the creation's reconcile among them: the deployment stays stopped
    started = processes.start_lanes(request.param, tmp_path, {
        "TRIAL_RUN_TIMEOUT_SECONDS": str(TRIAL_RUN_SECONDS),
        "INSPECTION_TIME_LIMIT_SECONDS": str(TRIAL_RUN_SECONDS + 30)})
    try:
        yield
    finally:
        # A running tune stops at its next measurement and stops its Triton; one killed mid-tune would leave it.
        TuneRun.objects.filter(status__in=[TuneRun.Status.QUEUED, TuneRun.Status.RUNNING]).update(
            cancel_requested=True)
        try:
            processes.wait_for(lambda: not TuneRun.objects.filter(status=TuneRun.Status.RUNNING).exists(), 60,
                               what="the tune to stop")
        finally:
            for process in started:
                processes.kill(process)
            for pid in local_triton.find_servers(f"{tuning_dir()}/"):
                local_triton.stop_server(pid, grace_seconds=5)
            processes.print_logs(tmp_path)


def tuning_dir() -> Path:
    return Path(settings.VAR_DIR) / "tuning"


def measuring(tune_id: int) -> bool:
    """The tune runs and its temporary Triton is up (a measurement runs, or is about to)."""
    running = TuneRun.objects.filter(pk=tune_id, status=TuneRun.Status.RUNNING).exists()
    return running and bool(local_triton.find_servers(f"{tuning_dir() / str(tune_id)}/"))


def stop_seconds(team_b: Person) -> float:
    """Team B stops its deployment; seconds until the reconciler has stopped it."""
    Deployment.objects.create(team=team_b.team, name="b-prod", runtime="local", status=Deployment.Status.FAILED,
                              status_message="Failed before the test.")
    began = time.monotonic()
    assert team_b.client().post("/api/v1/deployments/b-prod/stop").status_code == 202
    processes.wait_for(lambda: Deployment.objects.get(name="b-prod").status == Deployment.Status.STOPPED,
                       TRIAL_RUN_SECONDS * 3, interval=0.1, what="team B's stop")
    return time.monotonic() - began


# `spinning`: the inspections that hold a worker slot each; the old layout's second thread is the tune's.
@pytest.mark.parametrize(("workers", "spinning"), [
    pytest.param(LANES, 2, id="lanes"),
    pytest.param(OLD_LAYOUT, 1, id="one-shared-worker", marks=pytest.mark.xfail(
        strict=True, reason="one worker for every queue: the stop waits for a spinning inspection")),
], indirect=["workers"])
def test_another_team_s_stop_is_answered_within_seconds_while_one_team_s_inspections_spin_and_its_tune_runs(
        workers: None, scene: tuple[Person, Person], spin_pt: bytes, spinning: int) -> None:
    team_a, team_b = scene
    client = team_a.client()
    # A latency target no setting meets: each setting is measured at every concurrency, so the tune goes on.
    response = client.post("/api/v1/deployments/a-tuned/tune", {
        "p99_ms": MIN_P99_MS, "budget_seconds": TUNE_BUDGET_SECONDS, "concurrency_min": 1, "concurrency_max": 2},
        format="json")
    assert response.status_code == 202, response.json()
    tune_id = response.json()["id"]
    client.post("/api/v1/models/", {"name": "spin"}, format="json")
    for _ in range(4):
        response = client.post("/api/v1/models/spin/versions/", {
            "file": SimpleUploadedFile("spin.pt", spin_pt), "signature": json.dumps(SIGNATURE)}, format="multipart")
        assert response.status_code == 201, response.json()
    processes.wait_for(lambda: measuring(tune_id), 90, what="the tune's temporary Triton")
    # Every inspection slot spins (the trial run has begun on each), the other uploads wait their turn.
    processes.wait_for(lambda: ModelVersion.objects.filter(inspection_started_at__isnull=False).count() >= spinning,
                       60, what=f"{spinning} inspections to start")
    time.sleep(3)  # well into the trial runs (importing torch takes a few seconds)
    assert ModelVersion.objects.filter(status=ModelVersion.Status.VALIDATING).count() == 4
    assert measuring(tune_id)
    seconds = stop_seconds(team_b)
    print(f"team B's stop took {seconds:.1f} s with team A's inspections spinning and its tune measuring")
    assert seconds < STOP_WITHIN_SECONDS
    # The tune lane was busy all along, and with a real tune: it measured its Tritons under load.
    assert TuneRun.objects.get(pk=tune_id).status == TuneRun.Status.RUNNING
    processes.wait_for(lambda: TuneRun.objects.get(pk=tune_id).status == TuneRun.Status.DONE,
                       TUNE_BUDGET_SECONDS + 60, interval=0.5, what="the tune to end")
    tune = TuneRun.objects.get(pk=tune_id)
    points = [point for result in tune.results for point in result["points"]]
    assert points and all(point["requests"] > 0 for point in points), (tune.message, tune.results)
    assert local_triton.find_servers(f"{tuning_dir()}/") == []
