"""Static files under the ASGI server, streamed asynchronously (issue 31).

whitenoise (6.12, the version installed; it has no async support) answers a static file with a FileResponse over
the open file: a synchronous iterator. Under ASGI (portal/asgi.py, what `make run` serves) Django's handler then
warned "StreamingHttpResponse must consume synchronous iterators in order to serve them asynchronously" at every
static file, and read the whole file into a list in a thread before it sent a byte of it. Here the same response,
for a request that came through ASGI, gets an asynchronous iterator instead: each block is read in a worker thread
and sent as it is read, so the event loop never waits for the disk. Headers, ranges, HEAD and 304 are whitenoise's
own, untouched; under WSGI (portal/wsgi.py) the response is whitenoise's as it was.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import IO, Any

from django.core.handlers.asgi import ASGIRequest
from django.http import FileResponse, HttpRequest
from whitenoise.middleware import WhiteNoiseMiddleware

BLOCK_BYTES = 64 * 1024  # what Django's ASGI handler sends per message (ASGIHandler.chunk_size)


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    @staticmethod
    def serve(static_file: Any, request: HttpRequest) -> FileResponse:
        response: FileResponse = WhiteNoiseMiddleware.serve(static_file, request)
        if isinstance(request, ASGIRequest):
            # The file stays among the response's closers (FileResponse put it there): closed once it is sent.
            response.streaming_content = read_blocks(response.file_to_stream)
        return response


async def read_blocks(file: IO[bytes] | None) -> AsyncIterator[bytes]:
    """The file's bytes block by block, each read in a worker thread; nothing for a response without a body."""
    if file is None:
        return
    while block := await asyncio.to_thread(file.read, BLOCK_BYTES):
        yield block
