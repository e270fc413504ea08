"""The gateway over real HTTP: uvicorn serving portal.asgi, a real Celery worker and beat, a real Triton.
The stock tritonclient is the client, as a user's program would be."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from accounts import actions
from accounts.models import ApiToken
from deployments.models import Deployment
from tests.deploying import deploy, push, serving, wait_status
from tests.processes import wait_for
from tests.support.metrics import sample_sum
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def http_gateway_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_MAX_BODY_BYTES", str(2 * 1024 * 1024))
    monkeypatch.setenv("GATEWAY_UPSTREAM_TIMEOUT_SECONDS", "3")
    monkeypatch.setenv("GATEWAY_RATE_LIMIT_PER_SECOND", "30")
    monkeypatch.setenv("GATEWAY_RATE_LIMIT_BURST", "30")


def client_for(portal_url: str, name: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url=f"{portal_url.removeprefix('http://')}/serve/{name}")


def digits_inputs(rows: np.ndarray, binary: bool) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("input", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows.astype(np.float32), binary_data=binary)
    return [tensor]


def test_tritonclient_through_the_gateway_gets_exactly_what_triton_gives(
    http_gateway_settings: None, people: dict[str, Person], portal_url: str, digits_onnx: Path
) -> None:
    from models_registry.samples import digits_holdout

    alice = people["alice"]
    push(alice, digits_onnx)
    deploy(alice, "digits-prod", [{"model": "digits", "dynamic_batching": {"max_queue_delay_microseconds": 2000}}])
    wait_status(alice, "digits-prod", "ready")
    auth = {"Authorization": f"Bearer {alice.token}"}
    gateway = client_for(portal_url, "digits-prod")
    # tritonclient adds its own headers to the dict it is given: each call gets a copy.
    direct = httpclient.InferenceServerClient(url=f"127.0.0.1:{serving('digits-prod').http_port}")
    assert gateway.is_server_live(headers=dict(auth)) and gateway.is_server_ready(headers=dict(auth))
    assert gateway.is_model_ready("digits", headers=dict(auth))
    assert gateway.get_model_metadata("digits", headers=dict(auth)) == direct.get_model_metadata("digits")
    assert gateway.get_model_config("digits", headers=dict(auth)) == direct.get_model_config("digits")
    X, _ = digits_holdout()
    for binary in (False, True):
        via = gateway.infer("digits", digits_inputs(X[:16], binary), headers=dict(auth))
        straight = direct.infer("digits", digits_inputs(X[:16], binary))
        for output in ("label", "probabilities"):
            assert np.array_equal(via.as_numpy(output), straight.as_numpy(output)), (binary, output)

    # A model the deployment does not serve: the gateway's 404, the words a shared deployment gives too, where
    # Triton itself would answer "Request for unknown model" (tritonclient shows either message).
    with pytest.raises(InferenceServerException) as raised:
        gateway.get_model_metadata("nosuch", headers=dict(auth))
    assert raised.value.status() == "404"
    assert raised.value.message() == ("Deployment 'digits-prod' in team 'acme' serves no model named 'nosuch'. Its "
                                      "models: 'digits'.")
    with pytest.raises(InferenceServerException) as raised:
        direct.get_model_metadata("nosuch")
    assert "unknown model" in raised.value.message()

    # Triton's own errors pass through with their status and message.
    wrong = httpclient.InferInput("nope", [1, 64], "FP32")
    wrong.set_data_from_numpy(X[:1].astype(np.float32))
    with pytest.raises(InferenceServerException) as raised:
        gateway.infer("digits", [wrong], headers=dict(auth))
    assert raised.value.status() == "400"
    assert "nope" in raised.value.message()

    # Another team's user, a missing or bad token: 404 / 401, never a hint.
    url = f"{portal_url}/serve/digits-prod/v2/models/digits"
    charlie = requests.get(url, headers={"Authorization": f"Bearer {people['charlie'].token}"}, timeout=5)
    assert charlie.status_code == 404
    listed = "GET /api/v1/deployments/ lists the team's deployments."
    assert requests.get(f"{portal_url}/serve/ghost/v2/models/digits", headers=auth, timeout=5).json() == {
        "error": f"There is no deployment named 'ghost' in team 'acme', the team this request acts for. {listed}"}
    assert charlie.json() == {
        "error": f"There is no deployment named 'digits-prod' in team 'globex', the team this request acts for. "
                 f"{listed}"}
    assert requests.get(url, timeout=5).status_code == 401
    assert requests.get(url, headers={"Authorization": "Bearer mp_x_y"}, timeout=5).status_code == 401

    # Over the body limit: 413 before anything reaches Triton.
    big = requests.post(f"{url}/infer", data=b"x" * (3 * 1024 * 1024), headers=auth, timeout=10)
    assert big.status_code == 413
    assert "limit" in big.json()["error"]

    # Rate limit: 30 requests/s per token, 429 with Retry-After beyond it.
    # Sent 16 at a time, so that they arrive faster than the bucket refills even when a busy machine makes each slow.
    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda _: requests.get(f"{url}/ready", headers=auth, timeout=10), range(90)))
    limited = [r for r in codes if r.status_code == 429]
    assert limited and int(limited[0].headers["Retry-After"]) >= 1
    time.sleep(1.5)

    # Statistics: Prometheus metrics and the per-deployment API (flushed every few seconds).
    metrics = requests.get(f"{portal_url}/metrics", timeout=5).text
    assert sample_sum(metrics, "modelport_gateway_requests_total", code="200", deployment="digits-prod", model="digits",
                      team="acme") > 0
    stats = wait_for(lambda: (s := alice.client().get("/api/v1/deployments/digits-prod/metrics/").json())["requests"]
                     > 0 and s,
                     15, what="gateway statistics")
    assert stats["p50_ms"] is not None and stats["series"]

    # Revoking a token takes effect within a second.
    actions.revoke_token(ApiToken.objects.get(user=alice.user), by=alice.user, via="session")
    time.sleep(1.0)
    assert requests.get(f"{url}/ready", headers=auth, timeout=5).status_code == 401


def test_a_stopped_or_unreachable_deployment_answers_503_or_502_and_a_slow_one_504(
    http_gateway_settings: None, people: dict[str, Person], portal_url: str, digits_onnx: Path, tmp_path: Path
) -> None:
    from tests.artifacts import sleepy_python_model_zip

    alice = people["alice"]
    auth = {"Authorization": f"Bearer {alice.token}"}
    archive = tmp_path / "sleepy.zip"
    archive.write_bytes(sleepy_python_model_zip())
    client = alice.client()
    client.post("/api/v1/models/", {"name": "sleepy"}, format="json")
    from django.core.files.uploadedfile import SimpleUploadedFile

    response = client.post("/api/v1/models/sleepy/versions/", {
        "file": SimpleUploadedFile("sleepy.zip", archive.read_bytes()),
        "signature": json.dumps({"inputs": [{"name": "seconds", "datatype": "FP32", "dims": [-1, 1]}],
                                 "outputs": [{"name": "slept", "datatype": "FP32", "dims": [-1, 1]}]}),
    }, format="multipart")
    assert response.status_code == 201, response.json()
    wait_for(lambda: client.get("/api/v1/models/sleepy/versions/1/").json()["status"] == "ready", 30, what="inspection")
    deploy(alice, "sleepy", [{"model": "sleepy", "max_batch_size": 4}])
    wait_status(alice, "sleepy", "ready")
    infer = f"{portal_url}/serve/sleepy/v2/models/sleepy/infer"

    def body(seconds: float) -> dict[str, Any]:
        return {"inputs": [{"name": "seconds", "shape": [1, 1], "datatype": "FP32", "data": [seconds]}]}

    assert requests.post(infer, json=body(0), headers=auth, timeout=10).status_code == 200
    slow = requests.post(infer, json=body(6), headers=auth, timeout=20)
    assert slow.status_code == 504
    assert "did not answer within 3 s" in slow.json()["error"]

    # Triton gone before the reconciler noticed: 502.
    Deployment.objects.filter(name="sleepy").update(upstream_url="http://127.0.0.1:9")
    time.sleep(1.0)
    unreachable = requests.post(infer, json=body(0), headers=auth, timeout=10)
    assert unreachable.status_code == 502
    assert "unreachable" in unreachable.json()["error"]

    assert client.post("/api/v1/deployments/sleepy/stop").status_code == 202
    wait_status(alice, "sleepy", "stopped")
    time.sleep(1.0)
    stopped = requests.post(infer, json=body(0), headers=auth, timeout=10)
    assert stopped.status_code == 503
    assert stopped.headers["Retry-After"] == "2"
    assert "not ready" in stopped.json()["error"]


def test_a_client_hammering_during_a_rollout_sees_zero_failed_requests(
    people: dict[str, Person], portal_url: str, digits_onnx: Path
) -> None:
    alice = people["alice"]
    push(alice, digits_onnx)
    deploy(alice, "digits-prod", [{"model": "digits", "dynamic_batching": {"max_queue_delay_microseconds": 100}}])
    wait_status(alice, "digits-prod", "ready")
    url = f"{portal_url}/serve/digits-prod/v2/models/digits/infer"
    payload = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
    outcomes: list[int] = []
    done = asyncio.Event()

    async def hammer(session: aiohttp.ClientSession) -> None:
        while not done.is_set():
            async with session.post(url, json=payload) as response:
                await response.read()
                outcomes.append(response.status)

    async def scenario() -> None:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {alice.token}"}) as session:
            workers = [asyncio.create_task(hammer(session)) for _ in range(8)]
            await asyncio.sleep(1.0)
            patched = await asyncio.to_thread(
                alice.client().patch, "/api/v1/deployments/digits-prod/",
                {"models": [{"model": "digits", "dynamic_batching": {"max_queue_delay_microseconds": 3000}}]},
                format="json")
            assert patched.status_code == 200

            def switched() -> bool:
                d = Deployment.objects.get(name="digits-prod")
                return d.serving_revision is not None and d.serving_revision.number == 2 and d.status == "ready"

            await asyncio.to_thread(wait_for, switched, 90, 0.2, "the rollout")
            await asyncio.sleep(4.0)  # the old server drains and stops while traffic continues
            done.set()
            await asyncio.gather(*workers)

    asyncio.run(scenario())
    assert len(outcomes) > 100
    assert set(outcomes) == {200}, {code: outcomes.count(code) for code in set(outcomes)}


def raw_http(port: int, request: bytes) -> tuple[int, bytes]:
    """One request written byte for byte (no client library normalizes the path), on its own connection."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def test_hostile_requests_neither_crash_triton_nor_mix_up_anyones_answers(
    people: dict[str, Person], portal_url: str, digits_onnx: Path
) -> None:
    """Issue 12 against the real Triton: the smuggling exploit (which made 29 of 30 later answers someone else's),
    the two requests that killed Triton (a declared shape of [2**40, 64], a million '['), Triton's 500s for client
    mistakes and its admin APIs."""
    from models_registry.samples import digits_holdout

    alice = people["alice"]
    push(alice, digits_onnx)
    deploy(alice, "digits-prod", [{"model": "digits"}])
    wait_status(alice, "digits-prod", "ready")
    port = int(portal_url.rsplit(":", 1)[1])
    auth = f"Authorization: Bearer {alice.token}\r\nHost: portal\r\nConnection: close\r\n"
    triton = serving("digits-prod")
    direct = httpclient.InferenceServerClient(url=f"127.0.0.1:{triton.http_port}")
    gateway = client_for(portal_url, "digits-prod")
    X, _ = digits_holdout()

    smuggled = ("/serve/digits-prod/v2/models/digits%20HTTP/1.1%0D%0AHost:%20x%0D%0A%0D%0A"
                "GET%20/v2/logging%20HTTP/1.1%0D%0AX-Pad:%20y")
    status, body = raw_http(port, f"GET {smuggled} HTTP/1.1\r\n{auth}\r\n".encode())
    assert status == 400, body
    # HEAD made Triton send a body nobody read: the next answer on that connection would have been off by one.
    status, body = raw_http(port, f"HEAD /serve/digits-prod/v2/health/ready HTTP/1.1\r\n{auth}\r\n".encode())
    assert status == 200 and body == b""
    for row in range(30):
        via = gateway.infer("digits", digits_inputs(X[row:row + 1], binary=row % 2 == 0), headers={
            "Authorization": f"Bearer {alice.token}"})
        straight = direct.infer("digits", digits_inputs(X[row:row + 1], binary=False))
        assert np.array_equal(via.as_numpy("probabilities"), straight.as_numpy("probabilities")), row

    url = f"{portal_url}/serve/digits-prod/v2/models/digits/infer"
    headers = {"Authorization": f"Bearer {alice.token}"}
    huge = {"inputs": [{"name": "input", "shape": [2**40, 64], "datatype": "FP32", "data": [0.0] * 64}]}
    assert requests.post(url, json=huge, headers=headers, timeout=10).status_code == 413
    deep = requests.post(url, data=b"[" * 1_000_000, headers=headers, timeout=10)
    assert deep.status_code == 400 and "nests deeper" in deep.json()["error"]
    # Strings for FP32 (Triton: a 500, "Unable to parse 'data': attempt to access JSON non-number as double"): the
    # gateway's 400 names the input, its datatype and what was sent.
    strings = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": ["0.5"] * 64}]}
    typed = requests.post(url, json=strings, headers=headers, timeout=10)
    assert typed.status_code == 400, typed.text
    assert typed.json() == {"error": "Input 'input' is FP32: its 'data' must be JSON numbers, but data[0] is the "
                                     'string "0.5" (send 0.5 as a number, without quotes).'}
    straight = requests.post(f"http://127.0.0.1:{serving('digits-prod').http_port}/v2/models/digits/infer",
                             json=strings, timeout=10)
    assert straight.status_code >= 400 and "Unable to parse 'data'" in straight.json()["error"], straight.text
    raw = requests.post(url, data=b"\0" * 10, headers={**headers, "Inference-Header-Content-Length": "0"}, timeout=10)
    assert raw.status_code == 400 and "raw_input" not in raw.json()["error"], raw.text
    assert "Expected 256, got 10" in raw.json()["error"]

    for method, path in [("GET", "/v2/logging"), ("POST", "/v2/repository/index"),
                         ("GET", "/v2/systemsharedmemory/status"), ("GET", "/v2/trace/setting")]:
        refused = requests.request(method, f"{portal_url}/serve/digits-prod{path}", headers=headers, timeout=10)
        assert refused.status_code == 403, (method, path)
    with pytest.raises(InferenceServerException) as raised:
        gateway.get_log_settings(headers=dict(headers))
    assert raised.value.status() == "403"
    stats = gateway.get_inference_statistics("digits", headers=dict(headers))
    assert stats["model_stats"][0]["name"] == "digits"

    # Triton is alive and answers as before.
    assert direct.is_server_ready()
    assert gateway.is_model_ready("digits", headers=dict(headers))
    assert Deployment.objects.get(name="digits-prod").status == "ready"
