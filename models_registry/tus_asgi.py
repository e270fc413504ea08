"""`PATCH /api/v1/uploads/<id>` (tus) as a thin ASGI path in front of Django, so that an upload's bytes stream from
the socket into storage and an interrupted request keeps what arrived.

Django's ASGI handler reads a whole request body (into a spooled temporary file) before any view runs, so a 2 GB
PATCH that dropped at 1.9 GB kept nothing. Here everything that needs no body runs exactly as in the Django view
(`tus.UploadDetailView`: the same authenticators, permissions, CSRF check for sessions, and `tus.plan_patch`), in a
worker thread, before a byte is read; then `receive()` messages are gathered into 1 MiB batches and each batch is
written by a storage thread while the next one arrives. What is kept:
- the body ends: the bytes are committed (or, with Upload-Checksum, compared first: 460 and nothing kept);
- the client disconnects, or sends nothing for UPLOAD_IDLE_TIMEOUT_SECONDS (a body shorter than its
  Content-Length): the bytes that arrived are committed and the client resumes with HEAD (a timed-out request is
  answered 408); with Upload-Checksum nothing is kept, since a partial chunk cannot be verified;
- the body is longer than what remains of the upload (chunked encoding has no Content-Length to refuse up front):
  413 and nothing of it is kept.

The event loop never waits on storage or the database; a thread never waits on the network. Memory per request:
two batches, plus an S3 part (8 MiB) on S3.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import io
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.exceptions import DisallowedHost, SuspiciousOperation
from django.core.handlers.asgi import ASGIRequest
from django.db import DatabaseError, close_old_connections, connections
from django.http import HttpResponse, HttpResponseBase
from rest_framework.request import Request

from models_registry import tus, uploads
from models_registry.storage import Appender, get_store

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]
T = TypeVar("T")

PATCH_PATH = re.compile(r"/api/v1/uploads/([^/]+)/?")
BATCH_BYTES = 1024 * 1024
# The claim on an upload is a lease renewed while bytes flow, so that a web process that dies mid-request frees
# the upload for the client's retry within minutes, not after the hour the Django view's claim lasts. It outlasts
# the longest wait for a message (UPLOAD_IDLE_TIMEOUT_SECONDS) with room to spare.
MIN_CLAIM_LEASE = timedelta(minutes=2)
RENEW_EVERY_SECONDS = 30.0


def claim_lease() -> timedelta:
    return max(MIN_CLAIM_LEASE, timedelta(seconds=2 * settings.UPLOAD_IDLE_TIMEOUT_SECONDS + RENEW_EVERY_SECONDS))

# Storage writes only: they never wait on the network, so a few threads serve many uploads. Apart from the
# default executor, which the gateway's database lookups use.
_storage_threads = ThreadPoolExecutor(max_workers=8, thread_name_prefix="tus-storage")


class Outcome(enum.Enum):
    COMPLETE = "the body arrived whole"
    DISCONNECT = "the client went away"
    TIMEOUT = "the body stopped arriving"
    TOO_LONG = "the body is longer than what remains"
    CLAIM_LOST = "the claim on the upload was lost"


@dataclass
class _Patch:
    view: tus.UploadDetailView
    request: Request
    plan: tus.PatchPlan
    token: datetime  # the claim


class TusPatchRoute:
    """ASGI middleware: the tus PATCH path here, everything else to `app`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "PATCH":
            match = PATCH_PATH.fullmatch(scope["path"])
            if match is not None:
                await handle_patch(scope, receive, send, match.group(1))
                return
        await self.app(scope, receive, send)


async def handle_patch(scope: Scope, receive: Receive, send: Send, upload_id: str) -> None:
    try:
        prepared = await _in_thread(_prepare, scope, upload_id)
        if isinstance(prepared, HttpResponseBase):
            # Refused before reading the body: whatever the client still sends is not read, so do not keep the
            # connection for a next request.
            await _send(send, prepared, close=True)
            return
        response, close = await _stream(prepared, receive)
    except DatabaseError:
        log.exception("tus PATCH: database error")
        response, close = tus.problem(503, "The database is unavailable; retry shortly (send HEAD first)."), True
        response["Retry-After"] = "5"
    except DisallowedHost:
        response, close = tus.problem(400, "The Host header names no host this portal serves."), True
    except SuspiciousOperation:
        response, close = tus.problem(400, "The request is malformed."), True
    except Exception:
        # Storage failing (a full disk, S3 down): a server fault, and the client's retry is the remedy.
        log.exception("tus PATCH of %s failed", upload_id)
        response, close = tus.problem(503, "The chunk could not be stored; nothing of it was kept. Retry shortly "
                                           "(send HEAD first)."), True
        response["Retry-After"] = "5"
    if response is not None:
        await _send(send, response, close=close)


