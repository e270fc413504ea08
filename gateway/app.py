"""The inference gateway: `/serve/{deployment}/v2/...` passes the KServe v2 / Triton HTTP protocol through to the
deployment's current Triton, for API tokens and browser sessions of the deployment's team.

It is a thin ASGI handler in front of Django: measured on one machine, an authenticated DRF request through
Django's ASGI path costs about 6 ms of CPU, a whole proxied request here 0.13 ms (docs/benchmarks.md). It never decodes tensors: bodies are passed through as bytes, streamed when
large, over pooled keep-alive connections. Access decisions are cached for under a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings

from accounts.tokens import parse_bearer
from gateway import stats, upstream
from gateway.access import Access, Caller
from gateway.ratelimit import RateLimiter, retry_after_header
from gateway.upstream import UpstreamError

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
# Loose on purpose: Django's ASGIHandler types its scope as dict and its messages as Mapping, not as above.
ASGIApp = Callable[..., Awaitable[None]]

PREFIX = "/serve/"
# Request headers passed to Triton; everything else (cookies, the bearer token) stays here.
FORWARD_REQUEST_HEADERS = {b"content-type", b"inference-header-content-length", b"content-encoding", b"accept",
                           b"accept-encoding", b"triton-request-id"}
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
STREAM_THRESHOLD = 1024 * 1024  # bodies larger than this are streamed instead of read whole
FLUSH_SECONDS = 5.0


class GatewayError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class Gateway:
    def __init__(self, django_app: ASGIApp) -> None:
        self.django_app = django_app
        self.access = Access(ttl=settings.GATEWAY_CACHE_TTL_SECONDS)
        self.limiter = RateLimiter(settings.GATEWAY_RATE_LIMIT_PER_SECOND, settings.GATEWAY_RATE_LIMIT_BURST)
        self.collector = stats.StatsCollector()
        self.pool = upstream.Pool(max_idle_per_host=settings.GATEWAY_MAX_UPSTREAM_CONNECTIONS)
        self.flusher: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PREFIX):
            await self.serve(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        else:
            await self.django_app(scope, receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def close(self) -> None:
        if self.flusher is not None:
            self.flusher.cancel()
        await self._flush()
        self.pool.close()

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            await self._flush()

    async def _flush(self) -> None:
        buckets = self.collector.take()
        if buckets:
            try:
                await sync_to_async(stats.flush, thread_sensitive=False)(buckets)
            except Exception:
                log.exception("could not write gateway statistics")

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        if self.flusher is None:
            self.flusher = asyncio.get_running_loop().create_task(self._flush_forever())
        name, _, rest = scope["path"][len(PREFIX):].partition("/")
        model = _model_of(rest)
        deployment_id, code = 0, 500
        try:
            headers = _headers(scope)
            caller = await self._caller(scope, headers)
            route = await self.access.routes.get((caller.team_id, name)) if name else None
            if route is None:
                raise GatewayError(404, f"No deployment named {name!r}.")
            deployment_id = route.deployment_id
            if not rest.startswith("v2"):
                raise GatewayError(404, f"Use /serve/{name}/v2/... (the KServe v2 protocol).")
            if caller.token_id is not None:
                wait = self.limiter.check(caller.token_id)
                if wait:
                    raise GatewayError(429, "Too many requests for this API token; slow down.",
                                       {"Retry-After": retry_after_header(wait)})
            if not route.upstream_url:
                raise GatewayError(503, f"Deployment {name!r} is not ready (status: {route.status}).", {"Retry-After": "2"})
            stats.IN_FLIGHT.labels(name).inc()
            try:
                code = await self._proxy(scope, receive, send, headers, route.upstream_url, rest)
            finally:
                stats.IN_FLIGHT.labels(name).dec()
        except GatewayError as exc:
            code = exc.status
            await _send_error(send, exc.status, exc.message, exc.headers)
        finally:
            if deployment_id:
                self.collector.observe(deployment_id, name, model, code, time.perf_counter() - started)

    async def _caller(self, scope: Scope, headers: dict[bytes, bytes]) -> Caller:
        authorization = headers.get(b"authorization")
        if authorization is not None:
            raw = parse_bearer(authorization.decode("latin-1"))
            if raw is None:
                raise GatewayError(401, "Use 'Authorization: Bearer <token>' with a Modelport API token.",
                                   {"WWW-Authenticate": 'Bearer realm="modelport"'})
            caller = await self.access.tokens.get(raw)
            if caller is None:
                raise GatewayError(401, "The API token is invalid, expired or revoked.",
                                   {"WWW-Authenticate": 'Bearer realm="modelport"'})
            return caller
        cookies = _cookies(headers)
        session_key = cookies.get(settings.SESSION_COOKIE_NAME)
        if session_key:
            caller = await self.access.sessions.get(session_key)
            if caller is not None:
                if scope["method"] not in SAFE_METHODS:
                    # A cookie alone must not let another site make the browser run inference.
                    csrf = headers.get(b"x-csrftoken", b"").decode("latin-1")
                    if not csrf or csrf != cookies.get(settings.CSRF_COOKIE_NAME):
                        raise GatewayError(403, "Send the X-CSRFToken header with the csrftoken cookie's value.")
                return caller
        raise GatewayError(401, "Authentication required: send 'Authorization: Bearer <token>'.",
                           {"WWW-Authenticate": 'Bearer realm="modelport"'})

    async def _proxy(self, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, bytes],
                     upstream: str, rest: str) -> int:
        limit = settings.GATEWAY_MAX_BODY_BYTES
        declared = headers.get(b"content-length")
        length = int(declared) if declared and declared.isdigit() else None
        if length is not None and length > limit:
            raise GatewayError(413, f"The request body is {length} bytes; the limit is {limit} bytes.")
        forward = [(k, v) for k, v in headers.items() if k in FORWARD_REQUEST_HEADERS]
        body: bytes | AsyncIterator[bytes] | None
        if length is not None and length <= STREAM_THRESHOLD:
            body = await _read_body(receive, limit)
        elif length is None and scope["method"] in SAFE_METHODS:
            body = None
        else:
            body = _stream_body(receive, limit)
        target = f"/{rest}" + (f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") else "")
        timeout = settings.GATEWAY_UPSTREAM_TIMEOUT_SECONDS
        try:
            async with asyncio.timeout(timeout):
                response = await self.pool.request(scope["method"], upstream, target, forward, body, length)
                if response.content_length is not None:
                    # Small responses (the common case) go out in one message.
                    payload = await response.read()
                    await send({"type": "http.response.start", "status": response.status,
                                "headers": [*response.headers, (b"content-length", str(len(payload)).encode())]})
                    await send({"type": "http.response.body", "body": payload})
                    return response.status
            # A streamed response: the deadline covers its first byte only, then chunks flow as they come.
            await send({"type": "http.response.start", "status": response.status, "headers": response.headers})
            async for chunk in response.iter_body():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return response.status
        except _BodyTooLarge:
            raise GatewayError(413, f"The request body is over the limit of {limit} bytes.") from None
        except TimeoutError:
            raise GatewayError(504, f"Triton did not answer within {timeout:g} s.") from None
        except UpstreamError:
            raise GatewayError(502, "Triton is unreachable; the deployment may be restarting. Retry shortly.",
                               {"Retry-After": "2"}) from None


class _BodyTooLarge(Exception):
    pass


async def _read_body(receive: Receive, limit: int) -> bytes:
    parts = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise GatewayError(499, "The client went away.")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise GatewayError(413, f"The request body is over the limit of {limit} bytes.")
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


async def _stream_body(receive: Receive, limit: int) -> Any:
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge()
        if chunk:
            yield chunk
        if not message.get("more_body"):
            return


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in scope["headers"]}


def _cookies(headers: dict[bytes, bytes]) -> dict[str, str]:
    raw = headers.get(b"cookie")
    if not raw:
        return {}
    jar: SimpleCookie = SimpleCookie()
    with contextlib.suppress(Exception):
        jar.load(raw.decode("latin-1"))
    return {key: morsel.value for key, morsel in jar.items()}


def _model_of(rest: str) -> str:
    parts = rest.split("/")
    return parts[2] if len(parts) > 2 and parts[1] == "models" else ""


async def _send_error(send: Send, status: int, message: str, headers: dict[str, str]) -> None:
    # KServe v2's error shape, which tritonclient shows to its user.
    body = json.dumps({"error": message}).encode()
    out = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    out += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    with contextlib.suppress(Exception):  # the client may be gone already
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": body})
