"""A streaming model's answer through the gateway (issue 33): Triton's Server-Sent Events from
`/v2/models/<model>/generate_stream`, relayed to the caller event by event as they arrive.

What Triton 2.51 sends (measured, tests/test_streaming_e2e.py keeps it true): `200 text/event-stream`, chunked, one
`data: {"model_name":..,"model_version":..,<output>:..}\\n\\n` per response the model sends, in a chunk of its own as
the model sends it; a response that is an error (a model that raised, or sent an error) is `data: {"error": ...}`
and ends the stream. It cancels the request (the model sees `request.is_cancelled()`) when the connection closes.

So the relay:
- holds at most one event at a time (an event whose terminating blank line has not come yet), up to
  `max_event_bytes` (GATEWAY_MAX_RESPONSE_BYTES, the bound of a unary answer: each piece is one answer); an event
  past it ends the stream, never buffered further;
- passes on each complete event at once (no coalescing, no waiting for more);
- turns an error, Triton's or its own (an event too large, no event within GATEWAY_STREAM_IDLE_SECONDS, Triton gone),
  into `event: error` with `data: {"error": "<what went wrong>"}` and ends the stream properly, never cut;
- closes its Triton connection as soon as the caller disconnects, even while the model is silent, so that Triton
  cancels the request;
- ends a stream open GATEWAY_MAX_STREAM_SECONDS, or that would send past GATEWAY_MAX_STREAM_BYTES, with the error
  event, and one whose caller has not taken a piece for GATEWAY_STREAM_SEND_SECONDS (a slow reader) without one (it
  would not be read either): the web server's `send` waits while its transport's buffer is past its high-water
  mark (uvicorn's flow control), so nothing is held past that buffer and the piece being sent; each ending closes
  the Triton connection (Triton cancels) and frees the stream's slot;
- counts each stream's figures and how it ended (gateway/stream_figures.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from deployments import pool_names as pool_model_names
from gateway import contract as contracts
from gateway import pool_names
from gateway import stream_figures as figures_of
from gateway.stream_figures import StreamFigures
from gateway.upstream import UpstreamError

log = logging.getLogger(__name__)

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# The headers a stream answers with: no cache, and no buffering by a proxy in front of the portal (nginx honours
# X-Accel-Buffering: it otherwise holds the answer until its buffer fills, the 22 ms first token become 287 ms).
STREAM_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                  (b"x-accel-buffering", b"no")]
_REPLACED = {b"content-type", b"cache-control", b"x-accel-buffering", b"content-length"}
_END = b"\n\n"
_ERROR_DATA = b'data: {"error"'
_DATA = b"data: "
# The events' total is not bounded (a stream is as long as the model makes it); each event is, by Limits.
_UNBOUNDED = sys.maxsize


@dataclass(frozen=True)
class Limits:
    max_event_bytes: int  # one event (one piece of the answer), as it is held until it is complete
    idle_seconds: float  # the longest gap between two reads from Triton
    max_seconds: float = math.inf  # a stream's whole length, GATEWAY_MAX_STREAM_SECONDS
    max_bytes: int = _UNBOUNDED  # what a stream may send in all, GATEWAY_MAX_STREAM_BYTES
    send_seconds: float = math.inf  # the longest one piece may wait for the caller to take it


class Events(Protocol):
    """The upstream answer as the relay reads it (gateway.upstream.Response)."""

    status: int
    headers: list[tuple[bytes, bytes]]

    def iter_body(self, limit: int, idle_timeout: float | None = None) -> AsyncGenerator[bytes, None]: ...

    def close(self) -> None: ...


class _StreamFailed(Exception):
    def __init__(self, message: str, code: int, reason: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason


class Sending:
    """When the piece being sent was handed to the web server (0.0: none is waiting), for the relay's watch."""

    __slots__ = ("since",)

    def __init__(self) -> None:
        self.since = 0.0


def error_event(message: str) -> bytes:
    return b"event: error\ndata: " + json.dumps({"error": message}).encode() + _END


