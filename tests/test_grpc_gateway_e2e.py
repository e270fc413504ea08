"""The gRPC gateway over real sockets: `manage.py grpc_gateway` beside uvicorn, a real Celery worker and beat, a real
Triton. The stock tritonclient.grpc is the client, as a user's program would be, called through the gateway and
straight at the deployment's Triton, and the answers compared."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from accounts import actions
from accounts.models import ApiToken
from deployments.models import Deployment
from tests.deploying import deploy, push, serving, wait_status
from tests.processes import GrpcGatewayProcess, wait_for
from tests.support.metrics import sample_sum
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

ROWS = 16384  # 4 MiB of FP32 in one tensor


@pytest.fixture
def grpc_gateway_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_MAX_BODY_BYTES", str(16 * 1024 * 1024))
    monkeypatch.setenv("GATEWAY_MAX_TENSOR_BYTES", str(16 * 1024 * 1024))
    monkeypatch.setenv("GATEWAY_RATE_LIMIT_PER_SECOND", "100")
    monkeypatch.setenv("GATEWAY_RATE_LIMIT_BURST", "100")


def headers(person: Person | str, deployment: str = "digits-prod") -> dict[str, str]:
    token = person if isinstance(person, str) else person.token
    return {"authorization": f"Bearer {token}", "modelport-deployment": deployment}


def digits_input(rows: np.ndarray) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("input", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows.astype(np.float32))
    return [tensor]


def status_of(call: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as raised:
        call()
    return str(raised.value.status()), str(raised.value.message())


def stream_all(client: grpcclient.InferenceServerClient, batches: list[np.ndarray],
               metadata: dict[str, str] | None) -> dict[str, Any]:
    """Send every batch on one ModelStreamInfer stream; the answers (or errors) by request id."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=metadata)
    try:
        for index, rows in enumerate(batches):
            client.async_stream_infer("digits", digits_input(rows), request_id=str(index))
        received: dict[str, Any] = {}
        for _ in batches:
            result, error = answers.get(timeout=60)
            assert error is None, (error.status(), error.message(), metadata is not None)
            received[result.get_response().id] = result
        return received
    finally:
        client.stop_stream()


