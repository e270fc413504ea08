"""The CLI as a CI job runs it (`python -m modelport_cli` in a subprocess, configured by MODELPORT_URL and
MODELPORT_TOKEN only) against the whole portal over HTTP: uvicorn, a real Celery worker and beat, and the real
Triton of the local runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from django.conf import settings

from modelport_cli.errors import ExitCode
from models_registry.models import Blob, ModelVersion
from models_registry.samples import digits_holdout, make_digits_onnx, train_digits_classifier
from tests.processes import wait_for
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]


class Cli:
    def __init__(self, url: str, token: str, cache: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "MODELPORT_"))}
        self.env.update(MODELPORT_URL=url, MODELPORT_TOKEN=token, MODELPORT_CACHE_DIR=str(cache))

    def __call__(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "modelport_cli", *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=timeout)


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_ci_job_pushes_deploys_rolls_out_inspects_and_tears_down_with_the_cli(
    alice_tx: Person, portal_url: str, tmp_path: Path
) -> None:
    cli = Cli(portal_url, alice_tx.token, tmp_path / "cache")
    model = tmp_path / "digits.onnx"
    make_digits_onnx(model)

    pushed = cli("push", "digits", str(model))
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stdout == "1\n"
    assert ModelVersion.objects.get(model__name="digits", number=1).status == "ready"

    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not an ONNX model\n" * 100)
    rejected = cli("push", "junk", str(junk), "--format", "onnx")
    assert rejected.returncode == 3
    assert "not a valid ONNX model" in error_line(rejected)

    deployed = cli("deploy", "digits-prod", "--model", "digits:1", "--dynamic-batching", "--max-queue-delay-us", "2000",
                   "--instances", "2", "--wait", "--timeout", "120")
    assert deployed.returncode == 0, deployed.stderr
    assert deployed.stdout.startswith("digits-prod is ready: revision 1")

    status = json.loads(cli("status", "digits-prod", "--json").stdout)
    assert (status["status"], status["revision"], status["serving_revision"]) == ("ready", 1, 1)
    assert status["models"][0]["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert status["models"][0]["instance_group"]["count"] == 2
    deployment_dir = Path(settings.DEPLOYMENTS_DIR)
    config = next(deployment_dir.glob("*/r1/repository/digits/config.pbtxt")).read_text()
    assert "max_queue_delay_microseconds: 2000" in config and "count: 2" in config

    logs = cli("logs", "digits-prod", "--lines", "1000")
    assert logs.returncode == 0, logs.stderr
    assert "HTTP" in logs.stdout  # Triton's own log: "Started HTTPService at 0.0.0.0:..."

    # The pipeline runs again: the deployment exists, so the CLI rolls it to a new revision instead of failing.
    again = cli("deploy", "digits-prod", "--model", "digits:1", "--no-dynamic-batching", "--wait", "--json",
                "--timeout", "120")
    assert again.returncode == 0, again.stderr
    rolled = json.loads(again.stdout)
    assert (rolled["status"], rolled["revision"], rolled["serving_revision"]) == ("ready", 2, 2)
    assert rolled["models"][0]["dynamic_batching"] is None

    assert cli("stop", "digits-prod").returncode == 0
    wait_for(lambda: json.loads(cli("status", "digits-prod", "--json").stdout)["status"] == "stopped", 60,
             what="digits-prod to stop")
    started = cli("start", "digits-prod")
    assert started.returncode == 0, started.stderr
    wait_for(lambda: json.loads(cli("status", "digits-prod", "--json").stdout)["status"] == "ready", 90,
             what="digits-prod to be ready again")

    deleted = cli("delete", "digits-prod")
    assert deleted.returncode == 0, deleted.stderr
    wait_for(lambda: cli("status", "digits-prod").returncode == 2, 30, what="digits-prod to be gone")
    assert "HTTP 404" in error_line(cli("status", "digits-prod"))


def test_a_deployment_that_triton_cannot_load_exits_4_with_tritons_reason(
    alice_tx: Person, portal_url: str, tmp_path: Path
) -> None:
    from tests.artifacts import tiny_onnx

    cli = Cli(portal_url, alice_tx.token, tmp_path / "cache")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(tiny_onnx())
    pushed = cli("push", "broken", str(broken))
    assert pushed.returncode == 0, pushed.stderr
    version = ModelVersion.objects.get(model__name="broken", number=1)
    blob = Blob.objects.get(pk=version.sha256)
    (Path(settings.ARTIFACT_ROOT) / blob.key).write_bytes(tiny_onnx()[:60])  # the stored bytes rot

    failed = cli("deploy", "broken", "--model", "broken:1", "--wait", "--timeout", "120")

    assert failed.returncode == 4, failed.stderr
    line = error_line(failed)
    assert line.startswith("error: deployment broken failed: ")
    assert "failed to start" in line


def test_infer_goes_through_the_gateway_and_returns_what_the_model_computes(
    alice_tx: Person, portal_url: str, tmp_path: Path
) -> None:
    cli = Cli(portal_url, alice_tx.token, tmp_path / "cache")
    model = tmp_path / "digits.onnx"
    make_digits_onnx(model)
    assert cli("push", "digits", str(model)).returncode == 0
    deployed = cli("deploy", "digits-prod", "--model", "digits:1", "--wait", "--timeout", "120")
    assert deployed.returncode == 0, deployed.stderr
    X = digits_holdout()[0][:8].astype(np.float32)
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"inputs": [{"name": "input", "shape": list(X.shape), "datatype": "FP32",
                                               "data": X.flatten().tolist()}]}))

    inferred = cli("infer", "digits-prod", "digits", "--input", str(request), "--json")

    assert inferred.returncode == 0, inferred.stderr
    outputs = {o["name"]: o for o in json.loads(inferred.stdout)["outputs"]}
    assert [int(v) for v in np.ravel(outputs["label"]["data"])] == list(train_digits_classifier().predict(X))

    # A name the deployment or the token's team lacks is a wrong name on the command line, exit 2 as the README says,
    # in the gateway's words (the API's for a deployment).
    no_model = cli("infer", "digits-prod", "nosuch", "--input", str(request))
    assert no_model.returncode == ExitCode.USAGE
    assert error_line(no_model) == ("error: Deployment 'digits-prod' in team 'acme' serves no model named 'nosuch'. "
                                    "Its models: 'digits'. (HTTP 404 from POST /serve/digits-prod/v2/models/nosuch/"
                                    "infer)")
    deployment = cli("infer", "ghost", "digits", "--input", str(request))
    assert deployment.returncode == ExitCode.USAGE
    assert error_line(deployment).startswith("error: There is no deployment named 'ghost' in team 'acme', the team "
                                             "this request acts for. GET /api/v1/deployments/ lists")
    unknown = cli("deploy", "digits-dev", "--model", "nosuch")
    assert unknown.returncode == ExitCode.USAGE
    assert error_line(unknown).startswith("error: --model nosuch: There is no model named 'nosuch' in team 'acme'")