async def relay(response: Events, receive: Receive, send: Send, limits: Limits,
                contract: contracts.Contract | None, pool_prefix: str = "",
                figures: StreamFigures | None = None) -> int:
    """Relay Triton's 200 event stream to the caller; the status to count it by (499: the caller went away, 502 or
    504: the stream ended with the gateway's error event, 408: a slow reader's stream was ended). `figures`, when
    given, are counted piece by piece and ended with how the stream ended."""
    pieces = response.iter_body(_UNBOUNDED, idle_timeout=limits.idle_seconds)
    headers = [(k, v) for k, v in response.headers if k not in _REPLACED] + STREAM_HEADERS
    sending = Sending()
    ended: list[str] = [figures_of.COMPLETE]
    try:
        return await watch(_pass(pieces, send, headers, limits, contract, pool_prefix, figures, sending, ended),
                           receive, send, limits, sending, ended, lambda message, _: error_event(message))
    finally:
        if figures is not None:
            figures.ended(ended[0])  # first: what follows awaits, and a cancelled request may not get past it
        try:
            await pieces.aclose()
        except RuntimeError:
            pass  # still being read by the cancelled `passing`, which has not finished yet
        finally:
            response.close()  # a no-op after a complete read; otherwise the connection is dropped, not pooled


async def watch(sending_all: Coroutine[Any, Any, int], receive: Receive | None, send: Send, limits: Limits,
                sending: Sending, ended: list[str], error: Callable[[str, int], bytes]) -> int:
    """Run a stream's sending (`sending_all`, which marks in `sending` when a piece waits for the caller) within the
    stream bounds, the relay's and the OpenAI-compatible API's alike: the status to count it by. The caller going
    away (watched here when `receive` is given; else the task is cancelled) is 499 and CANCELLED; a piece not taken
    for `limits.send_seconds` ends the stream without an error event (408, SLOW_READER: the response is left
    incomplete, so that the web server resets the connection); a stream open `limits.max_seconds` ends with the
    event `error(message, status)` (504, LENGTH_SECONDS). `ended[0]` is set to how it ended, where that is here."""
    gone: asyncio.Future[Any] = (asyncio.ensure_future(_wait_for_disconnect(receive)) if receive is not None
                                 else asyncio.get_running_loop().create_future())
    passing = asyncio.ensure_future(sending_all)
    deadline = time.perf_counter() + limits.max_seconds
    try:
        while True:
            # One wake-up per send_seconds at most while pieces flow, none per piece: the watch looks at when the
            # piece being sent was handed over, and at the stream's deadline.
            now = time.perf_counter()
            wake = min(deadline, (sending.since or now) + limits.send_seconds)
            await asyncio.wait((passing, gone), timeout=max(0.0, wake - now) if wake != math.inf else None,
                               return_when=asyncio.FIRST_COMPLETED)
            if passing.done():
                return passing.result()
            if gone.done():
                # The caller went away: stop reading now, even while the model is silent between pieces; closing
                # the connection (the caller's `finally`) is what makes Triton cancel the request.
                ended[0] = figures_of.CANCELLED
                await _stop(passing)
                return 499
            now = time.perf_counter()
            if sending.since and now - sending.since >= limits.send_seconds:
                # The caller has not taken a piece for send_seconds: what it has not read stays in the web
                # server's send buffer (bounded by its flow control); the stream is ended without an error event,
                # which it would not read either, and its connection is closed when this returns.
                ended[0] = figures_of.SLOW_READER
                await _stop(passing)
                log.info("a stream's caller read nothing for %g s: ended", limits.send_seconds)
                return 408
            if now >= deadline:
                ended[0] = figures_of.LENGTH_SECONDS
                await _stop(passing)
                return await _fail_within(send, limits, error(
                    f"The stream was open for {limits.max_seconds:g} s, the gateway's limit "
                    "(GATEWAY_MAX_STREAM_SECONDS): it was ended. Ask for a shorter answer.", 504), 504)
    except OSError:
        ended[0] = figures_of.CANCELLED
        return 499  # a server that does raise on sending to a closed connection
    except asyncio.CancelledError:
        ended[0] = figures_of.CANCELLED  # the server cancelled the request (its caller went away)
        raise
    finally:
        gone.cancel()
        passing.cancel()