def test_tritonclient_grpc_through_the_gateway_gets_exactly_what_triton_gives(
    grpc_gateway_settings: None, people: dict[str, Person], portal_url: str, grpc_gateway: GrpcGatewayProcess,
    digits_onnx: Path
) -> None:
    from models_registry.samples import digits_holdout

    alice, charlie = people["alice"], people["charlie"]
    push(alice, digits_onnx)
    deploy(alice, "digits-prod", [{"model": "digits", "max_batch_size": ROWS,
                                   "dynamic_batching": {"max_queue_delay_microseconds": 2000}}])
    wait_status(alice, "digits-prod", "ready")
    triton = serving("digits-prod")
    assert Deployment.objects.get(name="digits-prod").grpc_upstream == f"127.0.0.1:{triton.grpc_port}"
    gateway = grpcclient.InferenceServerClient(grpc_gateway.address)
    direct = grpcclient.InferenceServerClient(f"127.0.0.1:{triton.grpc_port}")
    auth = headers(alice)

    assert gateway.is_server_live(headers=auth) and gateway.is_server_ready(headers=auth)
    assert gateway.is_model_ready("digits", headers=auth)
    assert gateway.get_server_metadata(headers=auth) == direct.get_server_metadata()
    assert gateway.get_model_metadata("digits", headers=auth) == direct.get_model_metadata("digits")
    assert gateway.get_model_config("digits", headers=auth) == direct.get_model_config("digits")
    X, _ = digits_holdout()
    large = np.resize(X, (ROWS, 64))
    assert large.nbytes == 4 * 1024 * 1024
    for rows in (X[:16], large):
        via = gateway.infer("digits", digits_input(rows), headers=auth)
        straight = direct.infer("digits", digits_input(rows))
        for output in ("label", "probabilities"):
            assert np.array_equal(via.as_numpy(output), straight.as_numpy(output)), (len(rows), output)

    # The deployment page's gRPC snippet runs as it is, against the gateway.
    from web import grpc_snippet, inference

    [entry] = Deployment.objects.get(name="digits-prod").serving_revision.spec.models  # type: ignore[union-attr]
    http = inference.python_snippet(portal_url, "digits-prod", "digits", inference.served_signature(entry))
    code = grpc_snippet.python_grpc_snippet(http, grpc_gateway.address, False, "digits-prod")
    ran = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MODELPORT_TOKEN": alice.token},
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.count("[") >= 2  # the printed outputs

    # ModelStreamInfer: every answer arrives, equal to Triton's own.
    batches = [X[i:i + 1 + i % 5] for i in range(40)]
    via_stream = stream_all(gateway, batches, auth)
    straight_stream = stream_all(direct, batches, None)
    assert via_stream.keys() == straight_stream.keys() == {str(i) for i in range(40)}
    for key, result in via_stream.items():
        # 40 pipelined requests are batched by Triton's dynamic batcher as they happen to arrive, differently in the
        # two runs, and onnxruntime's float sums depend on the batch size in their last bits: labels are equal,
        # probabilities equal to float32 precision. (One request at a time, above, is bit for bit.)
        assert np.array_equal(result.as_numpy("label"), straight_stream[key].as_numpy("label"))
        np.testing.assert_allclose(result.as_numpy("probabilities"), straight_stream[key].as_numpy("probabilities"),
                                   rtol=1e-5, atol=1e-7)

    # Triton's own errors pass through with its code and message.
    wrong = grpcclient.InferInput("nope", [1, 64], "FP32")
    wrong.set_data_from_numpy(X[:1])
    code, message = status_of(lambda: gateway.infer("digits", [wrong], headers=auth))
    assert code == "StatusCode.INVALID_ARGUMENT" and "nope" in message
    # A model the deployment does not serve: the HTTP gateway's 404 as NOT_FOUND, for a dedicated deployment as for
    # a shared one (Triton's own words differ).
    assert status_of(lambda: gateway.get_model_config("ghost-model", headers=auth)) == (
        "StatusCode.NOT_FOUND", "Deployment 'digits-prod' in team 'acme' serves no model named 'ghost-model'. Its "
        "models: 'digits'.")
    assert "unknown model" in status_of(lambda: direct.get_model_config("ghost-model"))[1]

    # In a stream, Triton's error for one request gets a unary call's words (without its advice to set
    # max_batch_size to zero), the request's id kept in front: the client tells its answers apart by it.
    bad = grpcclient.InferInput("input", [1, 63], "FP32")
    bad.set_data_from_numpy(X[:1, :63].astype(np.float32))
    unary = status_of(lambda: gateway.infer("digits", [bad], headers=auth))
    assert unary[0] == "StatusCode.INVALID_ARGUMENT" and "max_batch_size" not in unary[1]
    for client, metadata in ((gateway, auth), (direct, None)):
        streamed: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error, into=streamed: into.put((result, error)), headers=metadata)
        client.async_stream_infer("digits", [bad], request_id="wrong-shape")
        result, error = streamed.get(timeout=60)
        client.stop_stream()
        assert result is None and error is not None
        if client is gateway:
            assert error.message() == f"[request id: wrong-shape] {unary[1]}"
        else:
            assert "max_batch_size" in error.message()  # what the gateway's stream passed on before

    # A shape whose byte size wraps around 64 bits kills the model's stub when sent to Triton directly (measured):
    # through the gateway it is refused, and the model answers as before.
    hostile = pb.ModelInferRequest(model_name="digits")
    hostile.inputs.add(name="input", datatype="FP32", shape=[2**62, 64])
    hostile.raw_input_contents.append(b"")
    with grpc.insecure_channel(grpc_gateway.address) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(
                hostile.SerializeToString(), metadata=tuple(auth.items()), timeout=10)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    assert np.array_equal(gateway.infer("digits", digits_input(X[:2]), headers=auth).as_numpy("label"),
                          direct.infer("digits", digits_input(X[:2])).as_numpy("label"))

    # Another team's user, a missing or bad token, no deployment named: never a hint.
    assert status_of(lambda: gateway.is_model_ready("digits", headers=headers(charlie))) == (
        "StatusCode.NOT_FOUND", "There is no deployment named 'digits-prod' in team 'globex', the team this request "
        "acts for. GET /api/v1/deployments/ lists the team's deployments.")
    assert status_of(lambda: gateway.is_model_ready("digits", headers={"modelport-deployment": "digits-prod"}))[0] \
        == "StatusCode.UNAUTHENTICATED"
    assert status_of(lambda: gateway.is_model_ready("digits", headers=headers("mp_x_y")))[0] == \
        "StatusCode.UNAUTHENTICATED"
    assert status_of(lambda: gateway.is_model_ready("digits", headers={"authorization": auth["authorization"]}))[0] \
        == "StatusCode.INVALID_ARGUMENT"

    # Triton's admin services are refused.
    for admin in (lambda: gateway.get_model_repository_index(headers=auth),
                  lambda: gateway.load_model("digits", headers=auth),
                  lambda: gateway.unload_model("digits", headers=auth),
                  lambda: gateway.get_log_settings(headers=auth),
                  lambda: gateway.get_trace_settings(headers=auth),
                  lambda: gateway.get_system_shared_memory_status(headers=auth),
                  lambda: gateway.register_system_shared_memory("r", "/x", 16, headers=auth)):
        assert status_of(admin)[0] == "StatusCode.PERMISSION_DENIED"
    assert gateway.is_model_ready("digits", headers=auth)

    # Rate limit: 100 requests/s per user and team (bob's bucket is his own); RESOURCE_EXHAUSTED beyond it.
    # Sent 16 at a time, as the HTTP test does: one after another, 400 calls exhaust the bucket only if each takes
    # under 7.5 ms, which a busy machine does not promise. The first 50 sent arrive among the first 66: in the burst.
    local, clients = threading.local(), []

    def ready_code(_: int) -> str:
        if not hasattr(local, "client"):
            local.client = grpcclient.InferenceServerClient(grpc_gateway.address)
            clients.append(local.client)
        try:
            local.client.is_server_ready(headers=headers(people["bob"]))
            return "OK"
        except InferenceServerException as exc:
            return str(exc.status())

    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(ready_code, range(400)))
    for client in clients:
        client.close()
    assert "StatusCode.RESOURCE_EXHAUSTED" in codes and codes[:50] == ["OK"] * 50
    assert gateway.is_server_ready(headers=auth)

    # The same statistics as HTTP: Prometheus counters (the gRPC gateway's own /metrics, behind METRICS_TOKEN or
    # METRICS_OPEN) and the per-deployment API, which counts gRPC calls (flushed every few seconds).
    metrics = requests.get(grpc_gateway.metrics_url, timeout=5).text
    ours = {"deployment": "digits-prod", "model": "digits", "team": "acme"}
    assert sample_sum(metrics, "modelport_gateway_requests_total", code="200", **ours) > 0
    # Three 400s: the unknown input, the wrong shape as a unary call and in the stream (its error counted as one).
    assert sample_sum(metrics, "modelport_gateway_requests_total", code="400", **ours) == 3.0
    stats = wait_for(lambda: (s := alice.client().get("/api/v1/deployments/digits-prod/metrics/").json())
                     ["requests"] > 0 and s, 30, what="gateway statistics")
    assert stats["p50_ms"] is not None

    # Revoking a token takes effect within the cache window, for calls and for an open stream.
    _, raw = actions.issue_token(alice.user, alice.team, name="short-lived", by=alice.user, via="session")
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    streaming = grpcclient.InferenceServerClient(grpc_gateway.address)
    streaming.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers(raw))
    streaming.async_stream_infer("digits", digits_input(X[:1]), request_id="before")
    assert answers.get(timeout=30)[1] is None
    assert gateway.is_server_ready(headers=headers(raw))
    actions.revoke_token(ApiToken.objects.get(prefix=raw.split("_")[1]), by=alice.user, via="session")
    time.sleep(1.0)
    assert status_of(lambda: gateway.is_server_ready(headers=headers(raw)))[0] == "StatusCode.UNAUTHENTICATED"
    streaming.async_stream_infer("digits", digits_input(X[:1]), request_id="after")
    _, error = answers.get(timeout=30)
    assert error is not None and "revoked" in str(error)
    streaming.stop_stream()

    # A stopped deployment: UNAVAILABLE, saying so.
    assert alice.client().post("/api/v1/deployments/digits-prod/stop").status_code == 202
    wait_status(alice, "digits-prod", "stopped")
    time.sleep(1.0)
    code, message = status_of(lambda: gateway.is_model_ready("digits", headers=auth))
    assert code == "StatusCode.UNAVAILABLE" and "not ready" in message


