"""Triton python-backend model `textgen`, the sample text generator: a decoupled model (`model_transaction_policy
{ decoupled: true }`) that streams the pieces textgen.py generates, one response per piece. Zipped as model.py with
textgen.py and the weights textgen.npz.

The contract is the one Triton's OpenAI frontend uses for models other than vLLM's: `text_input` (BYTES [-1, 1]),
optional `max_tokens` (INT32), `temperature` (FP32), `top_p` (FP32), `stream` (BOOL: false sends the whole text as
one response), `stop` (BYTES [-1, -1], up to 4 strings) and `seed` (INT64); output `text_output` (BYTES [-1, 1]).

Continuous batching: execute() only checks its requests and hands them to one generating thread, which steps every
live stream together (one character each per step, their pieces interleaved) and takes in new streams between steps.
Generating inside execute() would make a stream that arrives during a long one wait for all of that batch to end.
Cancellation (the client went away) is checked before each piece is sent.
The config parameter `step_interval_ms` (the operator's, not a request's) pauses after every step, for demos and
tests that need a stream to last.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from textgen import BadRequest, CharModel, Params, Stream, load_counts, make_params, new_stream, step

WEIGHTS_FILE = "textgen.npz"
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _first(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    values = tensor.as_numpy().reshape(-1)
    if values.size != 1:
        raise BadRequest(f"{name} takes one value per request, got {values.size}")
    return values[0]


def _text(value: Any, name: str) -> str:
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"{name} must be UTF-8 text") from None


def read_request(request: Any) -> tuple[str, Params, bool]:
    """The prompt, the checked settings and whether to stream; raises BadRequest naming what to fix."""
    prompt = _first(request, "text_input")
    if prompt is None:
        raise BadRequest("text_input is required: the text to continue")
    stop_tensor = pb_utils.get_input_tensor_by_name(request, "stop")
    stops = [] if stop_tensor is None else [_text(s, "stop") for s in stop_tensor.as_numpy().reshape(-1)]
    max_tokens, temperature, top_p, seed, stream = (
        _first(request, n) for n in ("max_tokens", "temperature", "top_p", "seed", "stream"))
    params = make_params(
        max_tokens=None if max_tokens is None else int(max_tokens),
        temperature=None if temperature is None else float(temperature),
        top_p=None if top_p is None else float(top_p),
        stop=[s for s in stops if s],  # an empty stop string would end every stream at once: ignore it
        seed=None if seed is None else int(seed),
    )
    return _text(prompt, "text_input"), params, True if stream is None else bool(stream)


def _piece_response(text: str) -> Any:
    return pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=np.object_))])


class _Live:
    def __init__(self, sender: Any, stream: Stream, streaming: bool) -> None:
        self.sender, self.stream, self.streaming = sender, stream, streaming
        self.pieces = 0
        self.ended = False  # the final response is sent: the sender takes nothing more

    def end(self, response: Any = None) -> None:
        self.ended = True
        if response is None:
            self.sender.send(flags=FINAL)
        else:
            self.sender.send(response, flags=FINAL)

    def fail(self, message: str) -> None:
        if not self.ended:
            self.end(pb_utils.InferenceResponse(
                output_tensors=[], error=pb_utils.TritonError(message, pb_utils.TritonError.INTERNAL)))


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.model = CharModel(load_counts((Path(__file__).resolve().parent / WEIGHTS_FILE).read_bytes()))
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.step_interval = float(parameters.get("step_interval_ms", {}).get("string_value", "0")) / 1000.0
        self.logger = pb_utils.Logger
        self.arrivals: queue.SimpleQueue[_Live] = queue.SimpleQueue()
        self.stopping = threading.Event()
        self.generator = threading.Thread(target=self._run, name="textgen", daemon=True)
        self.generator.start()

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                prompt, params, streaming = read_request(request)
            except BadRequest as exc:
                # The caller's mistake: INVALID_ARG is a 400 naming what to fix.
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=FINAL)
                continue
            self.arrivals.put(_Live(sender, new_stream(prompt, params), streaming))
        return None

    def finalize(self) -> None:
        self.stopping.set()
        self.generator.join(timeout=10)

    def _run(self) -> None:
        live: list[_Live] = []
        while not self.stopping.is_set():
            if not live:
                try:  # idle: wait for a stream, waking now and then to notice finalize()
                    live.append(self.arrivals.get(timeout=0.2))
                except queue.Empty:
                    continue
            while not self.arrivals.empty():
                live.append(self.arrivals.get_nowait())
            try:
                live = self._step(live)
            except Exception as exc:
                # Every sender must end, or its client waits for ever; what went wrong stays in the server's log.
                self.logger.log_error(f"textgen failed: {exc!r}")
                for entry in live:
                    entry.fail("the text generator failed")
                live = []
            if self.step_interval:
                time.sleep(self.step_interval)
        for entry in live:
            entry.fail("the model is being unloaded")

    def _step(self, live: list[_Live]) -> list[_Live]:
        """One character for every live stream; the streams still live afterwards."""
        pieces = step(self.model, [entry.stream for entry in live])
        still: list[_Live] = []
        for entry, piece in zip(live, pieces, strict=True):
            if piece is not None:
                if entry.sender.is_cancelled():
                    self.logger.log_info(f"textgen: stream cancelled after {entry.pieces} pieces")
                    entry.end()
                    continue
                if entry.streaming:
                    entry.sender.send(_piece_response(piece))
                entry.pieces += 1
            if not entry.stream.done:
                still.append(entry)
            else:
                entry.end(None if entry.streaming else _piece_response(entry.stream.text))
        return still