async def _stop(task: asyncio.Future[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


async def _fail_within(send: Send, limits: Limits, event: bytes, code: int) -> int:
    """The error event, if the caller takes it within send_seconds (a stream ended while a piece was waiting to be
    taken has the rest of that piece's time)."""
    try:
        async with asyncio.timeout(None if limits.send_seconds == math.inf else limits.send_seconds):
            await _fail(send, event)
    except TimeoutError:
        pass
    return code


async def _pass(pieces: AsyncGenerator[bytes, None], send: Send, headers: list[tuple[bytes, bytes]], limits: Limits,
                contract: contracts.Contract | None, prefix: str, figures: StreamFigures | None, sending: Sending,
                ended: list[str]) -> int:
    clock = time.perf_counter
    sending.since = clock()
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    sending.since = 0.0
    held = bytearray()  # the start of an event whose end has not come yet
    code = 200
    sent = 0
    try:
        async for piece in pieces:
            # What is held has no event's end in it (it was sent on): an end is in the new piece, or straddles the
            # two. Only that much is searched, so that an event trickled in small reads costs no rescan per read.
            searched = max(0, len(held) - len(_END) + 1)
            held += piece
            end = held.rfind(_END, searched)
            if end < 0:
                if len(held) > limits.max_event_bytes:
                    raise _too_large(limits)
                continue
            complete = bytes(held[:end + len(_END)])
            del held[:end + len(_END)]
            if len(held) > limits.max_event_bytes or (len(complete) > limits.max_event_bytes
                                                      and _largest(complete) > limits.max_event_bytes):
                raise _too_large(limits)
            out, failed = _outgoing(complete, contract, prefix)
            sent += len(out)
            if sent > limits.max_bytes:
                raise _StreamFailed(too_many_bytes(limits), 502, figures_of.LENGTH_BYTES)
            # One clock read: when the piece is handed to the web server (its TTFT or gap), and the watch's start.
            sending.since = now = clock()
            await send({"type": "http.response.body", "body": out, "more_body": True})
            sending.since = 0.0
            if figures is not None:
                figures.piece(len(out), now)
            if failed:
                code = 500  # the model's error ended the stream (Triton sends nothing after it)
                ended[0] = figures_of.MODEL_ERROR
        if held.strip():
            # Triton ends every event: bytes after the last one are no event a client could read.
            raise _StreamFailed("The stream ended in the middle of a piece (Triton closed it).", 502,
                                figures_of.UPSTREAM)
    except _StreamFailed as exc:
        ended[0] = exc.reason
        await _sent_fail(send, sending, exc.message)
        return exc.code
    except TimeoutError:
        ended[0] = figures_of.IDLE
        await _sent_fail(send, sending, f"The model sent nothing for {limits.idle_seconds:g} s "
                                        "(GATEWAY_STREAM_IDLE_SECONDS); the stream was ended.")
        return 504
    except UpstreamError as exc:
        log.info("a stream from upstream failed: %s", exc)
        ended[0] = figures_of.UPSTREAM
        await _sent_fail(send, sending, "Triton broke the connection in the middle of the stream; the deployment "
                                        "may be restarting. Retry shortly.")
        return 502
    sending.since = clock()
    await send({"type": "http.response.body", "body": b""})
    sending.since = 0.0
    return code


async def _sent_fail(send: Send, sending: Sending, message: str) -> None:
    """The error event, watched as a piece is (a caller that does not take it is a slow reader)."""
    sending.since = time.perf_counter()
    await _fail(send, error_event(message))
    sending.since = 0.0


def too_many_bytes(limits: Limits) -> str:
    return (f"The stream would send more than {limits.max_bytes} bytes, the gateway's limit "
            "(GATEWAY_MAX_STREAM_BYTES): it was ended. Ask for a shorter answer.")


def _too_large(limits: Limits) -> _StreamFailed:
    return _StreamFailed(f"A piece of the answer is over the gateway's limit of {limits.max_event_bytes} bytes "
                         "(GATEWAY_MAX_RESPONSE_BYTES): the stream was ended. Send smaller pieces.", 502,
                         figures_of.TOO_LARGE)


async def _fail(send: Send, event: bytes) -> None:
    await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def _largest(events: bytes) -> int:
    return max(len(event) + len(_END) for event in events.split(_END))


def _outgoing(events: bytes, contract: contracts.Contract | None, prefix: str) -> tuple[bytes, bool]:
    """Complete events as the caller gets them, and whether one was an error. The common case, no error and no
    pool, is the bytes as they came: nothing parsed."""
    if not prefix and _ERROR_DATA not in events:
        return events, False
    out = []
    failed = False
    for event in events.split(_END)[:-1]:
        if event.startswith(_ERROR_DATA):
            out.append(error_event(_error_words(event, contract, prefix)))
            failed = True
        elif prefix and event.startswith(_DATA):
            renamed, _ = pool_names.rename_head(event[len(_DATA):], prefix)
            out.append(_DATA + renamed + _END)
        else:
            out.append(event + _END)
    return b"".join(out), failed


def _error_words(event: bytes, contract: contracts.Contract | None, prefix: str) -> str:
    """Triton's error event in the caller's words: a model's failure says nothing of its internals (its traceback
    holds this machine's paths), as an inference's 500 does (gateway/contract.py)."""
    try:
        message = json.loads(event[len(_DATA):])["error"]
    except (ValueError, TypeError, KeyError):
        message = ""
    text = str(message)
    if prefix:
        text = pool_model_names.without_names(text, prefix)
    return contracts.reword(500, text, contract)[1]


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


# --- Events one by one, for an answer the gateway makes of them (the OpenAI-compatible API) -----------------------


class EventsFailed(Exception):
    """Triton's event stream could not be read to its end: `message` for the caller, `code` to count it by (502:
    too large, cut or broken; 504: silent past the idle bound), `reason` to end its figures by."""

    def __init__(self, message: str, code: int, reason: str = figures_of.UPSTREAM) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason


async def complete_events(response: Events, limits: Limits) -> AsyncGenerator[bytes, None]:
    """Each complete event of Triton's 200 event stream, without its blank line, as it arrives: the relay's bounds
    (one event held, at most `limits.max_event_bytes`; at most `limits.idle_seconds` between reads). EventsFailed in
    the relay's words when they are passed or Triton breaks the stream. The caller closes the response."""
    pieces = response.iter_body(_UNBOUNDED, idle_timeout=limits.idle_seconds)
    held = bytearray()
    try:
        async for piece in pieces:
            searched = max(0, len(held) - len(_END) + 1)
            held += piece
            while (end := held.find(_END, searched)) >= 0:
                if end > limits.max_event_bytes:
                    raise EventsFailed(_too_large(limits).message, 502, figures_of.TOO_LARGE)
                complete = bytes(held[:end])
                del held[:end + len(_END)]
                searched = 0
                yield complete
            if len(held) > limits.max_event_bytes:
                raise EventsFailed(_too_large(limits).message, 502, figures_of.TOO_LARGE)
        if held.strip():
            raise EventsFailed("The stream ended in the middle of a piece (Triton closed it).", 502)
    except TimeoutError:
        raise EventsFailed(f"The model sent nothing for {limits.idle_seconds:g} s (GATEWAY_STREAM_IDLE_SECONDS); the "
                           "stream was ended.", 504, figures_of.IDLE) from None
    except UpstreamError as exc:
        log.info("a stream from upstream failed: %s", exc)
        raise EventsFailed("Triton broke the connection in the middle of the stream; the deployment may be "
                           "restarting. Retry shortly.", 502) from None
    finally:
        await pieces.aclose()


def event_data(event: bytes, prefix: str = "") -> Any:
    """The JSON of an event's `data:` line (a pool's model name taken off), or None for an event without one."""
    for line in event.split(b"\n"):
        if line.startswith(_DATA):
            data = line[len(_DATA):]
            if prefix:
                data, _ = pool_names.rename_head(data, prefix)
            try:
                return json.loads(data)
            except ValueError:
                return None
    return None
