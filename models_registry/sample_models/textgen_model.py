"""Triton python-backend model `textgen`, the sample text generator: a decoupled model (`model_transaction_policy
{ decoupled: true }`) that streams the pieces textgen.py generates, one response per piece. Zipped as model.py with
textgen.py and the weights textgen.npz.

The contract is the one Triton's OpenAI frontend uses for models other than vLLM's: `text_input` (BYTES [-1, 1]),
optional `max_tokens` (INT32), `temperature` (FP32), `top_p` (FP32), `stream` (BOOL: false sends the whole text as
one response), `stop` (BYTES [-1, -1], up to 4 strings) and `seed` (INT64); output `text_output` (BYTES [-1, 1]).

Continuous batching: execute() only checks its requests and hands them to one generating thread, which steps every
live stream together (one character each per step, their pieces interleaved) and takes in new streams between steps.
Generating inside execute() would make a stream that arrives during a long one wait for all of that batch to end.

Sending: each `send()` of a response is a round trip from this stub process to Triton's (about 130 us a response on
this project's 2-core machine with a model that does nothing else), and so is `is_cancelled()`. Done by the
generating thread they took about 70% of its time at 32 streams, so SENDING_THREADS threads do them instead while the
generator computes the next step. A send waits for Triton's process without holding the GIL, so two senders overlap
their round trips: direct at 32 streams, 5,100 pieces per second with one and 6,000 with two (4 gave 6,100, within
the noise, and a worse first-piece p99). The generator queues a step's responses only once the previous step's are
sent: a deeper queue let it run ahead of the sends, and a new stream's first piece waited behind all of them (time to
first piece at 8 streams went from 6 to 150 ms with a queue of 256). A stream keeps to one sending thread (given in
turn as streams arrive), which makes every call on its response sender in the order the generator queued them, so its
pieces keep their order and its final response comes last. Cancellation (the client went away) is checked on a
stream's first piece and every CANCEL_CHECK_EVERY-th after; the generator drops a cancelled stream at its next step.

The config parameter `step_interval_ms` (the operator's, not a request's) pauses after every step, for demos and
tests that need a stream to last.
"""

from __future__ import annotations

import itertools
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
SENDING_THREADS = 2  # each stream keeps to one, so its pieces keep their order
CANCEL_CHECK_EVERY = 4  # pieces: a cancelled stream sends at most this many more (a few ms of a step each)


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
    """One stream. The generator thread steps it; its sending thread (`sending`) alone calls its sender."""

    def __init__(self, sender: Any, stream: Stream, streaming: bool, sending: Sending) -> None:
        self.sender, self.stream, self.streaming, self.sending = sender, stream, streaming, sending
        self.pieces = 0  # sent by the sending thread
        self.generated = 0  # pieces generated, counted by the generator
        self.ended = False  # the final response is queued: nothing more is queued for it
        self.cancelled = False  # set by the sending thread: the generator drops the stream


class Sending:
    """A thread that sends its streams' responses, in the order they were queued."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger
        self.queue: queue.Queue[tuple[_Live, Any, bool] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="textgen-send", daemon=True)
        self.thread.start()

    def piece(self, entry: _Live, text: str) -> None:
        self.queue.put((entry, _piece_response(text), False))

    def check(self, entry: _Live) -> None:
        """Only whether the caller went away: an answer not streamed sends nothing until its end."""
        self.queue.put((entry, None, False))

    def end(self, entry: _Live, response: Any = None) -> None:
        if not entry.ended:
            entry.ended = True
            self.queue.put((entry, response, True))

    def fail(self, entry: _Live, message: str) -> None:
        self.end(entry, pb_utils.InferenceResponse(
            output_tensors=[], error=pb_utils.TritonError(message, pb_utils.TritonError.INTERNAL)))

    def wait_sent(self) -> None:
        """Until every response queued so far is sent (the generator's bound: one step ahead at most)."""
        self.queue.join()

    def stop(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=10)

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            entry, response, final = item
            try:
                self._send(entry, response, final)
            except Exception as exc:  # one stream's failed send must not stop the others'
                self.logger.log_error(f"textgen: a send failed: {exc!r}")
            finally:
                self.queue.task_done()

    def _send(self, entry: _Live, response: Any, final: bool) -> None:
        if entry.cancelled:
            return  # its final response was sent when the cancel was seen
        if final:
            if response is None:
                entry.sender.send(flags=FINAL)
            else:
                entry.sender.send(response, flags=FINAL)
            return
        if (response is None or entry.pieces % CANCEL_CHECK_EVERY == 0) and entry.sender.is_cancelled():
            entry.cancelled = True
            self.logger.log_info(f"textgen: stream cancelled after {entry.pieces} pieces")
            entry.sender.send(flags=FINAL)
        elif response is not None:
            entry.sender.send(response)
            entry.pieces += 1


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.model = CharModel(load_counts((Path(__file__).resolve().parent / WEIGHTS_FILE).read_bytes()))
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.step_interval = float(parameters.get("step_interval_ms", {}).get("string_value", "0")) / 1000.0
        self.logger = pb_utils.Logger
        self.arrivals: queue.SimpleQueue[_Live] = queue.SimpleQueue()
        self.sendings = [Sending(self.logger) for _ in range(SENDING_THREADS)]
        self.sending_in_turn = itertools.cycle(self.sendings)
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
            self.arrivals.put(_Live(sender, new_stream(prompt, params), streaming, next(self.sending_in_turn)))
        return None

    def finalize(self) -> None:
        self.stopping.set()
        self.generator.join(timeout=10)
        for sending in self.sendings:
            sending.stop()

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
                    entry.sending.fail(entry, "the text generator failed")
                live = []
            if self.step_interval:
                time.sleep(self.step_interval)
        for entry in live:
            entry.sending.fail(entry, "the model is being unloaded")

    def _step(self, live: list[_Live]) -> list[_Live]:
        """One character for every live stream; the streams still live afterwards."""
        live = [entry for entry in live if not entry.cancelled]
        pieces = step(self.model, [entry.stream for entry in live])  # while the previous step's pieces are sent
        for sending in self.sendings:
            sending.wait_sent()
        still: list[_Live] = []
        for entry, piece in zip(live, pieces, strict=True):
            if piece is not None:
                if entry.streaming:
                    entry.sending.piece(entry, piece)
                elif entry.generated % CANCEL_CHECK_EVERY == 0:
                    entry.sending.check(entry)
                entry.generated += 1
            if not entry.stream.done:
                still.append(entry)
            else:
                entry.sending.end(entry, None if entry.streaming else _piece_response(entry.stream.text))
        return still
