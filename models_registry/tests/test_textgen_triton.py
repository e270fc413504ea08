"""The sample text generator in a real tritonserver, as a decoupled model: /generate_stream answers Server-Sent
Events, one per piece, that join to the text the generator makes in-process; several streams are generated in one
step (continuous batching); a client that goes away ends its stream in the model; and it runs in the sandbox.

The model's config.pbtxt is the one the portal renders (deployments/render.py), so requests that leave the optional
inputs out (only `text_input`) show that `optional: true` works for a decoupled python model in this tritonserver."""

from __future__ import annotations

import http.client
import json
import queue
import time
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format

from deployments.model_entry import DynamicBatching, ModelEntry
from deployments.render import build_model_config
from deployments.revision_spec import RevisionSpec
from deployments.runtimes.local import backends, confined, readiness, serverlog
from deployments.runtimes.local import triton as lt
from deployments.spec import ServedModel
from deployments.tests.local_triton import runtime_env
from infra import sandbox_settings
from models_registry.sample_models import textgen
from models_registry.samples import TEXTGEN_OPTIONAL_INPUTS, TEXTGEN_SIGNATURE, build_textgen_zip

STEP_INTERVAL_MS = 5


def textgen_config(name: str, step_interval_ms: int = 0) -> str:
    """The config the portal renders for the sample's version (deployments/render.py: decoupled, its optional
    inputs `optional: true`), with the operator's pacing parameter."""
    entry = ModelEntry(name=name, version=1, format="python", signature=TEXTGEN_SIGNATURE, max_batch_size=32,
                       dynamic_batching=DynamicBatching(max_queue_delay_microseconds=5_000), decoupled=True)
    config = build_model_config(ServedModel.of(entry, None), "local")
    assert [t.name for t in config.input if t.optional] == list(TEXTGEN_OPTIONAL_INPUTS)
    assert config.model_transaction_policy.decoupled
    if step_interval_ms:
        config.parameters["step_interval_ms"].string_value = str(step_interval_ms)
    return text_format.MessageToString(config)


def write_repository(workdir: Path) -> Path:
    """textgen (no pacing) and textgen_paced (5 ms steps), each the sample's archive extracted under 1/."""
    archive = workdir / "textgen.zip"
    archive.write_bytes(build_textgen_zip())
    for name, interval in (("textgen", 0), ("textgen_paced", STEP_INTERVAL_MS)):
        model_dir = workdir / "repo" / name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(textgen_config(name, interval))
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(model_dir / "1")
    return workdir / "repo"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lt.ServerProcess]:
    env = runtime_env()
    workdir = tmp_path_factory.mktemp("textgen")
    repository = write_repository(workdir)
    backend_dir = backends.build_backend_dir(env, workdir / "var")
    process = lt.start_server(repository, workdir / "var" / "triton.log", env, backend_dir)
    try:
        result = readiness.wait_ready(process, ["textgen", "textgen_paced"], timeout=120)
        assert result.ready, f"{result.message}\n{serverlog.tail_log(process.log_path, 60)}"
        yield process
    finally:
        lt.stop_server(process.pid, grace_seconds=10)
    assert lt.group_pids(process.pid) == []


def post(server: lt.ServerProcess, path: str, body: dict[str, Any]) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=60)
    connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return connection.getresponse()


