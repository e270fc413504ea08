"""Triton python-backend model `textgen`, the sample text generator: a decoupled model (`model_transaction_policy
{ decoupled: true }`) that streams the pieces textgen.py generates: a response carries every piece its stream has
ready when it is sent, one element of text_output each (one, unless the stream's sending fell behind). Zipped as
model.py with textgen.py and the weights textgen.npz.

The contract is the one Triton's OpenAI frontend uses for models other than vLLM's: `text_input` (BYTES [-1, 1]),
optional `max_tokens` (INT32), `temperature` (FP32), `top_p` (FP32), `stream` (BOOL: false sends the whole text as
one response), `stop` (BYTES [-1, -1], up to 4 strings) and `seed` (INT64); output `text_output` (BYTES [-1, -1]:
[1, pieces] in a streamed response, so `/generate_stream` writes one piece as a string and several as a list).

Continuous batching: execute() only checks its requests and hands them to one generating thread, which steps every
live stream together (one character each per step, their pieces interleaved) and takes in new streams between steps.
Generating inside execute() would make a stream that arrives during a long one wait for all of that batch to end.

Sending: each `send()` of a response is a round trip from this stub process to Triton's (about 70 us a response on
this project's 2-core machine with a model that does nothing else), and so is `is_cancelled()`; through Triton and
the gateway a response costs about as much CPU again. At 32 streams one response per piece made the sends the
bottleneck: the generator waited for them half of its time, and straight from Triton the sample streamed 8,900
pieces per second where the hand-rolled server of bench/streaming.py streams 6,500. So the generator hands each piece
to its stream's sending thread (SENDING_THREADS of them, streams given in turn; a send waits for Triton without
holding the GIL, so two overlap their round trips) and goes on; a sending thread takes a stream with every piece it
has pending and sends them in one response, in order, then its final response once that is due. A stream whose
sending keeps up gets one piece per response; one whose sending fell behind gets the pieces it missed at once rather
than each late (the trade of the "stream interval" of servers such as SGLang, here made only when sends lag):
18,000 to 21,000 pieces per second at 32 streams, in about 4,000 responses (docs/benchmarks.md, "Streaming").
Bounds: a stream is at most MAX_PENDING pieces ahead of its sending (past it the generator skips the stream until
they are taken), and a stream's first piece is sent before those of streams that have had one (a new stream waits
for one send, not for a round of all of them: at 32 streams, straight from Triton, the first piece came after 10.6 ms
at p50 without that, 4.3 with). Cancellation (the client went away) is checked on a stream's first response and every
CANCEL_CHECK_EVERY-th after; the generator drops a cancelled stream at its next step.

The config parameter `step_interval_ms` (the operator's, not a request's) pauses after every step, for demos and
tests that need a stream to last.
"""

from __future__ import annotations

import collections
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
CANCEL_CHECK_EVERY = 4  # responses: a cancelled stream sends at most this many more (a few ms of a step each)
MAX_PENDING = 8  # pieces a stream may be ahead of its sending: past it, the generator skips the stream


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


def _piece_response(*texts: str) -> Any:
    """One response with `texts` as text_output [1, len(texts)]: one element per piece."""
    values = np.array([[text.encode() for text in texts]], dtype=np.object_)
    return pb_utils.InferenceResponse([pb_utils.Tensor("text_output", values)])


class _Live:
    """One stream. The generator thread steps it and hands its pieces to its sending thread (`sending`), which alone
    calls its sender. `pending`, `queued`, `final` and `check` are shared by the two: read and written under
    `sending.lock`."""

    def __init__(self, sender: Any, stream: Stream, streaming: bool, sending: Sending) -> None:
        self.sender, self.stream, self.streaming, self.sending = sender, stream, streaming, sending
        self.pending: list[str] = []  # pieces generated and not yet taken for sending
        self.queued = False  # in its sending thread's queue
        self.final: tuple[Any] | None = None  # (the final response, or None for an empty one), once it is due
        self.check = False  # an answer not streamed: only whether the caller went away
        self.started = False  # some of its pieces were taken: the next ones wait behind new streams' first
        self.responses = 0  # sent by the sending thread
        self.pieces = 0  # in the responses sent
        self.generated = 0  # pieces generated, counted by the generator
        self.ended = False  # the final response is due: nothing more is handed over for it
        self.cancelled = False  # set by the sending thread: the generator drops the stream


