"""Canary rollouts with real Tritons: uvicorn serving the portal and its gateway, a real Celery worker and beat (the
guardrails run in beat's check_canaries), and python models that answer their own version, so that which Triton
answered is told by the answer itself, not only by the gateway's Modelport-Revision header.

- a 20% canary serves 20% +- 3 points of 2,000 closed-loop requests (4 client threads);
- promote and rollback under load lose no request;
- a canary that answers errors is rolled back automatically within its window, with an event quoting the figures.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import requests

from deployments.models import Event
from tests.processes import wait_for
from tests.sandbox_helpers import python_version
from tests.support.people import Person, make_person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

ANSWER_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils

VALUE = {value}


class TritonPythonModel:
    def execute(self, requests):
        if VALUE < 0:
            raise RuntimeError("this revision is broken on purpose")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", np.full((len(
            pb_utils.get_input_tensor_by_name(r, "x").as_numpy()), 1), VALUE, dtype=np.float32))]) for r in requests]
'''
SIGNATURE = {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 1]}],
             "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 1]}]}
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}]}
NAME = "answer-prod"


@pytest.fixture
def alice_fast_checks(transactional_db: Any, monkeypatch: pytest.MonkeyPatch) -> Person:
    monkeypatch.setenv("CANARY_CHECK_SECONDS", "1")  # read by beat, started after this fixture
    return make_person("alice", "acme", role="admin")


def api(person: Person, method: str, path: str, body: Any = None) -> Any:
    client = person.client()
    response = getattr(client, method)(f"/api/v1/deployments/{path}", body, format="json")
    assert response.status_code < 300, (response.status_code, response.json())
    return response.json()


def wait_canary(person: Person, state: str | None, timeout: float = 120) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        body = api(person, "get", f"{NAME}/")
        canary = body["canary"]
        if state is None:
            return body if canary is None else None
        return body if canary is not None and canary["state"] == state else None

    return wait_for(reached, timeout, what=f"the canary to be {state}")  # type: ignore[no-any-return]


class Load:
    """Closed-loop clients through the gateway: each thread sends the next request when the last one answered."""

    def __init__(self, url: str, token: str, threads: int = 4) -> None:
        self.url = f"{url}/serve/{NAME}/v2/models/answer/infer"
        self.headers = {"Authorization": f"Bearer {token}"}
        self.threads = threads
        self.answers: list[tuple[float, int, int, str]] = []  # (time, status, value or -1, revision header)
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def one(self, session: requests.Session) -> None:
        response = session.post(self.url, json=BODY, headers=self.headers, timeout=30)
        value = int(response.json()["outputs"][0]["data"][0]) if response.status_code == 200 else -1
        with self.lock:
            self.answers.append((time.monotonic(), response.status_code, value,
                                 response.headers.get("Modelport-Revision", "")))

    def run(self, count: int) -> list[tuple[float, int, int, str]]:
        def client(n: int) -> None:
            with requests.Session() as session:
                for _ in range(n):
                    self.one(session)

        workers = [threading.Thread(target=client, args=(count // self.threads,)) for _ in range(self.threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return self.answers

    def start(self) -> list[threading.Thread]:
        def client() -> None:
            with requests.Session() as session:
                while not self.stop.is_set():
                    self.one(session)

        workers = [threading.Thread(target=client) for _ in range(self.threads)]
        for worker in workers:
            worker.start()
        return workers

    def finish(self, workers: list[threading.Thread]) -> list[tuple[float, int, int, str]]:
        self.stop.set()
        for worker in workers:
            worker.join()
        return self.answers


def test_a_canary_takes_its_share_is_promoted_and_rolled_back_without_losing_a_request_and_errors_roll_it_back(
        alice_fast_checks: Person, portal_url: str) -> None:
    for value in (1, 2, 3, -1):
        python_version(alice_fast_checks, "answer", {"model.py": ANSWER_MODEL.format(value=value).encode()}, SIGNATURE)
    created = alice_fast_checks.client().post("/api/v1/deployments/",
                                              {"name": NAME, "models": [{"model": "answer", "version": 1}]},
                                              format="json")
    assert created.status_code == 201, created.json()
    wait_for(lambda: api(alice_fast_checks, "get", f"{NAME}/")["status"] == "ready", 120, what="revision 1 to serve")

    # 1. A 20% canary: 2,000 closed-loop requests, each answered by the revision its header names.
    # (Guardrails out of the way of what this tests: a cold python model's first answers may be slower.)
    lenient = {"max_p99_ratio": 1000.0}
    api(alice_fast_checks, "patch", f"{NAME}/", {"models": [{"model": "answer", "version": 2}],
                                     "rollout": {"strategy": "canary", "percent": 20, **lenient}})
    wait_canary(alice_fast_checks, "serving")
    time.sleep(1)  # the gateway's route cache (GATEWAY_CACHE_TTL_SECONDS) has the canary's route
    answers = Load(portal_url, alice_fast_checks.token).run(2000)
    assert len(answers) == 2000 and all(status == 200 for _, status, _, _ in answers)
    values = Counter(value for _, _, value, _ in answers)
    assert set(values) == {1, 2}
    assert all(header == str(value) for _, _, value, header in answers)  # revision n answers n (versions = revisions)
    share = values[2] / 2000
    assert 0.17 <= share <= 0.23, values

    # 2. Promote under load: no request fails, and then every answer is revision 2's.
    load = Load(portal_url, alice_fast_checks.token)
    workers = load.start()
    time.sleep(2)
    api(alice_fast_checks, "post", f"{NAME}/promote")
    promoted_at = time.monotonic()
    time.sleep(4)  # past the route cache and the drain (ROLLOUT_DRAIN_SECONDS), the old Triton is stopped
    answers = load.finish(workers)
    assert answers and all(status == 200 for _, status, _, _ in answers), Counter(s for _, s, _, _ in answers)
    assert {value for at, _, value, _ in answers if at > promoted_at + 1} == {2}
    body = api(alice_fast_checks, "get", f"{NAME}/")
    assert body["serving_revision"] == 2 and body["canary"] is None

    # 3. A canary of revision 3 (answers 3), rolled back under load: no request fails, then only 2s.
    api(alice_fast_checks, "patch", f"{NAME}/", {"models": [{"model": "answer", "version": 3}],
                                     "rollout": {"strategy": "canary", "percent": 50, **lenient}})
    wait_canary(alice_fast_checks, "serving")
    load = Load(portal_url, alice_fast_checks.token)
    workers = load.start()
    time.sleep(3)
    api(alice_fast_checks, "post", f"{NAME}/rollback")
    rolled_back_at = time.monotonic()
    time.sleep(4)
    answers = load.finish(workers)
    assert all(status == 200 for _, status, _, _ in answers), Counter(s for _, s, _, _ in answers)
    assert {value for at, _, value, _ in answers if at < rolled_back_at} == {2, 3}
    assert {value for at, _, value, _ in answers if at > rolled_back_at + 1} == {2}

    # 4. A canary that answers errors (revision 4: version 4 raises) is rolled back by its guardrails.
    api(alice_fast_checks, "patch", f"{NAME}/", {"models": [{"model": "answer", "version": 4}],
                                     "rollout": {"strategy": "canary", "percent": 30, "window_seconds": 10,
                                                 "min_requests": 10}})
    wait_canary(alice_fast_checks, "serving")
    load = Load(portal_url, alice_fast_checks.token, threads=2)
    workers = load.start()
    serving_at = time.monotonic()
    try:
        wait_canary(alice_fast_checks, None, timeout=40)
    finally:
        answers = load.finish(workers)
    took = time.monotonic() - serving_at
    print(f"the erroring canary was rolled back {took:.1f} s after it began to serve")
    # Within its window (10 s): the gateway writes its statistics every 5 s and beat judges every second.
    assert took < 10, took
    failed = Counter(status for _, status, _, header in answers if header == "4")
    assert failed and all(status >= 500 for status in failed), failed
    event = Event.objects.filter(message__startswith="Canary revision 4 rolled back automatically").get()
    assert "canary error rate 100.0% > 5.0% over 10 s, stable 0.0%" in event.message
    body = api(alice_fast_checks, "get", f"{NAME}/")
    assert body["serving_revision"] == 2 and body["canary"] is None
