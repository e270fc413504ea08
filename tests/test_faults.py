"""The portal under faults, on the real stack: its own web, worker and beat processes, a real PostgreSQL database
of the test's own, a private Redis, real Triton servers. (Infrastructure and why it never touches the machine's
shared PostgreSQL or Redis: tests/faults.py.)

- A worker stopped with SIGTERM sent to its whole process group (systemd, supervisord, Ctrl-C) while a task runs
  exits within seconds; the deployment it was starting becomes ready under the next worker.
- Redis restarted (losing every queued and unacknowledged task) while deployments start: every one becomes ready.
- PostgreSQL down: the API answers 503 in JSON, pages 503 in HTML, nothing is half-written, the processes keep
  running, and everything works again without a restart once it is back. The gateway keeps serving a deployment
  whose route it has cached, and its lookups recover with the database (gateway/access.py replaces the dropped
  connections of its lookup threads).
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployments.runtimes.local.triton import is_alive
from tests.artifacts import PYTHON_SIGNATURE, tiny_onnx
from tests.faults import (
    PG_HOST,
    PG_PORT,
    CuttableProxy,
    Portal,
    PrivateRedis,
    Template,
    drop_database,
    make_template,
    portal_on,
    wait_exit,
)
from tests.processes import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.worker]

# How long systemd (TimeoutStopSec, 90 s by default) or Kubernetes (terminationGracePeriodSeconds, 30 s) waits; the
# worker must be well within the shortest. (It takes 3-4 s here; the prefork pool took 10 s, or hung.)
GRACE_SECONDS = 8

SLOW_LOADING_MODEL = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Takes 20 s to load (a big model would): the reconciler looks at it every tick meanwhile."""

    def initialize(self, args):
        time.sleep(20)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", (x * 2).astype(np.float32))]))
        return responses