class Sending:
    """A thread that sends its streams' pieces: each time it takes a stream, every piece it has pending goes in one
    response, in the order they were generated, then its final response once that is due."""

    def __init__(self, logger: Any, drained: threading.Event) -> None:
        self.logger = logger
        self.lock = threading.Lock()
        # Streams with something to send (each at most once), a stream's first piece ahead of the rest: one token
        # in `wake` per stream queued in either.
        self.first: collections.deque[_Live] = collections.deque()
        self.rest: collections.deque[_Live] = collections.deque()
        self.wake: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self.drained = drained  # set whenever a stream's pieces are taken: the generator may step it again
        self.thread = threading.Thread(target=self._run, name="textgen-send", daemon=True)
        self.thread.start()

    def _due(self, entry: _Live) -> None:
        """Under self.lock: the stream has something to send; queued unless it already is."""
        if not entry.queued:
            entry.queued = True
            first = entry.streaming and not entry.started and entry.final is None
            (self.first if first else self.rest).append(entry)
            self.wake.put(True)

    def piece(self, entry: _Live, text: str) -> None:
        with self.lock:
            entry.pending.append(text)
            self._due(entry)

    def check_cancelled(self, entry: _Live) -> None:
        with self.lock:
            entry.check = True
            self._due(entry)

    def end(self, entry: _Live, response: Any = None) -> None:
        if entry.ended:
            return
        entry.ended = True
        with self.lock:
            entry.final = (response,)
            self._due(entry)

    def fail(self, entry: _Live, message: str) -> None:
        self.end(entry, pb_utils.InferenceResponse(
            output_tensors=[], error=pb_utils.TritonError(message, pb_utils.TritonError.INTERNAL)))

    def stop(self) -> None:
        self.wake.put(False)
        self.thread.join(timeout=10)

    def _run(self) -> None:
        while self.wake.get():
            with self.lock:
                entry = self.first.popleft() if self.first else self.rest.popleft()
                texts, entry.pending = entry.pending, []
                entry.started = entry.started or bool(texts)
                final, entry.final = entry.final, None
                check, entry.check = entry.check, False
                entry.queued = False
            self.drained.set()
            try:
                self._send(entry, texts, final, check)
            except Exception as exc:  # one stream's failed send must not stop the others'
                self.logger.log_error(f"textgen: a send failed: {exc!r}")

    def _send(self, entry: _Live, texts: list[str], final: tuple[Any] | None, check: bool) -> None:
        if entry.cancelled:
            return  # its final response was sent when the cancel was seen
        try:
            if texts or check:
                if (check or entry.responses % CANCEL_CHECK_EVERY == 0) and entry.sender.is_cancelled():
                    entry.cancelled = True
                    self.logger.log_info(f"textgen: stream cancelled after {entry.pieces} pieces")
                    entry.sender.send(flags=FINAL)
                    return
                if texts:
                    entry.sender.send(_piece_response(*texts))
                    entry.responses += 1
                    entry.pieces += len(texts)
        finally:
            # Even when a piece's send failed: without its final response the request would stay open for ever.
            if final is not None and not entry.cancelled:
                (response,) = final
                if response is None:
                    entry.sender.send(flags=FINAL)
                else:
                    entry.sender.send(response, flags=FINAL)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.model = CharModel(load_counts((Path(__file__).resolve().parent / WEIGHTS_FILE).read_bytes()))
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.step_interval = float(parameters.get("step_interval_ms", {}).get("string_value", "0")) / 1000.0
        self.logger = pb_utils.Logger
        self.arrivals: queue.SimpleQueue[_Live] = queue.SimpleQueue()
        self.drained = threading.Event()
        self.sendings = [Sending(self.logger, self.drained) for _ in range(SENDING_THREADS)]
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
            live = [entry for entry in live if not entry.cancelled]
            ready = [entry for entry in live if len(entry.pending) < MAX_PENDING]
            if not ready:
                # Every stream is MAX_PENDING pieces ahead of its sending: wait until one's are taken.
                self.drained.clear()
                if live and all(len(entry.pending) >= MAX_PENDING for entry in live):
                    self.drained.wait(0.05)
                continue
            try:
                live = self._step(live, ready)
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

    def _step(self, live: list[_Live], ready: list[_Live]) -> list[_Live]:
        """One character for every stream in `ready`; the streams of `live` still live afterwards."""
        pieces = step(self.model, [entry.stream for entry in ready])
        for entry, piece in zip(ready, pieces, strict=True):
            if piece is not None:
                if entry.streaming:
                    entry.sending.piece(entry, piece)
                elif entry.generated % CANCEL_CHECK_EVERY == 0:
                    entry.sending.check_cancelled(entry)
                entry.generated += 1
            if entry.stream.done:
                entry.sending.end(entry, None if entry.streaming else _piece_response(entry.stream.text))
        return [entry for entry in live if not entry.stream.done]
