"""What an inference request's body may cost the web process: a compressed body is inflated as it arrives, within a
size and a ratio to what came over the wire, and off the event loop; large JSON is checked in processes of the
gateway's own, a bounded number of bytes at a time (docs/security.md, "What a request body costs").

Why (issue 30): a 260 KB deflate body inflated to 267 MB of `0,0,...` INT8 JSON on the event loop, and simdjson's
parse of it held the GIL for seconds and took 4.8 GB (its tape and index are about 14 bytes per byte of JSON): eight
of them held another team's requests for 7-11 s and grew the web process to 9.4 GB.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import multiprocessing
import os
import signal
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from gateway.protocol import Refusal

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

# A compressed body may always inflate to this much, whatever its ratio (a small request compresses as it likes).
FREE_INFLATE_BYTES = 1024 * 1024
# Inflating at most this much output is done on the event loop (a quarter of a millisecond); more goes to a thread.
# zlib lets go of the GIL while it inflates, so a thread's inflate holds nobody up.
INLINE_INFLATE_BYTES = 256 * 1024
DEFLATE_MAX_RATIO = 1032  # the most deflate can inflate one byte to (zlib's technical notes)


# JSON up to this size is checked on the event loop: the CNN sample's 253 KB request in about 0.5 ms, the densest
# JSON (`0,0,...`, 2 bytes a number) in about 10 ms. Larger JSON goes to the parser processes (Parsers).
INLINE_JSON_BYTES = 512 * 1024


class ClientGone(Exception):
    """The client went away while sending its body."""


def binary_advice() -> str:
    return ("send large tensors in the binary tensor extension instead (a binary_data_size parameter per input and "
            "the Inference-Header-Content-Length header; tritonclient: InferInput.set_data_from_numpy(array, "
            "binary_data=True)), which the gateway streams without parsing")


def json_too_large(size: int | None, limit: int) -> Refusal:
    what = f"is {size} bytes" if size is not None else "is over the limit"
    return Refusal(413, f"The request's JSON {what}; JSON is limited to {limit} bytes here "
                        f"(GATEWAY_MAX_JSON_BYTES): {binary_advice()}.")


class Inflater:
    """A gzip or zlib stream inflated piece by piece: at no point may it have produced more than `limit` bytes, nor
    more than `ratio` times the compressed bytes fed so far (past FREE_INFLATE_BYTES). A bomb is refused as soon as
    its output outgrows what arrived, after inflating at most that much, never the whole of it."""

    def __init__(self, limit: int, ratio: int, what_limit: Callable[[int], Refusal]) -> None:
        self._zlib = zlib.decompressobj(wbits=47)  # gzip or zlib, told apart by their headers
        self.limit = limit
        self.ratio = ratio
        self.what_limit = what_limit  # the refusal for inflating past `limit`
        self.fed = 0
        self.size = 0
        self.pieces: list[bytes] = []

    def room(self) -> int:
        return min(self.limit, max(FREE_INFLATE_BYTES, self.ratio * self.fed)) - self.size

    def feed(self, chunk: bytes) -> None:
        """Inflate `chunk` (synchronous: call it in a thread when room() is large)."""
        room = self.room()
        try:
            plain = self._zlib.decompress(chunk, room + 1)
        except zlib.error as exc:
            raise Refusal(400, f"The compressed request body is corrupt: {exc}.") from None
        if len(plain) > room:
            if self.size + len(plain) > self.limit:
                raise self.what_limit(self.limit)
            raise Refusal(413, f"The compressed request body inflates to over {self.ratio} times the {self.fed} "
                               "bytes received (GATEWAY_MAX_INFLATE_RATIO); send it uncompressed, or "
                               f"{binary_advice()}.")
        self.size += len(plain)
        if plain:
            self.pieces.append(plain)

    def result(self) -> bytes:
        if not self._zlib.eof:
            raise Refusal(400, "The compressed request body is corrupt or cut short.")
        return b"".join(self.pieces)


async def read_inflated(receive: Receive, inflater: Inflater, max_compressed: int, executor: Executor) -> bytes:
    """The body's messages inflated as they arrive, each compressed piece dropped once inflated. The compressed
    bytes are bounded by `max_compressed` (GATEWAY_MAX_BODY_BYTES)."""
    loop = asyncio.get_running_loop()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        if chunk:
            inflater.fed += len(chunk)
            if inflater.fed > max_compressed:
                raise Refusal(413, f"The request body is over the limit of {max_compressed} bytes.")
            if min(inflater.room(), DEFLATE_MAX_RATIO * len(chunk)) <= INLINE_INFLATE_BYTES:
                inflater.feed(chunk)
            else:
                await loop.run_in_executor(executor, inflater.feed, chunk)
        if not message.get("more_body"):
            return inflater.result()


class ByteBudget:
    """At most `capacity` bytes at once, first come first served: the JSON being checked off the event loop. Its
    parse takes about 14 bytes of memory per byte (simdjson's tape and index): with the bytes in flight bounded, so
    is that memory."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @contextlib.asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        size = min(size, self.capacity)  # one larger than everything waits for all of it
        if self._waiting or self.used + size > self.capacity:
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (size, granted)
            self._waiting.append(entry)
            try:
                await granted
            except BaseException:
                if granted.done() and not granted.cancelled():
                    self._release(size)  # granted just as it was cancelled
                else:
                    self._waiting.remove(entry)
                    self._wake()
                raise
        else:
            self.used += size
        try:
            yield
        finally:
            self._release(size)

    def _release(self, size: int) -> None:
        self.used -= size
        self._wake()

    def _wake(self) -> None:
        while self._waiting and self.used + self._waiting[0][0] <= self.capacity:
            size, granted = self._waiting.popleft()
            self.used += size
            granted.set_result(None)


T = TypeVar("T")


class Parsers:
    """Where JSON too large for the event loop is checked: in `processes` processes of their own (spawned, not forked
    from the threaded web process), or with 0 in threads, as before issue 30. simdjson holds the GIL while it parses:
    16 MB of `0,0,...` took 0.5 s to parse and 0.75 s to check here, and in a thread the event loop, every other
    team's requests with it, waited for each such parse in turn. In a process it waits for nothing; the body goes
    there and the check's result comes back pickled (a few ms per 16 MB). A process that dies (killed for its memory)
    costs its request a 503 and is replaced."""

    def __init__(self, processes: int, threads: Executor) -> None:
        self.processes = processes
        self.threads = threads
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> Executor:
        if not self.processes:
            return self.threads
        if self._pool is None:
            # Spawned (a fresh interpreter that imports the main module as __mp_main__: uvicorn's, guarded) from the
            # event loop's thread, which lives as long as the process: the death signal below is tied to it.
            self._pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=die_with_parent, initargs=(os.getpid(),))
        return self._pool

    async def run(self, function: Callable[..., T], *arguments: Any) -> T:
        executor = self._executor()
        running = asyncio.get_running_loop().run_in_executor(executor, function, *arguments)
        try:
            # Shielded: the bytes stay counted (ByteBudget) until the parse has really ended.
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            await asyncio.wait({running})
            raise
        except BrokenProcessPool:
            if self._pool is executor:
                self._pool = None
                executor.shutdown(wait=False, cancel_futures=True)
            raise Refusal(503, "The gateway's JSON checker stopped while checking this request; retry, or "
                               f"{binary_advice()}.", {"Retry-After": "1"}) from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """A parser process's start: ask Linux for SIGKILL when the web process dies. Killed for its memory, the web
    process cannot shut its pool down, and bin/run-portal starts another: idle parsers (about 100 MB each) would
    otherwise be left behind at every restart (measured: they were, waiting on their queue for ever)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(0)


def inflate_threads() -> ThreadPoolExecutor:
    """The gateway's own threads for inflating (zlib lets go of the GIL) and, without parser processes, for parsing:
    not the default executor, where the access checks' database lookups run."""
    return ThreadPoolExecutor(2, thread_name_prefix="gateway-body")
