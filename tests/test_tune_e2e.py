"""A real tune of the CNN sample: temporary Tritons (the local runtime's sandboxed launcher) measured by the load
generator in a subprocess, within the budget, recommending a setting that meets the target; nothing left running.
The worker's code runs in-process (runner.run is what the Celery task calls); tests/test_worker_e2e.py covers the
worker process itself."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.conf import settings

from deployments.models import Deployment
from deployments.runtimes.local import triton as local_triton
from models_registry.samples import make_resnet_onnx
from tests.support.people import Person
from tests.support.versions import make_ready_version
from tuning import runner
from tuning.models import TuneRun

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]

BUDGET_SECONDS = 90
P99_TARGET_MS = 150.0


def test_a_tune_of_the_cnn_sample_meets_its_target_within_its_budget(alice_tx: Person, tmp_path: Path) -> None:
    path = tmp_path / "resnet.onnx"
    make_resnet_onnx(path)
    make_ready_version(alice_tx, "resnet", data=path.read_bytes())
    client = alice_tx.client()
    response = client.post("/api/v1/deployments/", {"name": "cnn", "models": [{"model": "resnet"}]}, format="json")
    assert response.status_code == 201, response.json()
    response = client.post("/api/v1/deployments/cnn/tune", {"p99_ms": P99_TARGET_MS, "budget_seconds": BUDGET_SECONDS,
                                                            "concurrency_min": 1, "concurrency_max": 16},
                           format="json")
    assert response.status_code == 202, response.json()
    tune_id = response.json()["id"]

    started = time.monotonic()
    assert runner.run(tune_id) is None
    elapsed = time.monotonic() - started

    tune = TuneRun.objects.get(pk=tune_id)
    assert tune.status == "done", tune.message
    assert tune.recommendation is not None, tune.message
    assert tune.recommendation["p99_ms"] <= P99_TARGET_MS
    assert tune.recommendation["throughput"] > 0
    assert len(tune.results) >= 2 and tune.frontier
    assert all(r["errors"] == 0 for r in tune.results), tune.results
    # The budget bounds the measurements; stopping the last server may add its grace period.
    assert elapsed <= BUDGET_SECONDS + settings.TRITON_STOP_GRACE_SECONDS + 15, elapsed
    assert local_triton.find_servers(f"{Path(settings.VAR_DIR) / 'tuning'}/") == []
    assert not (Path(settings.VAR_DIR) / "tuning" / str(tune_id)).exists()
    # The deployment itself was never started by the tune.
    assert Deployment.objects.get(name="cnn").servers.count() == 0
    # Apply: a new revision with the recommended settings (the tune may lower the max batch size: accepted here on
    # purpose, as a user who knows no client sends more would).
    response = client.post(f"/api/v1/deployments/cnn/tunes/{tune_id}/apply", {"narrow": True}, format="json")
    assert response.status_code == 200, response.json()
    [entry] = Deployment.objects.get(name="cnn").revision.spec.models
    assert entry.instance_group.count == tune.recommendation["settings"]["instances"]