async def _in_thread(func: Callable[..., T], *args: Any) -> T:
    """Database work: in the default executor (as the gateway's), opening or refreshing this thread's connection."""

    def call() -> T:
        close_old_connections()
        return func(*args)

    return await sync_to_async(call, thread_sensitive=False)()


def _session_and_user(request: ASGIRequest) -> None:
    """What SessionMiddleware and AuthenticationMiddleware give the Django view: request.session, request.user."""

    def unused(request: Any) -> Any:
        raise AssertionError("not called")

    SessionMiddleware(unused).process_request(request)
    AuthenticationMiddleware(unused).process_request(request)


def _prepare(scope: Scope, upload_id: str) -> _Patch | HttpResponseBase:
    """Everything before the body, exactly as the Django view does it (DRF's dispatch up to the handler), and the
    claim. A response when the request is refused."""
    django_request = ASGIRequest(scope, io.BytesIO())  # type: ignore[arg-type]
    django_request.get_host()  # ALLOWED_HOSTS, as CommonMiddleware checks it for every other request
    _session_and_user(django_request)
    view = tus.UploadDetailView()
    view.setup(django_request, upload_id=upload_id)
    view.args, view.kwargs = (), {"upload_id": upload_id}
    request = view.initialize_request(django_request, upload_id=upload_id)
    view.request = request
    view.headers = view.default_response_headers
    try:
        view.initial(request, upload_id=upload_id)
        plan = tus.plan_patch(request, upload_id)
        token = uploads.claim(plan.upload, plan.offset, claim_lease())
    except Exception as exc:
        return _finalize(view, request, view.handle_exception(exc))  # re-raises what is not the client's fault
    return _Patch(view=view, request=request, plan=plan, token=token)


def _finalize(view: tus.UploadDetailView, request: Request, response: Any) -> HttpResponseBase:
    finalized = view.finalize_response(request, response, upload_id=view.kwargs["upload_id"])
    if hasattr(finalized, "render"):
        finalized.render()
    return finalized  # type: ignore[no-any-return]


async def _storage(func: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_storage_threads, func, *args)


def _write(appender: Appender, hasher: Any, data: bytearray) -> None:
    if hasher is not None:
        hasher.update(data)  # releases the GIL for large buffers, like the write
    appender.write(data)


async def _stream(patch: _Patch, receive: Receive) -> tuple[HttpResponseBase | None, bool]:
    """Receive the body into storage; the response to send (None when the client is gone) and whether to close."""
    plan = patch.plan
    upload = plan.upload
    limit = plan.content_length if plan.content_length is not None else plan.remaining
    idle = float(settings.UPLOAD_IDLE_TIMEOUT_SECONDS)
    try:
        appender = await _storage(get_store().open_append, upload.key, upload.storage_state, plan.offset)
    except BaseException:
        await _in_thread(uploads.release, upload, patch.token)
        raise
    hasher = hashlib.sha256() if plan.checksum is not None else None
    batch = bytearray()
    received = 0
    pending: Future[None] | None = None  # the batch being written while the next one arrives
    renew_at = time.monotonic() + RENEW_EVERY_SECONDS
    outcome = Outcome.COMPLETE
    try:
        while True:
            try:
                async with asyncio.timeout(idle):
                    message = await receive()
            except TimeoutError:
                outcome = Outcome.TIMEOUT
                break
            if message["type"] == "http.disconnect":
                outcome = Outcome.DISCONNECT
                break
            body = message.get("body", b"")
            if received + len(body) > limit:
                outcome = Outcome.TOO_LONG
                break
            received += len(body)
            batch += body
            more = bool(message.get("more_body"))
            if len(batch) >= BATCH_BYTES or (batch and not more):
                if pending is not None:
                    await asyncio.wrap_future(pending)
                pending = _storage_threads.submit(_write, appender, hasher, batch)
                batch = bytearray()
            if time.monotonic() >= renew_at:
                renewed = await _in_thread(uploads.renew_claim, upload, patch.token, claim_lease())
                if renewed is None:
                    outcome = Outcome.CLAIM_LOST
                    break
                patch.token, renew_at = renewed, time.monotonic() + RENEW_EVERY_SECONDS
            if not more:
                break
        if outcome in (Outcome.DISCONNECT, Outcome.TIMEOUT) and batch:
            if pending is not None:
                await asyncio.wrap_future(pending)
            pending = _storage_threads.submit(_write, appender, hasher, batch)
        if pending is not None:
            await asyncio.wrap_future(pending)
    except BaseException:
        # A storage error, or the server cancelling the request: drop this attempt, keep the upload as it was.
        # Not awaited: a cancelled task must not wait, and the claim's release must happen anyway.
        _storage_threads.submit(_abandon, patch, appender, pending)
        raise
    digest = hasher.digest() if hasher is not None else None
    return await _in_thread(_finish, patch, appender, outcome, digest)


