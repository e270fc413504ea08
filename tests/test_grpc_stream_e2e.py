"""Decoupled (streaming) models over gRPC end to end (issue 33): the sample text generator and a test streaming
model uploaded with decoupled=true, deployed on a real Triton beside a one-answer model, and streamed with the stock
tritonclient.grpc (`start_stream`, `async_stream_infer`) through `manage.py grpc_gateway` and straight at the
deployment's Triton, the answers compared; the caller's cancel and the idle bound reach the model."""

from __future__ import annotations

import json
import queue
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.artifacts import STREAMING_SIGNATURE, streaming_python_model_zip
from tests.deploying import deploy, push, serving, wait_status
from tests.processes import GrpcGatewayProcess, wait_for
from tests.support.people import Person

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def grpc_stream_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # Read by the gRPC gateway process: the test model's "slow" request is silent for 3 s, past the idle bound.
    monkeypatch.setenv("GATEWAY_STREAM_IDLE_SECONDS", "1.5")
    monkeypatch.setenv("GATEWAY_MAX_STREAMS_PER_TEAM", "3")
    monkeypatch.setenv("GATEWAY_RATE_LIMIT_PER_SECOND", "100")
    monkeypatch.setenv("GATEWAY_RATE_LIMIT_BURST", "100")


def upload(person: Person, name: str, archive: bytes, signature: dict[str, Any], **fields: Any) -> None:
    client = person.client()
    created = client.post(f"/api/v1/models/{name}/versions/", {
        "file": SimpleUploadedFile(f"{name}.zip", archive), "signature": json.dumps(signature),
        "create_model": "true", "decoupled": "true", **fields}, format="multipart")
    assert created.status_code == 201, created.json()
    path = f"/api/v1/models/{name}/versions/{created.json()['number']}/"
    version = wait_for(lambda: (v := client.get(path).json())["status"] != "validating" and v, 90,
                       what=f"the worker to inspect {name}")
    assert version["status"] == "ready", version["error"]


def textgen_inputs(prompt: str, max_tokens: int, seed: int) -> list[grpcclient.InferInput]:
    values: list[tuple[str, str, Any]] = [
        ("text_input", "BYTES", np.array([[prompt.encode()]], dtype=np.object_)),
        ("max_tokens", "INT32", np.array([[max_tokens]], dtype=np.int32)),
        ("temperature", "FP32", np.array([[0.8]], dtype=np.float32)),
        ("top_p", "FP32", np.array([[0.95]], dtype=np.float32)),
        ("stream", "BOOL", np.array([[True]], dtype=bool)),
        ("stop", "BYTES", np.array([[b"\n\n\n"]], dtype=np.object_)),
        ("seed", "INT64", np.array([[seed]], dtype=np.int64)),
    ]
    inputs = []
    for name, datatype, array in values:
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def chat_inputs(text: str) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    return [tensor]


Answer = tuple[str, str | None, bool | None, str | None]  # request id, text, triton_final_response, error


class Stream:
    """One tritonclient.grpc stream; its answers in the order they came, read as (id, text, final flag, error), one
    per piece of a response that carries several."""

    def __init__(self, client: grpcclient.InferenceServerClient, headers: dict[str, str] | None) -> None:
        self.client = client
        self.answers: queue.Queue[Answer] = queue.Queue()
        client.start_stream(callback=self._collect, headers=headers)

    def _collect(self, result: Any, error: Any) -> None:
        if error is not None:
            self.answers.put(("", None, None, str(error.message())))
            return
        response = result.get_response()
        flag = response.parameters.get("triton_final_response")
        final = None if flag is None else flag.bool_param
        output = result.as_numpy("text_output") if response.outputs else None
        if output is None:  # the empty final response, or a model without text_output
            self.answers.put((response.id, None, final, None))
            return
        # One answer per piece: a response carries several when the model's sending fell behind.
        for value in output.reshape(-1):
            self.answers.put((response.id, value.decode(), final, None))

    def until(self, done: Any, seconds: float = 60) -> list[Answer]:
        got: list[Answer] = []
        deadline = time.monotonic() + seconds
        while not done(got):
            got.append(self.answers.get(timeout=max(deadline - time.monotonic(), 0.01)))
        return got


def headers(person: Person) -> dict[str, str]:
    return {"authorization": f"Bearer {person.token}", "modelport-deployment": "gen"}