'''


def slow_loading_model_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model.py", SLOW_LOADING_MODEL)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Template]:
    """One migrated database with alice and her token; each test gets a copy (CREATE DATABASE ... TEMPLATE)."""
    name = f"wt_faults_template_{os.getpid()}"
    try:
        yield make_template(tmp_path_factory.mktemp("template"), name)
    finally:
        drop_database(name)


@pytest.fixture
def database(request: pytest.FixtureRequest) -> str:
    return f"wt_faults_{os.getpid()}_{re.sub(r'[^a-z0-9]+', '_', request.node.name.lower())[-30:]}"


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def push(portal: Portal, name: str, file_name: str, data: bytes, signature: dict[str, Any] | None = None) -> int:
    portal.post("/api/v1/models/", json={"name": name})
    form = {"signature": json.dumps(signature)} if signature else {}
    response = portal.post(f"/api/v1/models/{name}/versions/", files={"file": (file_name, data)}, data=form)
    assert response.status_code == 201, response.text
    number = int(response.json()["number"])
    version = wait_for(lambda: (v := portal.get(f"/api/v1/models/{name}/versions/{number}/").json())["status"]
                       != "validating" and v,
                       60, interval=0.5, what=f"the worker to inspect {name}")
    assert version["status"] == "ready", version
    return number


def deploy(portal: Portal, name: str, model: str) -> None:
    response = portal.post("/api/v1/deployments/", json={"name": name, "models": [{"model": model}]})
    assert response.status_code == 201, response.text


def infer_tiny(portal: Portal, deployment: str) -> list[float]:
    response = portal.post(f"/serve/{deployment}/v2/models/tiny/infer",
                           json={"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"]  # type: ignore[no-any-return]


def log_count(portal: Portal, name: str, text: str) -> int:
    path = portal.log(name)
    return path.read_text(errors="replace").count(text) if path.exists() else 0


def starting_pid(events: list[str]) -> int | None:
    for message in events:
        found = re.search(r"Triton for revision 1 is starting \(pid (\d+),", message)
        if found:
            return int(found.group(1))
    return None


@pytest.mark.triton
@pytest.mark.parametrize(("broker", "target"), [
    ("filesystem", "group"),  # make run: the threads pool
    ("redis", "group"),  # systemd, supervisord: the prefork pool's children get the signal too
    ("redis", "main"),  # docker stop, Kubernetes: only the main process does
])
def test_a_worker_sigtermed_with_its_process_group_exits_within_seconds_and_the_deployment_still_starts(
        tmp_path: Path, template: Template, database: str, broker: str, target: str,
        request: pytest.FixtureRequest) -> None:
    broker_url = request.getfixturevalue("redis").url if broker == "redis" else "filesystem://"
    with portal_on(tmp_path, template, database, broker_url) as portal:
        portal.start_all()
        push(portal, "slow", "model.zip", slow_loading_model_zip(), PYTHON_SIGNATURE)
        deploy(portal, "slow", "slow")
        pid = wait_for(lambda: starting_pid(portal.events("slow")), 60, interval=0.5, what="Triton to be launched")
        time.sleep(1)  # the model is now loading (20 s), and the worker ticks the deployment every second

        worker = portal.processes["worker"]
        if target == "group":
            os.killpg(worker.pid, signal.SIGTERM)  # the worker and all its pool processes, as systemd does
        else:
            os.kill(worker.pid, signal.SIGTERM)
        seconds = wait_exit(worker, GRACE_SECONDS * 3)
        assert seconds is not None, (f"the worker still runs {GRACE_SECONDS * 3} s after SIGTERM:\n"
                                     f"{portal.tail('worker')}")
        print(f"the worker stopped {seconds:.1f} s after SIGTERM")
        assert seconds < GRACE_SECONDS, f"the worker took {seconds:.1f} s to stop"
        assert is_alive(pid), "the Triton being started was left to load, for the next worker to adopt"

        portal.start_worker("worker-2")
        body = portal.wait_status("slow", "ready", timeout=150)
        assert body["serving_revision"] == 1
        assert any(f"Revision 1 is ready and serving (pid {pid}," in m for m in portal.events("slow")), \
            "the next worker adopted the server instead of starting a second one"
        response = portal.post("/serve/slow/v2/models/slow/infer",
                               json={"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                                 "data": [1, 2, 3, 4]}]})
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [2, 4, 6, 8]


@pytest.mark.triton
def test_deployments_starting_while_redis_restarts_all_become_ready(
        tmp_path: Path, template: Template, database: str, redis: PrivateRedis) -> None:
    with portal_on(tmp_path, template, database, redis.url) as portal:
        portal.start_all()
        push(portal, "tiny", "model.onnx", tiny_onnx())
        # Two worker processes: ticks of the three deployments queue in Redis between each other.
        for name in ("first", "second", "third"):
            deploy(portal, name, "tiny")
        redis.stop()  # no persistence: every queued and unacknowledged task is gone

        # Created while the broker is down: saved and answered 201, picked up once the broker is back.
        deploy(portal, "during", "tiny")
        time.sleep(2)
        redis.start()

        for name in ("first", "second", "third", "during"):
            portal.wait_status(name, "ready", timeout=180)
            assert infer_tiny(portal, name) == pytest.approx(infer_tiny(portal, "first"))
        for name, process in portal.processes.items():
            assert process.poll() is None, f"{name} exited when Redis restarted"


def test_while_postgresql_is_down_the_portal_answers_503_and_recovers_by_itself(
        tmp_path: Path, template: Template, database: str) -> None:
    proxy = CuttableProxy(PG_HOST, PG_PORT)
    try:
        with portal_on(tmp_path, template, database, "filesystem://", db_port=proxy.port) as portal:
            portal.start_all()
            browser = portal.browser()
            push(portal, "tiny", "model.onnx", tiny_onnx())

            proxy.cut()
            listing = portal.get("/api/v1/models/")
            assert listing.status_code == 503, listing.text
            assert listing.headers["Retry-After"] == "5"
            assert listing.json()["error"]["code"] == "database_unavailable"
            created = portal.post("/api/v1/models/", json={"name": "during"})
            assert created.status_code == 503, created.text
            page = browser.get(portal.url + "/models/", timeout=30)
            assert page.status_code == 503
            assert page.headers["Content-Type"].startswith("text/html")
            assert "cannot reach its database" in page.text and "Traceback" not in page.text
            health = portal.get("/healthz")
            assert health.status_code == 200 and health.json()["database"] == "unavailable"
            # Beat ticks every second meanwhile (the test settings): its tasks fail on the worker, and neither may
            # die of it. Waited for in their logs, not assumed after a sleep (a loaded machine ticks late).
            sent, received = log_count(portal, "beat", "Sending due task"), log_count(portal, "worker", "] received")
            wait_for(lambda: log_count(portal, "beat", "Sending due task") >= sent + 3
                     and log_count(portal, "worker", "] received") >= received + 3,
                     60, interval=0.5, what="beat to send three due tasks and the worker to receive them")
            for name, process in portal.processes.items():
                assert process.poll() is None, f"{name} exited while PostgreSQL was down:\n{portal.tail(name)}"

            proxy.restore()
            wait_for(lambda: portal.get("/api/v1/models/").status_code == 200, 15, what="the API to recover")
            assert [m["name"] for m in portal.get("/api/v1/models/").json()] == ["tiny"]  # nothing half-created
            assert browser.get(portal.url + "/models/", timeout=30).status_code == 200  # the session survived
            assert push(portal, "tiny", "model.onnx", tiny_onnx(out_features=2)) == 2  # the worker recovered too
    finally:
        proxy.cut()


@pytest.mark.triton
def test_the_gateway_keeps_serving_a_ready_deployment_while_postgresql_is_down(
        tmp_path: Path, template: Template, database: str) -> None:
    proxy = CuttableProxy(PG_HOST, PG_PORT)
    try:
        with portal_on(tmp_path, template, database, "filesystem://", db_port=proxy.port) as portal:
            portal.start_all()
            push(portal, "tiny", "model.onnx", tiny_onnx())
            deploy(portal, "tiny", "tiny")
            portal.wait_status("tiny", "ready", timeout=120)
            expected = infer_tiny(portal, "tiny")  # the route and the token are now in the gateway's cache

            proxy.cut()
            deadline = time.monotonic() + 5  # ten times the cache's TTL
            while time.monotonic() < deadline:
                assert infer_tiny(portal, "tiny") == pytest.approx(expected)
                time.sleep(0.2)

            proxy.restore()
            wait_for(lambda: portal.get("/api/v1/deployments/tiny/").status_code == 200, 15, what="the API to recover")
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:  # past the cache's TTL: fresh answers from the database again
                assert infer_tiny(portal, "tiny") == pytest.approx(expected)
                time.sleep(0.2)
    finally:
        proxy.cut()
