"""A pipeline that ends in a streaming step, end to end (issue 33): a python step that turns a name into a speaker's
prompt, then the sample text generator (decoupled), uploaded through the API, made a pipeline, deployed on a real
Triton, and read through the gateway's /generate_stream: each piece of the generator is an event of its own, the same
pieces the generator streams when called alone with the prompt the first step makes; gRPC's ModelStreamInfer through
the gRPC gateway and the OpenAI-compatible API stream the same pieces. Kept to a few pieces."""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import requests
import tritonclient.grpc as grpcclient
from django.conf import settings

from tests.deploying import deploy, serving, wait_status
from tests.processes import GrpcGatewayProcess
from tests.support.people import Person
from tests.support.story import STORY, upload_story_models

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

PIECES = 4


@pytest.fixture
def pipeline_stream_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_RATE_LIMIT_PER_SECOND", "100")
    monkeypatch.setenv("GATEWAY_RATE_LIMIT_BURST", "100")


def grpc_inputs(name: str, max_tokens: int, seed: int) -> list[grpcclient.InferInput]:
    inputs = []
    for input_name, datatype, array in (("text_input", "BYTES", np.array([[name.encode()]], dtype=np.object_)),
                                        ("max_tokens", "INT32", np.array([[max_tokens]], dtype=np.int32)),
                                        ("seed", "INT64", np.array([[seed]], dtype=np.int64))):
        tensor = grpcclient.InferInput(input_name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def pieces(url: str, headers: dict[str, str], body: dict[str, Any]) -> list[tuple[float, str]]:
    """Each piece, with the time its event arrived (an event carries one, or several in a list)."""
    started = time.monotonic()
    response = requests.post(url, json=body, headers=headers, stream=True, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/event-stream")
    found: list[tuple[float, str]] = []
    held = b""
    for chunk in response.iter_content(chunk_size=None):
        held += chunk
        while b"\n\n" in held:
            event, held = held.split(b"\n\n", 1)
            (line,) = [x for x in event.decode().split("\n") if x.startswith("data: ")]
            data = json.loads(line.removeprefix("data: "))
            assert "error" not in data, data
            output = data["text_output"]  # a list: several pieces in one response, the model's sending behind
            found += [(time.monotonic() - started, text) for text in (output if isinstance(output, list) else [output])]
    return found


def test_a_pipeline_ending_in_the_text_generator_streams_its_pieces_through_the_gateway(
    pipeline_stream_settings: None, people: dict[str, Person], portal_url: str, grpc_gateway: GrpcGatewayProcess
) -> None:
    alice = people["alice"]
    upload_story_models(alice)
    client = alice.client()
    created = client.post("/api/v1/models/story/versions/", {
        "format": "ensemble", "definition": STORY, "create_model": True}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["decoupled"] is True  # a streaming model to the gateway

    deploy(alice, "story", [{"model": "story"}])
    body = wait_status(alice, "story", "ready", timeout=180)
    assert {m["model"] for m in body["models"]} == {"story", "speaker", "textgen"}
    repository = Path(settings.DEPLOYMENTS_DIR) / str(serving("story").deployment_id) / "r1" / "repository"
    assert "decoupled: true" in (repository / "story" / "config.pbtxt").read_text()

    auth = {"Authorization": f"Bearer {alice.token}"}
    base = f"{portal_url}/serve/story/v2/models"
    through = pieces(f"{base}/story/generate_stream", auth, {"text_input": "menenius", "max_tokens": PIECES,
                                                             "seed": 3})
    print("pipeline pieces:", [(round(at, 4), text) for at, text in through])
    # The generator alone, with the prompt the first step makes: the same pieces.
    alone = pieces(f"{base}/textgen/generate_stream", auth, {"text_input": "MENENIUS:\n", "max_tokens": PIECES,
                                                            "seed": 3})
    assert 1 < len(through) <= PIECES
    assert [text for _, text in through] == [text for _, text in alone]
    assert all(text for _, text in through)
    assert [at for at, _ in through] == sorted(at for at, _ in through)

    # gRPC's ModelStreamInfer through the gRPC gateway: the same pieces, then Triton's final flag.
    via = grpcclient.InferenceServerClient(grpc_gateway.address)
    answers: queue.Queue[tuple[str | None, bool]] = queue.Queue()

    def collect(result: Any, error: Any) -> None:
        assert error is None, error
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        if not response.outputs:
            answers.put((None, final))
        for value in result.as_numpy("text_output").reshape(-1) if response.outputs else ():
            answers.put((value.decode(), final))

    via.start_stream(callback=collect, headers={"authorization": f"Bearer {alice.token}",
                                                "modelport-deployment": "story"})
    try:
        via.async_stream_infer("story", grpc_inputs("menenius", PIECES, 3), enable_empty_final_response=True)
        streamed: list[tuple[str | None, bool]] = []
        while not (streamed and streamed[-1][1]):
            streamed.append(answers.get(timeout=30))
    finally:
        via.stop_stream()
    assert [text for text, _ in streamed if text is not None] == [text for _, text in through]

    # The OpenAI-compatible API: a completion streamed in chunks, the same text.
    sdk = openai.OpenAI(base_url=f"{portal_url}/serve/story/v1", api_key=alice.token, max_retries=0, timeout=60)
    completion = sdk.completions.create(model="story", prompt="menenius", max_tokens=PIECES, seed=3, stream=True)
    chunks = [c.choices[0].text for c in completion if c.choices and c.choices[0].text]
    # A chunk per event: one piece, or those the generator sent in one response when its sending fell behind.
    assert "".join(chunks) == "".join(text for _, text in through) and 1 <= len(chunks) <= len(through)

    # Like any streaming model, it has no single answer for /infer.
    infer = requests.post(f"{base}/story/infer", headers=auth, timeout=10, json={"inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["menenius"]}]})
    assert infer.status_code == 400 and "generate_stream" in infer.json()["error"]