def test_tritonclient_streams_a_decoupled_model_through_the_gateway_as_triton_streams_it(
    grpc_stream_settings: None, people: dict[str, Person], portal_url: str, grpc_gateway: GrpcGatewayProcess,
    digits_onnx: Path
) -> None:
    from models_registry.samples import TEXTGEN_EXAMPLE_REQUEST, TEXTGEN_SIGNATURE, build_textgen_zip

    alice = people["alice"]
    upload(alice, "textgen", build_textgen_zip(), TEXTGEN_SIGNATURE.to_json(),
           example_request=json.dumps(TEXTGEN_EXAMPLE_REQUEST))
    upload(alice, "chat", streaming_python_model_zip(), STREAMING_SIGNATURE)
    push(alice, digits_onnx)
    deploy(alice, "gen", [{"model": "textgen"}, {"model": "chat", "max_batch_size": 0}, {"model": "digits"}])
    wait_status(alice, "gen", "ready", timeout=180)
    triton = serving("gen")
    log = Path(triton.log_path)
    via = grpcclient.InferenceServerClient(grpc_gateway.address)
    direct = grpcclient.InferenceServerClient(f"127.0.0.1:{triton.grpc_port}")

    # The generator's pieces, with Triton's final flags, and the empty final response only where it was asked for:
    # through the gateway exactly as straight from Triton (the seed makes the text the same).
    def generated(client: grpcclient.InferenceServerClient, metadata: dict[str, str] | None) -> list[Answer]:
        stream = Stream(client, metadata)
        try:
            stream.client.async_stream_infer("textgen", textgen_inputs("MENENIUS:\n", 12, 7), request_id="asked",
                                             enable_empty_final_response=True)
            asked = stream.until(lambda got: got and got[-1][2] is True)
            stream.client.async_stream_infer("textgen", textgen_inputs("MENENIUS:\n", 12, 7), request_id="plain")
            plain = stream.until(lambda got: sum(1 for a in got if a[1] is not None) == sum(
                1 for a in asked if a[1] is not None))
            return asked + plain
        finally:
            client.stop_stream()

    through = generated(via, headers(alice))
    assert through == generated(direct, None)
    pieces = [a for a in through if a[0] == "asked" and a[1] is not None]
    assert len(pieces) > 1 and all(a[2] is False for a in pieces)  # several pieces, each flagged not final
    assert through[len(pieces)] == ("asked", None, True, None)  # then the empty final response, as asked
    assert all(a[1] is not None for a in through if a[0] == "plain")  # none where it was not asked for

    # One stream, three models: the decoupled requests' pieces and the one-answer model's answers interleave, each
    # told apart by its request id, and the errors in a unary call's words.
    stream = Stream(via, headers(alice))
    try:
        stream.client.async_stream_infer("chat", chat_inputs("hello"), request_id="chat",
                                         enable_empty_final_response=True)
        digits = grpcclient.InferInput("input", [1, 64], "FP32")
        digits.set_data_from_numpy(np.zeros((1, 64), dtype=np.float32))
        for index in range(3):
            stream.client.async_stream_infer("digits", [digits], request_id=f"digits-{index}")
        stream.client.async_stream_infer("chat", chat_inputs("fail"), request_id="fail")
        got = stream.until(lambda got: ("chat", None, True, None) in got and sum(1 for a in got if a[3]) == 1 and
                           sum(1 for a in got if a[0].startswith("digits")) == 3)
        assert [a[1] for a in got if a[0] == "chat"] == [f"piece {i}" for i in range(5)] + [None]
        (failed,) = [a[3] for a in got if a[3]]
        assert failed.startswith("[request id: fail] ") and "model.py" not in failed, failed
    finally:
        via.stop_stream()

    # The idle bound: the model is silent for 3 s, past GATEWAY_STREAM_IDLE_SECONDS (1.5 s): an error naming it, and
    # Triton cancels the request, which the model sees.
    stream = Stream(via, headers(alice))
    try:
        stream.client.async_stream_infer("chat", chat_inputs("slow"), request_id="slow")
        got = stream.until(lambda got: any(a[3] for a in got))
        assert got[0][1] == "piece 0" and "GATEWAY_STREAM_IDLE_SECONDS" in str(got[-1][3])
    finally:
        via.stop_stream()
    seen = re.compile(r"stream-test: cancelled after (\d) pieces")
    wait_for(lambda: seen.search(log.read_text(errors="replace")), 10, what="the model to see the idle cancel")
    count = len(seen.findall(log.read_text(errors="replace")))

    # The caller cancels its stream after the first piece: the model sees the cancellation.
    stream = Stream(via, headers(alice))
    stream.client.async_stream_infer("chat", chat_inputs("hello"), request_id="left")
    assert stream.until(lambda got: len(got) == 1)[0][:2] == ("left", "piece 0")
    via.stop_stream(cancel_requests=True)
    wait_for(lambda: len(seen.findall(log.read_text(errors="replace"))) > count, 10,
             what="the model to see the caller's cancel")

    # Another team's token: the stream is refused as for a missing deployment.
    stream = Stream(via, headers(people["charlie"]))
    stream.client.async_stream_infer("chat", chat_inputs("hello"), request_id="theirs")
    (refused,) = stream.until(lambda got: len(got) == 1)
    assert refused[3] is not None and "no deployment named 'gen' in team 'globex'" in refused[3]
    via.stop_stream()
