"""A request body cap in front of Django, applied before anything reads the body.

Django's ASGI handler spools the whole body to a temporary file before a view (and its authentication) runs, so
without this anyone could fill the disk or keep a worker busy with one unauthenticated request. A declared
Content-Length over the limit is refused at once; a chunked body is counted as it arrives and, past the limit, the
app sees the client go away and the client gets the 413.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]

# tus PATCH requests carry an upload's bytes; the upload's own length (checked by the view) bounds them.
_TUS_PATCH = re.compile(r"/api/v1/uploads/[^/]+/?")


def limit_for(scope: Scope) -> int:
    if scope.get("method") == "PATCH" and _TUS_PATCH.fullmatch(scope.get("path", "")):
        return int(settings.MAX_UPLOAD_SIZE)
    return int(settings.MAX_REQUEST_BODY_BYTES)


class BodyLimit:
    def __init__(self, app: ASGIApp, limit: Callable[[Scope], int] = limit_for) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit(scope)
        declared = None
        for name, value in scope["headers"]:
            if name.lower() == b"content-length":
                if not value.isdigit() or len(value) > 18:
                    await _refuse(send, 400, "Content-Length must be a number of bytes.")
                    return
                declared = int(value)
        if declared is not None and declared > limit:
            await _refuse(send, 413, _too_large(declared, limit))
            return

        received = 0
        over = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True  # the app stops reading, as if the client had gone; the 413 is sent below
                    return {"type": "http.disconnect"}
            return message

        async def watching_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, counting_receive, watching_send)
        if over and not started:
            await _refuse(send, 413, _too_large(None, limit))


def _too_large(size: int | None, limit: int) -> str:
    what = f"is {size} bytes" if size is not None else "is over the limit"
    return (f"The request body {what}; the limit is {limit} bytes here. Upload large models with the resumable "
            "upload (/api/v1/uploads/, the CLI and the upload page use it).")


async def _refuse(send: Send, status: int, message: str) -> None:
    # The API's error shape (infra/api_errors.py), which the pages' scripts and the CLI show as well.
    body = json.dumps({"error": {"code": "too_large" if status == 413 else "bad_request", "message": message,
                                 "fields": {}}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
