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
  cancels the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from deployments import pool_names as pool_model_names
from gateway import contract as contracts
from gateway import pool_names
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


class Events(Protocol):
    """The upstream answer as the relay reads it (gateway.upstream.Response)."""

    status: int
    headers: list[tuple[bytes, bytes]]

    def iter_body(self, limit: int, idle_timeout: float | None = None) -> AsyncGenerator[bytes, None]: ...

    def close(self) -> None: ...


class _StreamFailed(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def error_event(message: str) -> bytes:
    return b"event: error\ndata: " + json.dumps({"error": message}).encode() + _END


async def relay(response: Events, receive: Receive, send: Send, limits: Limits,
                contract: contracts.Contract | None, pool_prefix: str = "") -> int:
    """Relay Triton's 200 event stream to the caller; the status to count it by (499: the caller went away, 502 or
    504: the stream ended with the gateway's error event)."""
    pieces = response.iter_body(_UNBOUNDED, idle_timeout=limits.idle_seconds)
    headers = [(k, v) for k, v in response.headers if k not in _REPLACED] + STREAM_HEADERS
    gone = asyncio.ensure_future(_wait_for_disconnect(receive))
    passing = asyncio.ensure_future(_pass(pieces, send, headers, limits, contract, pool_prefix))
    try:
        await asyncio.wait((passing, gone), return_when=asyncio.FIRST_COMPLETED)
        if not passing.done():
            # The caller went away: stop reading now, even while the model is silent between pieces; closing the
            # connection (below) is what makes Triton cancel the request.
            passing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await passing
            return 499
        return passing.result()
    except OSError:
        return 499  # a server that does raise on sending to a closed connection
    finally:
        gone.cancel()
        passing.cancel()
        await pieces.aclose()
        response.close()  # a no-op after a complete read; otherwise the connection is dropped, not pooled


async def _pass(pieces: AsyncGenerator[bytes, None], send: Send, headers: list[tuple[bytes, bytes]], limits: Limits,
                contract: contracts.Contract | None, prefix: str) -> int:
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    held = bytearray()  # the start of an event whose end has not come yet
    code = 200
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
            await send({"type": "http.response.body", "body": out, "more_body": True})
            if failed:
                code = 500  # the model's error ended the stream (Triton sends nothing after it)
        if held.strip():
            # Triton ends every event: bytes after the last one are no event a client could read.
            raise _StreamFailed("The stream ended in the middle of a piece (Triton closed it).", 502)
    except _StreamFailed as exc:
        await _fail(send, exc.message)
        return exc.code
    except TimeoutError:
        await _fail(send, f"The model sent nothing for {limits.idle_seconds:g} s (GATEWAY_STREAM_IDLE_SECONDS); the "
                          "stream was ended.")
        return 504
    except UpstreamError as exc:
        log.info("a stream from upstream failed: %s", exc)
        await _fail(send, "Triton broke the connection in the middle of the stream; the deployment may be "
                          "restarting. Retry shortly.")
        return 502
    await send({"type": "http.response.body", "body": b""})
    return code


def _too_large(limits: Limits) -> _StreamFailed:
    return _StreamFailed(f"A piece of the answer is over the gateway's limit of {limits.max_event_bytes} bytes "
                         "(GATEWAY_MAX_RESPONSE_BYTES): the stream was ended. Send smaller pieces.", 502)


async def _fail(send: Send, message: str) -> None:
    await send({"type": "http.response.body", "body": error_event(message), "more_body": True})
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
    too large, cut or broken; 504: silent past the idle bound)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


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
                    raise EventsFailed(_too_large(limits).message, 502)
                complete = bytes(held[:end])
                del held[:end + len(_END)]
                searched = 0
                yield complete
            if len(held) > limits.max_event_bytes:
                raise EventsFailed(_too_large(limits).message, 502)
        if held.strip():
            raise EventsFailed("The stream ended in the middle of a piece (Triton closed it).", 502)
    except TimeoutError:
        raise EventsFailed(f"The model sent nothing for {limits.idle_seconds:g} s (GATEWAY_STREAM_IDLE_SECONDS); the "
                           "stream was ended.", 504) from None
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