def _abandon(patch: _Patch, appender: Appender, pending: Future[None] | None) -> None:
    try:
        if pending is not None:
            pending.exception()  # wait for the write in flight: it uses the appender
        appender.abort()
    finally:
        close_old_connections()
        try:
            uploads.release(patch.plan.upload, patch.token)
        finally:
            # The only database work of a storage thread: do not keep an idle session open for each of them for
            # the process' lifetime (nor, in one long test run, on the test database when it is dropped).
            connections.close_all()


def _finish(patch: _Patch, appender: Appender, outcome: Outcome,
            digest: bytes | None) -> tuple[HttpResponseBase | None, bool]:
    try:
        return _conclude(patch, appender, outcome, digest)
    except BaseException:
        uploads.release(patch.plan.upload, patch.token)  # a no-op when the claim was already given up
        raise


def _conclude(patch: _Patch, appender: Appender, outcome: Outcome,
              digest: bytes | None) -> tuple[HttpResponseBase | None, bool]:
    plan = patch.plan
    upload = plan.upload
    old_state = upload.storage_state
    if outcome in (Outcome.TOO_LONG, Outcome.CLAIM_LOST):
        appender.abort()
        uploads.discard_chunk(upload, old_state, None, patch.token)
        if outcome == Outcome.CLAIM_LOST:
            return tus.problem(409, "Another request took over this upload; send HEAD and resume."), True
        return tus.problem(413, f"The body is longer than the {plan.remaining} bytes that remain in this upload; "
                                "nothing of it was kept."), True
    written, new_state = appender.close()
    if plan.checksum is not None and (outcome != Outcome.COMPLETE or digest != plan.checksum):
        uploads.discard_chunk(upload, old_state, new_state, patch.token)
        if outcome == Outcome.COMPLETE:
            return tus.problem(460, "Checksum mismatch: the chunk's sha256 differs from Upload-Checksum; it was "
                                    "discarded."), False
        if outcome == Outcome.TIMEOUT:
            return tus.problem(408, f"No data for {settings.UPLOAD_IDLE_TIMEOUT_SECONDS} s; a chunk with "
                                    "Upload-Checksum is kept whole or not at all, so nothing of it was kept."), True
        return None, True
    try:
        upload = uploads.commit_chunk(upload, plan.offset, written, old_state, new_state, patch.token)
    except uploads.UploadProblem as exc:
        return tus.problem(exc.status, exc.message), True
    log.info("tus PATCH of %s: %s, %s bytes kept, offset %s of %s", upload.pk, outcome.value, written,
             upload.offset, upload.length)
    if outcome == Outcome.COMPLETE:
        return _finalize(patch.view, patch.request, tus.patched(upload)), False
    if outcome == Outcome.TIMEOUT:
        response = tus.problem(408, f"No data for {settings.UPLOAD_IDLE_TIMEOUT_SECONDS} s: the {written} bytes "
                                    f"that arrived were kept; resume from offset {upload.offset}.")
        response["Upload-Offset"] = str(upload.offset)
        return response, True
    return None, True


async def _send(send: Send, response: HttpResponseBase, *, close: bool) -> None:
    body = response.content if isinstance(response, HttpResponse) else b""
    headers = [(key.encode("latin-1"), value.encode("latin-1")) for key, value in response.items()
               if key.lower() != "content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