def test_grpc_callers_see_zero_failed_requests_during_a_rollout(
    people: dict[str, Person], portal_url: str, grpc_gateway: GrpcGatewayProcess, digits_onnx: Path
) -> None:
    """Unary calls and a stream keep going while a new revision takes over: requests sent after the switch go to
    the new Triton, the old one finishes what it has."""
    from models_registry.samples import digits_holdout

    alice = people["alice"]
    push(alice, digits_onnx)
    deploy(alice, "digits-prod", [{"model": "digits", "dynamic_batching": {"max_queue_delay_microseconds": 100}}])
    wait_status(alice, "digits-prod", "ready")
    first = serving("digits-prod")
    X, _ = digits_holdout()
    auth = headers(alice)
    outcomes: list[str] = []
    stream_errors: list[str] = []
    done = threading.Event()

    def hammer() -> None:
        client = grpcclient.InferenceServerClient(grpc_gateway.address)
        while not done.is_set():
            try:
                client.infer("digits", digits_input(X[:1]), headers=auth)
                outcomes.append("OK")
            except InferenceServerException as exc:
                outcomes.append(f"{exc.status()}: {exc.message()}")

    streamed: list[Any] = []
    streaming = grpcclient.InferenceServerClient(grpc_gateway.address)

    def on_answer(result: Any, error: Any) -> None:
        if error is not None:
            stream_errors.append(str(error))
        else:
            streamed.append(result)

    streaming.start_stream(callback=on_answer, headers=auth)
    workers = [threading.Thread(target=hammer) for _ in range(4)]
    for worker in workers:
        worker.start()
    sent = 0
    try:
        time.sleep(1.0)
        patched = alice.client().patch("/api/v1/deployments/digits-prod/", {"models": [
            {"model": "digits", "dynamic_batching": {"max_queue_delay_microseconds": 3000}}]}, format="json")
        assert patched.status_code == 200

        def switched() -> bool:
            d = Deployment.objects.get(name="digits-prod")
            return d.serving_revision is not None and d.serving_revision.number == 2 and d.status == "ready"

        deadline = time.monotonic() + 120
        while not switched():
            assert time.monotonic() < deadline, "the rollout did not finish"
            streaming.async_stream_infer("digits", digits_input(X[:1]), request_id=str(sent))
            sent += 1
            time.sleep(0.05)
        for _ in range(80):  # the old server drains and stops while traffic continues
            streaming.async_stream_infer("digits", digits_input(X[:1]), request_id=str(sent))
            sent += 1
            time.sleep(0.05)
    finally:
        done.set()
        for worker in workers:
            worker.join()
        wait_for(lambda: len(streamed) + len(stream_errors) >= sent, 30, what="the stream's answers")
        streaming.stop_stream()
    second = serving("digits-prod")
    assert second.grpc_port != first.grpc_port
    assert Deployment.objects.get(name="digits-prod").grpc_upstream == f"127.0.0.1:{second.grpc_port}"
    assert len(outcomes) > 100
    assert set(outcomes) == {"OK"}, {o: outcomes.count(o) for o in set(outcomes)}
    assert stream_errors == [] and len(streamed) == sent