def events(response: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    """The JSON of each `data:` line of a Server-Sent Events answer, as it arrives."""
    while line := response.readline():
        if line.startswith(b"data:"):
            yield json.loads(line[len(b"data:"):])


def stream_pieces(server: lt.ServerProcess, body: dict[str, Any], model_name: str = "textgen") -> list[str]:
    response = post(server, f"/v2/models/{model_name}/generate_stream", body)
    assert response.status == 200, response.read()
    pieces = []
    for event in events(response):
        assert "error" not in event, event
        pieces += as_pieces(event["text_output"])
    return pieces


def as_pieces(text_output: str | list[str]) -> list[str]:
    """An event's pieces: one (a string), or several (a list: the model's sending fell behind, and it sent every
    piece it had in one response, text_output [1, pieces])."""
    return text_output if isinstance(text_output, list) else [text_output]


@pytest.mark.triton
def test_generate_stream_sends_the_pieces_in_order_and_they_join_to_the_generators_text(
        server: lt.ServerProcess, textgen_model: textgen.CharModel) -> None:
    body = {"text_input": "First Citizen:\n", "max_tokens": 20, "seed": 11, "temperature": 0.8, "top_p": 0.95}
    pieces = stream_pieces(server, body)
    assert len(pieces) == 20 and all(pieces)
    expected = list(textgen.generate(textgen_model, "First Citizen:\n",
                                     textgen.make_params(max_tokens=20, seed=11, temperature=0.8, top_p=0.95)))
    assert pieces == expected
    text = "".join(pieces)
    assert len(text.split()) >= 10  # words, not characters one by one


@pytest.mark.triton
def test_when_its_sending_falls_behind_a_response_carries_the_pieces_it_missed_in_order(
        server: lt.ServerProcess, textgen_model: textgen.CharModel) -> None:
    """Unpaced, the generator makes a piece faster than a send's round trip to Triton: the pieces it made meanwhile go
    in the next response, text_output [1, pieces] (a list in the event), at most MAX_PENDING of them."""
    response = post(server, "/v2/models/textgen/generate_stream", {"text_input": "First Citizen:\n", "max_tokens": 200,
                                                                   "seed": 2})
    outputs = [event["text_output"] for event in events(response)]
    several = [output for output in outputs if isinstance(output, list)]
    assert several and all(2 <= len(output) <= 8 for output in several), outputs
    expected = textgen.generate(textgen_model, "First Citizen:\n", textgen.make_params(max_tokens=200, seed=2))
    assert [piece for output in outputs for piece in as_pieces(output)] == list(expected)


@pytest.mark.triton
def test_a_request_with_only_text_input_streams_with_the_models_defaults(
        server: lt.ServerProcess, textgen_model: textgen.CharModel) -> None:
    """Every other input is rendered `optional: true`: Triton passes the request on without them, over HTTP and
    gRPC's stream alike, and the model reads None for each (its defaults)."""
    pieces = stream_pieces(server, {"text_input": "SICINIUS:\n"})
    assert len(pieces) == textgen.Params().max_tokens and all(pieces)
    got = grpc_stream(server, {"text_input": ("BYTES", b"SICINIUS:\n")})
    assert [error for _, _, error in got] == [None] * len(got)
    assert len([text for text, _, _ in got if text is not None]) == textgen.Params().max_tokens


@pytest.mark.triton
def test_the_pieces_arrive_as_they_are_generated(server: lt.ServerProcess) -> None:
    response = post(server, "/v2/models/textgen_paced/generate_stream", {"text_input": "MENENIUS:\n", "max_tokens": 10})
    arrivals = []
    for event in events(response):
        arrivals += [time.monotonic()] * len(as_pieces(event["text_output"]))
    assert len(arrivals) == 10
    # At least one 5 ms step apart: streamed as generated, not collected and sent at the end.
    assert arrivals[-1] - arrivals[0] > 9 * STEP_INTERVAL_MS / 1000 * 0.8


@pytest.mark.triton
def test_stop_strings_and_stream_false_through_generate(server: lt.ServerProcess,
                                                        textgen_model: textgen.CharModel) -> None:
    body = {"text_input": "First Citizen:\n", "max_tokens": 200, "seed": 5, "stop": ["\n"], "stream": False}
    response = post(server, "/v2/models/textgen/generate", body)
    answer = json.loads(response.read())
    assert response.status == 200, answer
    expected = "".join(textgen.generate(textgen_model, "First Citizen:\n",
                                        textgen.make_params(max_tokens=200, seed=5, stop=["\n"])))
    assert answer["text_output"] == expected and "\n" not in expected and expected


@pytest.mark.triton
@pytest.mark.parametrize(("body", "message"), [
    ({"text_input": "x", "max_tokens": 0}, "max_tokens must be between 1 and 1024"),
    ({"text_input": "x", "temperature": 7.5}, "temperature must be between 0 and 2"),
    ({"text_input": "x", "top_p": 0}, "top_p must be greater than 0"),
    ({"text_input": "x", "stop": ["a", "b", "c", "d", "e"]}, "at most 4 stop strings"),
])
def test_bad_settings_are_a_400_saying_what_to_fix(server: lt.ServerProcess, body: dict[str, Any],
                                                  message: str) -> None:
    response = post(server, "/v2/models/textgen/generate", {**body, "stream": False})
    answer = json.loads(response.read())
    assert response.status == 400 and message in answer["error"], answer


@pytest.mark.triton
def test_concurrent_streams_are_generated_together_and_each_gets_its_own_text(
        server: lt.ServerProcess, textgen_model: textgen.CharModel) -> None:
    def timed(prompt_and_seed: tuple[str, int]) -> tuple[list[str], float]:
        started = time.monotonic()
        body = {"text_input": prompt_and_seed[0], "max_tokens": 20, "seed": prompt_and_seed[1]}
        return stream_pieces(server, body, "textgen_paced"), time.monotonic() - started

    _, alone = timed(("First Citizen:\n", 100))
    prompts = [("First Citizen:\n", i) for i in range(8)] + [("CORIOLANUS:\n", i) for i in range(8)]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        got = list(pool.map(timed, prompts))
    together = time.monotonic() - started
    for (prompt, seed), (pieces, _) in zip(prompts, got, strict=True):
        assert pieces == list(textgen.generate(textgen_model, prompt, textgen.make_params(max_tokens=20, seed=seed)))
    assert len({"".join(pieces) for pieces, _ in got}) == len(prompts)
    # One after the other, 16 streams would take 16 times as long as one; stepped together, about as long as the
    # longest of them (5 ms steps; streams of 20 pieces differ in characters, hence in steps).
    assert together < 4 * max(alone, *(seconds for _, seconds in got)) and together < 16 * alone / 3


@pytest.mark.triton
def test_a_client_that_goes_away_ends_its_stream_in_the_model(server: lt.ServerProcess) -> None:
    # 1,024 pieces of 5 ms steps would take about 25 s.
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=60)
    body = {"text_input": "First Citizen:\n", "max_tokens": 1024}
    connection.request("POST", "/v2/models/textgen_paced/generate_stream", json.dumps(body),
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    received = events(response)
    for _ in range(3):
        next(received)
    started = time.monotonic()
    response.close()
    connection.close()
    deadline = started + 15
    cancelled = None
    while time.monotonic() < deadline and cancelled is None:
        cancelled = next((line for line in serverlog.tail_log(server.log_path, 200).splitlines()
                          if "textgen: stream cancelled after" in line), None)
        time.sleep(0.1)
    assert cancelled is not None, serverlog.tail_log(server.log_path, 40)
    pieces = int(cancelled.rsplit("after ", 1)[1].split()[0])
    assert 3 <= pieces < 200
    # The model still answers.
    assert len(stream_pieces(server, {"text_input": "x", "max_tokens": 3}, "textgen_paced")) == 3
    assert time.monotonic() - started < 10


@pytest.mark.triton
def test_a_grpc_cancel_before_an_answer_not_streamed_ends_it_in_the_model(server: lt.ServerProcess) -> None:
    # stream=false sends nothing until the end, so the model learns of the cancel from the checks it queues while
    # generating (textgen_model.Sending.check); 1,024 pieces of 5 ms steps would take about 25 s. Over HTTP Triton
    # notices a closed connection only when it writes, so gRPC's explicit cancel is the way to reach such an answer.
    import numpy as np
    import tritonclient.grpc as grpcclient

    def cancels() -> int:
        return serverlog.tail_log(server.log_path, 400).count("textgen: stream cancelled after 0 pieces")

    before = cancels()
    client = grpcclient.InferenceServerClient(f"{server.host}:{server.grpc_port}")
    inputs = [grpcclient.InferInput("text_input", [1, 1], "BYTES"),
              grpcclient.InferInput("max_tokens", [1, 1], "INT32"), grpcclient.InferInput("stream", [1, 1], "BOOL")]
    inputs[0].set_data_from_numpy(np.array([[b"First Citizen:\n"]], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([[1024]], dtype=np.int32))
    inputs[2].set_data_from_numpy(np.array([[False]]))
    answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer("textgen_paced", inputs)
    time.sleep(0.3)  # the request reaches the model; nothing is answered yet
    assert answers.empty()
    client.stop_stream(cancel_requests=True)
    client.close()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and cancels() == before:
        time.sleep(0.1)
    assert cancels() == before + 1, serverlog.tail_log(server.log_path, 40)
    assert len(stream_pieces(server, {"text_input": "x", "max_tokens": 3}, "textgen_paced")) == 3


@pytest.mark.triton
def test_it_streams_inside_the_sandbox_every_local_deployment_runs_in(
        tmp_path: Path, textgen_model: textgen.CharModel) -> None:
    runtime_env()
    capabilities = sandbox_settings.sandbox_capabilities()
    if not capabilities.available:
        pytest.skip(f"no sandbox on this machine: {capabilities.reason}")
    repository = write_repository(tmp_path)
    entry = ModelEntry(name="textgen", version=1, format="python", signature=TEXTGEN_SIGNATURE, max_batch_size=32)
    spec = RevisionSpec(runtime="local", models=(entry,))
    started = confined.start_confined(spec, repository, tmp_path / "scratch", tmp_path / "triton.log")
    try:
        result = readiness.wait_ready(started.process, ["textgen"], timeout=120)
        assert result.ready, f"{result.message}\n{serverlog.tail_log(started.process.log_path, 60)}"
        assert started.process.sandboxed
        pieces = stream_pieces(started.process, {"text_input": "VOLUMNIA:\n", "max_tokens": 12, "seed": 4})
        expected = textgen.generate(textgen_model, "VOLUMNIA:\n", textgen.make_params(max_tokens=12, seed=4))
        assert pieces == list(expected)
    finally:
        confined.stop_confined(started)


def grpc_stream(server: lt.ServerProcess, inputs: dict[str, tuple[str, Any]]) -> list[Any]:
    """What ModelStreamInfer answers one request, final response included: (text or None, is final, error), one per
    piece of a response that carries several."""
    import numpy as np
    import tritonclient.grpc as triton_grpc

    answers: queue.Queue[tuple[str | None, bool, Any]] = queue.Queue()

    def collect(result: Any, error: Any) -> None:
        if error is not None:
            answers.put((None, True, error))
            return
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        if not response.outputs:
            answers.put((None, final, None))
            return
        for value in result.as_numpy("text_output").reshape(-1):  # one piece each (several: the sending fell behind)
            answers.put((value.decode(), final, None))

    tensors = []
    for name, (datatype, value) in inputs.items():
        tensor = triton_grpc.InferInput(name, [1, 1], datatype)
        tensor.set_data_from_numpy(np.array([[value]], dtype={"BYTES": np.object_, "INT32": np.int32,
                                                               "INT64": np.int64, "FP32": np.float32}[datatype]))
        tensors.append(tensor)
    client = triton_grpc.InferenceServerClient(f"{server.host}:{server.grpc_port}")
    try:
        client.start_stream(callback=collect)
        client.async_stream_infer("textgen", tensors, enable_empty_final_response=True)
        got = []
        while not (got and got[-1][1]):
            got.append(answers.get(timeout=30))
        client.stop_stream()
        return got
    finally:
        client.close()


@pytest.mark.triton
def test_grpc_model_stream_infer_streams_the_pieces_then_an_empty_final_response(
        server: lt.ServerProcess, textgen_model: textgen.CharModel) -> None:
    got = grpc_stream(server, {"text_input": ("BYTES", b"BRUTUS:\n"), "max_tokens": ("INT32", 15),
                               "seed": ("INT64", 9)})
    *pieces, final = got
    assert final == (None, True, None)  # the final flag comes alone, after the last piece
    assert [text for text, _, _ in pieces] == list(
        textgen.generate(textgen_model, "BRUTUS:\n", textgen.make_params(max_tokens=15, seed=9)))
    assert not any(is_final for _, is_final, _ in pieces)


@pytest.mark.triton
def test_a_prompt_that_is_not_utf8_is_refused_saying_so(server: lt.ServerProcess) -> None:
    ((text, final, error),) = grpc_stream(server, {"text_input": ("BYTES", b"\xff\xfe not text")})
    assert text is None and final and "text_input must be UTF-8 text" in str(error)
