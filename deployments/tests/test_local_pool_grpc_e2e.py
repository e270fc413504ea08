"""Shared servers over gRPC (issue 24): the stock tritonclient.grpc, as a user's program would be, through the gRPC
gateway (in this process, on a real socket) to the pool's real Triton: the user's model names in requests and
answers, the pool's other models not found, and the held first request of an idle model with UNAVAILABLE and
`retry-after` past the wait. The reconciler is ticked here as a worker would."""

from __future__ import annotations

import queue
import time
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from deployments.models import PoolLoad
from deployments.runtimes.local import pool as local_pool
from deployments.tests.pool_e2e import _stop_pool_servers, deploy, people, settle
from deployments.tests.pool_grpc import InProcessGrpcGateway, auth, grpc_gateway, rows
from tests.artifacts import tiny_onnx
from tests.support.people import Person
from tests.support.versions import make_ready_version

pytestmark = [pytest.mark.triton, pytest.mark.django_db(transaction=True)]
__all__ = ["_stop_pool_servers", "grpc_gateway", "people"]  # fixtures (pool_e2e.py, pool_grpc.py)


def refused(call: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as raised:
        call()
    return str(raised.value.status()), str(raised.value.message())


def test_two_teams_digits_in_one_pool_answer_over_grpc_with_their_own_names(
        people: dict[str, Person], grpc_gateway: InProcessGrpcGateway) -> None:
    alice, charlie = people["alice"], people["charlie"]
    make_ready_version(alice, data=tiny_onnx(out_features=3))
    make_ready_version(charlie, data=tiny_onnx(out_features=5))
    deploy(alice, "digits-a", idle_unload_seconds=0)
    deploy(charlie, "digits-c", idle_unload_seconds=0)
    a, c = settle("digits-a"), settle("digits-c")
    assert a.grpc_upstream == c.grpc_upstream  # one Triton for both teams
    client = grpcclient.InferenceServerClient(grpc_gateway.address)
    direct = grpcclient.InferenceServerClient(a.grpc_upstream)
    mine, theirs = auth(alice, "digits-a"), auth(charlie, "digits-c")

    answer = client.infer("digits", rows(), headers=mine, request_id="7")
    response = answer.get_response()
    assert response.model_name == "digits" and response.id == "7"
    assert answer.as_numpy("y").shape == (2, 3)
    assert client.infer("digits", rows(), headers=theirs).as_numpy("y").shape == (2, 5)
    assert client.is_model_ready("digits", headers=mine)

    metadata = client.get_model_metadata("digits", headers=mine)
    straight = direct.get_model_metadata(f"d{a.pk}-r1-digits")
    assert metadata.name == "digits" and list(metadata.inputs) == list(straight.inputs)
    config = client.get_model_config("digits", headers=mine).config
    pooled = direct.get_model_config(f"d{a.pk}-r1-digits").config
    assert config.name == "digits"
    pooled.name = "digits"
    assert config == pooled  # nothing else differs
    every = client.get_inference_statistics(headers=mine)
    assert [row.name for row in every.model_stats] == ["digits"]  # not charlie's, not the pool's names
    assert every.model_stats[0].inference_count >= 1
    one = client.get_inference_statistics("digits", headers=mine)
    assert [row.name for row in one.model_stats] == ["digits"]

    # The pool's other models are invisible, by their pool name too, whichever method asks.
    other = f"d{c.pk}-r1-digits"
    for call in (lambda: client.infer(other, rows(), headers=mine),
                 lambda: client.is_model_ready(other, headers=mine),
                 lambda: client.get_model_metadata(other, headers=mine),
                 lambda: client.get_model_config(other, headers=mine),
                 lambda: client.get_inference_statistics(other, headers=mine)):
        status, message = refused(call)
        assert status == "StatusCode.NOT_FOUND" and "serves no model" in message, (status, message)
    # Triton's own errors name the user's model, not the pool's.
    bad = grpcclient.InferInput("x", [2, 5], "FP32")
    bad.set_data_from_numpy(np.ones((2, 5), dtype=np.float32))
    status, message = refused(lambda: client.infer("digits", [bad], headers=mine))
    assert status == "StatusCode.INVALID_ARGUMENT" and f"d{a.pk}-" not in message, message

    # A stream: each answer names the user's model.
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=mine)
    try:
        for index in range(3):
            client.async_stream_infer("digits", rows(index + 1), request_id=str(index))
        got = [answers.get(timeout=30) for _ in range(3)]
    finally:
        client.stop_stream()
    assert all(error is None for _, error in got), got
    assert sorted(result.get_response().id for result, _ in got) == ["0", "1", "2"]
    assert {result.get_response().model_name for result, _ in got} == {"digits"}


def test_an_idle_model_over_grpc_holds_the_first_request_then_unavailable_with_retry_after(
        people: dict[str, Person], grpc_gateway: InProcessGrpcGateway, settings: Any) -> None:
    alice = people["alice"]
    settings.POOL_IDLE_UNLOAD_LOAD_FACTOR = 0  # its idle_unload_seconds alone (test_local_pool_lock_hog_e2e.py)
    make_ready_version(alice)
    deploy(alice, "digits-idle", idle_unload_seconds=1)
    deployment = settle("digits-idle")
    client = grpcclient.InferenceServerClient(grpc_gateway.address)
    mine = auth(alice, "digits-idle")
    time.sleep(1.5)
    assert local_pool.unload_idle()
    assert PoolLoad.objects.get(deployment=deployment).state == PoolLoad.State.UNLOADED

    started = time.monotonic()
    answer = client.infer("digits", rows(), headers=mine)
    held = time.monotonic() - started
    assert answer.get_response().model_name == "digits" and answer.as_numpy("y").shape == (2, 3)
    assert PoolLoad.objects.get(deployment=deployment).state == PoolLoad.State.LOADED
    # Held no longer than the wait it promises (a small ONNX model's cold start, which a loaded machine slows).
    assert held < settings.POOL_COLD_START_WAIT_SECONDS, held

    # A wait shorter than the load: UNAVAILABLE with retry-after, as HTTP's 503; the load goes on for the retry.
    time.sleep(1.5)
    assert local_pool.unload_idle()
    settings.POOL_COLD_START_WAIT_SECONDS = 0.0
    request = pb.ModelInferRequest(model_name="digits", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=[1, 4])], raw_input_contents=[np.ones(4, np.float32).tobytes()])
    with grpc.insecure_channel(grpc_gateway.address) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as raised:
            call(request.SerializeToString(), metadata=tuple(mine.items()))
    error: Any = raised.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "loading" in error.details()
    assert dict(error.trailing_metadata())["retry-after"] == "2"
    settings.POOL_COLD_START_WAIT_SECONDS = 10.0
    deadline = time.monotonic() + 15
    while PoolLoad.objects.get(deployment=deployment).state != PoolLoad.State.LOADED and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.infer("digits", rows(), headers=mine).as_numpy("y").shape == (2, 3)
