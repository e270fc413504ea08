"""The inference gateway: `/serve/{deployment}/v2/...` passes the KServe v2 inference protocol through to the
deployment's current Triton, for API tokens and browser sessions of the deployment's team.

It is a thin ASGI handler in front of Django: measured on one machine, an authenticated DRF request through
Django's ASGI path costs about 6 ms of CPU, a whole proxied request here 0.13 ms (docs/benchmarks.md). It never
decodes tensors: bodies are passed through as bytes over pooled keep-alive connections, and only the JSON header
of an inference request is parsed, to refuse what would crash Triton. Access decisions are cached for under a
second.

The order of checks is the order of cost: the declared body size and the request target (no lookup), the caller
(cached), the deployment (cached), the endpoint (gateway/protocol.py), the rate limit, then the body.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any, Protocol
from urllib.parse import quote, unquote

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, InterfaceError

from accounts.tokens import parse_bearer
from gateway import (
    admission,
    answer_params,
    bodies,
    events,
    not_found,
    pool_names,
    protocol,
    scale_from_zero,
    stats,
    traced,
    upstream,
)
from gateway import contract as contracts
from gateway.access import Access, Caller, Choice, Route
from gateway.cold_start import ColdStarts
from gateway.fastpath import json_body, reference
from gateway.openai import handler as openai_api
from gateway.protocol import Endpoint, Refusal
from gateway.ratelimit import RateLimiter
from gateway.stream_figures import StreamFigures
from gateway.stream_slots import StreamSlots
from gateway.upstream import ResponseTooLarge, UpstreamError
from infra import tracing
from infra.heap import freeze_startup_objects

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
# Loose on purpose: Django's ASGIHandler types its scope as dict and its messages as Mapping, not as above.
ASGIApp = Callable[..., Awaitable[None]]

PREFIX = "/serve/"
RAW_PREFIX = PREFIX.encode()
# Request headers passed to Triton; everything else (cookies, the bearer token) stays here.
FORWARD_REQUEST_HEADERS = {b"content-type", b"inference-header-content-length", b"accept", b"accept-encoding",
                           b"triton-request-id"}
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
_TRANSCODED_HEADERS = {b"content-type", b"inference-header-content-length"}
STREAM_THRESHOLD = 1024 * 1024  # bodies larger than this are streamed instead of read whole
# A pool's answers larger than this are renamed off the event loop: simdjson reads about 1 MB per millisecond here,
# so this keeps the loop's pauses near a millisecond (bench/json_path.py).
THREAD_PARSE_BYTES = 1024 * 1024
# A pool's answers other than inference ones (errors, metadata, config, statistics) are parsed to be renamed: this
# bounds them (the statistics of a pool of a thousand models are a few MB).
POOL_ANSWER_MAX_BYTES = 16 * 1024 * 1024
FLUSH_SECONDS = 5.0
# Keeps the authentication answers from revealing anything to a caller who is not sending a token at all.
UNAUTHORIZED = {"WWW-Authenticate": 'Bearer realm="modelport"'}


class GatewayError(Refusal):
    pass


class Gateway:
    def __init__(self, django_app: ASGIApp) -> None:
        self.django_app = django_app
        self.access = Access(ttl=settings.GATEWAY_CACHE_TTL_SECONDS)
        self.limiter = RateLimiter(settings.GATEWAY_RATE_LIMIT_PER_SECOND, settings.GATEWAY_RATE_LIMIT_BURST,
                                   redis_url=settings.REDIS_URL)
        self.collector = stats.StatsCollector()
        self.pool = upstream.Pool(max_idle_per_host=settings.GATEWAY_MAX_UPSTREAM_CONNECTIONS)
        self.max_body = settings.GATEWAY_MAX_BODY_BYTES
        self.max_response = settings.GATEWAY_MAX_RESPONSE_BYTES
        self.max_tensor = settings.GATEWAY_MAX_TENSOR_BYTES
        self.max_depth = settings.GATEWAY_MAX_JSON_DEPTH
        # The JSON fast path (gateway/fastpath/), or with GATEWAY_JSON_FAST_PATH off its plain reference: json.loads,
        # nothing transcoded, no header kept.
        self.fast_path = settings.GATEWAY_JSON_FAST_PATH
        self.check_json = json_body.check_json if self.fast_path else reference.check_json
        self.transcode = settings.GATEWAY_TRANSCODE_JSON and self.fast_path
        # What a body may cost (gateway/bodies.py, docs/security.md "What a request body costs").
        self.max_json = min(settings.GATEWAY_MAX_JSON_BYTES, self.max_body)
        self.max_pool_json = settings.GATEWAY_MAX_POOL_JSON_BYTES
        self.max_inflate_ratio = settings.GATEWAY_MAX_INFLATE_RATIO
        self.parse_budget = bodies.ByteBudget(max(settings.GATEWAY_JSON_PARSE_BYTES_IN_FLIGHT, self.max_json))
        self.body_threads = bodies.inflate_threads()
        self.parsers = bodies.Parsers(settings.GATEWAY_JSON_PARSE_PROCESSES, self.body_threads)
        self.header_checks = json_body.HeaderChecks(self.max_depth, self.max_tensor)
        self.timeout = settings.GATEWAY_UPSTREAM_TIMEOUT_SECONDS
        # Shared with the other processes through the rate limiter's Redis (gateway/stream_slots.py).
        self.streams = StreamSlots(settings.GATEWAY_MAX_STREAMS_PER_TEAM, redis_url=settings.REDIS_URL)
        self.stream_limits = events.Limits(max_event_bytes=self.max_response,
                                           idle_seconds=settings.GATEWAY_STREAM_IDLE_SECONDS,
                                           max_seconds=settings.GATEWAY_MAX_STREAM_SECONDS,
                                           max_bytes=settings.GATEWAY_MAX_STREAM_BYTES,
                                           send_seconds=settings.GATEWAY_STREAM_SEND_SECONDS)
        self.flusher: asyncio.Task[None] | None = None
        self.cold_starts = ColdStarts()  # held first requests to idle-unloaded pool revisions
        self.wakes = scale_from_zero.Wakes()  # held requests to dedicated deployments scaled to zero

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
                # The server is about to serve: what it was built with stays out of the garbage collector's full
                # collections, which paused every request in flight to scan it (infra/heap.py). The portal's URLconf
                # and the views it names first: imported by the first page or API call otherwise, they were 21,000
                # objects that every later full collection scanned (10 to 33 ms with every stream in flight waiting,
                # at 32 streams: docs/benchmarks.md, "Streaming").
                load_portal_urls()
                freeze_startup_objects()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def close(self) -> None:
        if self.flusher is not None:
            self.flusher.cancel()
        await self._flush()
        await self.limiter.close()
        await self.streams.close()
        self.pool.close()
        self.cold_starts.close()
        self.wakes.close()
        self.parsers.close()
        self.body_threads.shutdown(wait=False, cancel_futures=True)

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
        if tracing.tracer is not None:  # the whole cost of tracing while it is off (infra/tracing.py)
            await traced.serve(tracing.tracer, self._serve, scope, receive, send)
        else:
            await self._serve(scope, receive, send, None)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, span: traced.Span | None) -> None:
        started = time.perf_counter()
        if self.flusher is None:
            self.flusher = asyncio.get_running_loop().create_task(self._flush_forever())
        caller: Caller | None = None
        route: Route | None = None
        endpoint: Endpoint | None = None
        choice: Choice | None = None
        woken = ""  # the upstream a request was held for (a revision that scales to zero)
        code = 500
        out = send
        openai = openai_api.Outcome(arrived=started)
        try:
            headers = _headers(scope)
            declared = _content_length(headers)
            if declared is not None and declared > self.max_body:
                raise GatewayError(413, f"The request body is {declared} bytes; the limit is {self.max_body} bytes.")
            path: str = scope["path"]
            # The upstream request target is built from the raw path, never from the decoded one: decoded,
            # `%20HTTP/1.1%0D%0A...` would end the request line and smuggle a second request into a pooled
            # connection (issue 12).
            raw_path: bytes = scope.get("raw_path") or quote(path, safe="/:@!$&'()*+,;=~").encode()
            query: bytes = scope.get("query_string") or b""
            protocol.check_target(raw_path, path, query)
            if not raw_path.startswith(RAW_PREFIX):
                raise GatewayError(400, "Do not percent-encode the /serve/ prefix.")
            raw_name, _, raw_rest = raw_path[len(RAW_PREFIX):].partition(b"/")
            name = unquote(raw_name.decode("ascii"))
            rest = "/" + raw_rest.decode("ascii")
            caller = await self._caller(scope, headers)
            route = await self.access.routes.get((caller.team_id, name)) if name else None
            if route is None:
                raise not_found.no_deployment(name, caller.team_name)
            if raw_rest.startswith(b"v1/"):  # the OpenAI-compatible API (gateway/openai/)
                code = await openai_api.serve(self, scope, receive, send, headers, declared, caller, route, raw_rest,
                                              openai)
                return
            if not raw_rest.startswith(b"v2"):
                raise GatewayError(404, f"Use /serve/{name}/v2/... (the KServe v2 protocol), or /serve/{name}/v1/... "
                                        "(the OpenAI-compatible API).")
            endpoint = protocol.classify(scope["method"], rest)
            pinned = headers.get(b"modelport-revision")
            admitted = admission.admit(self.limiter, caller, route, endpoint.model,
                                       pinned.decode("latin-1") if pinned is not None else None)
            choice = admitted.choice
            if choice is not None:
                out = _with_revision(send, choice.revision)  # a refusal after the choice names it too
            choice, pooled = admitted.taken()
            if pooled is not None:
                if endpoint.kind == "health" and rest.endswith("/ready") and pooled.load_id is not None:
                    code = await self._pooled_ready(out, choice.upstream, pooled)
                    return
                raw_rest = await self.into_pool(route, pooled, caller, raw_rest, endpoint)
            else:
                # Scaled to zero: held (its body unread) until a pod of the revision is ready.
                woken = await scale_from_zero.wake(self.wakes, route, choice, caller.team_id)
            target = raw_rest if not query else raw_rest + b"?" + query
            in_flight = self.collector.in_flight(route.team, route.name)
            in_flight.inc()
            try:
                contract = admission.contract(route, choice, endpoint.model, endpoint.kind)
                prefix = pooled.prefix if pooled is not None else ""
                if endpoint.kind != "generate_stream":
                    code = await self._proxy(scope, receive, out, headers, declared, choice.upstream,
                                             b"/" + target, endpoint, contract, prefix)
                else:
                    with self.streams.hold(caller.team_id, caller.team_name):
                        figures = functools.partial(self.collector.stream, route.deployment_id, route.team,
                                                    route.name, choice.revision, started,
                                                    model=_model_label(route, endpoint))
                        code = await self._proxy(scope, receive, out, headers, declared, choice.upstream,
                                                 b"/" + target, endpoint, contract, prefix, figures)
            finally:
                in_flight.dec()
            if woken and code < 500:
                self.wakes.answered(woken)  # its Triton answered: the next request need not ask whether it is up
        except Refusal as exc:
            code = exc.status
            if woken and exc.status == 502:
                self.wakes.lost(woken)  # unreachable (scaled to zero again): the next request is held
            if openai_api.is_openai_path(scope["path"]):
                await openai_api.send_error(out, openai_api.from_refusal(exc))
            else:
                await _send_error(out, exc.status, exc.message, exc.headers)
        except (DatabaseError, InterfaceError):
            # Only when nothing is cached for this caller or route (cached answers stand in, gateway/access.py).
            log.warning("gateway: the database is unreachable", exc_info=True)
            code = 503
            await _send_error(send, 503, "The portal's database is unreachable; retry shortly.", {"Retry-After": "5"})
        finally:
            if openai.endpoint is not None:
                endpoint, choice = openai.endpoint, openai.choice
            if route is not None:
                self.collector.observe(route.deployment_id, route.team, route.name, _model_label(route, endpoint), code,
                                       time.perf_counter() - started, choice.revision if choice else 0)
            if span is not None:
                traced.describe(span, scope["method"], caller, route, endpoint, choice,
                                _model_label(route, endpoint) if route is not None else "", code)

    async def into_pool(self, route: Route, pooled: pool_names.Pooled, caller: Caller, raw_rest: bytes,
                        endpoint: Endpoint) -> bytes:
        """The upstream target of a request to a shared deployment's pool: its models' pool names, once its revision
        is loaded (an idle-unloaded one is woken while the request is held)."""
        if pooled.load_id is None:
            # Shared by its spec, with no load: never the unmapped way (other teams' models are there).
            raise GatewayError(503, f"Deployment {route.name!r} has no models loaded in its pool (it is "
                                    "restarting); retry in a few seconds.", {"Retry-After": "5"})
        await admission.cold_start(self.cold_starts, self.access.routes, route, pooled, caller)
        return pool_names.upstream_target(raw_rest, endpoint, pooled.prefix)

    async def read_json(self, receive: Receive, headers: dict[bytes, bytes], declared: int | None) -> bytes:
        """A JSON request body bounded and checked as a generate request's (size, depth); a shared pool's bound is
        the caller's to check once the pool is known (check_pool_json)."""
        return await self._generate_body(receive, headers, declared, "")

    def check_pool_json(self, pool_prefix: str, json_bytes: int) -> None:
        self._check_pool_json(pool_prefix, json_bytes)

    async def _pooled_ready(self, send: Send, upstream_url: str, pooled: pool_names.Pooled) -> int:
        """/v2/health/ready of a shared deployment: its own models' readiness in the pool (Triton's per-model ready),
        never the pool server's, which another team's model loading or failed would make 400 (issue 30). An idle one
        is ready without being woken: a request is held while it loads (pool_names.ready_answer)."""
        ready: list[bool] = []
        if pooled.loaded:
            ready = list(await asyncio.gather(*(self._model_ready(upstream_url, name)
                                                 for name in pool_names.ready_names(pooled))))
        status = 200 if pool_names.ready_answer(pooled, ready) else 400  # Triton's answers, empty bodies
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return status

    async def _model_ready(self, upstream_url: str, name: str) -> bool:
        response = None
        try:
            async with asyncio.timeout(self.timeout):
                response = await self.pool.request("GET", upstream_url, f"/v2/models/{name}/ready".encode("ascii"),
                                                   [], None, None)
                await response.read(64 * 1024)
                return response.status == 200
        except (TimeoutError, UpstreamError):
            return False
        finally:
            if response is not None:
                response.close()

    async def _caller(self, scope: Scope, headers: dict[bytes, bytes]) -> Caller:
        authorization = headers.get(b"authorization")
        if authorization is not None:
            raw = parse_bearer(authorization.decode("latin-1"))
            if raw is None:
                raise GatewayError(401, "Use 'Authorization: Bearer <token>' with a Modelport API token.",
                                   UNAUTHORIZED)
            caller = await self.access.token(raw)
            if caller is None:
                raise GatewayError(401, "The API token is invalid, expired or revoked.", UNAUTHORIZED)
            return caller
        cookies = _cookies(headers)
        session_key = cookies.get(settings.SESSION_COOKIE_NAME)
        if session_key:
            caller = await self.access.session(session_key)
            if caller is not None:
                if scope["method"] not in SAFE_METHODS:
                    # A cookie alone must not let another site make the browser run inference.
                    csrf = headers.get(b"x-csrftoken", b"").decode("latin-1")
                    if not csrf or csrf != cookies.get(settings.CSRF_COOKIE_NAME):
                        raise GatewayError(403, "Send the X-CSRFToken header with the csrftoken cookie's value.")
                return caller
        raise GatewayError(401, "Authentication required: send 'Authorization: Bearer <token>'.", UNAUTHORIZED)

    async def _proxy(self, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, bytes],
                     declared: int | None, upstream_url: str, target: bytes, endpoint: Endpoint,
                     contract: contracts.Contract | None = None, pool_prefix: str = "",
                     figures: Callable[[], StreamFigures] | None = None) -> int:
        """`figures`: a stream's figures, made when Triton's answer is a stream (gateway/stream_figures.py)."""
        method = scope["method"]
        forward = [(k, v) for k, v in headers.items() if k in FORWARD_REQUEST_HEADERS
                   and not (pool_prefix and k == b"accept-encoding")]  # a pool's answers are renamed: uncompressed
        body: bytes | AsyncIterator[bytes] | None = None
        length: int | None = None
        requested: tuple[str, ...] | None = None
        transcoded: int | None = None
        # A HEAD goes to Triton as a GET (Triton answers HEAD with a 405 and a body); the body is dropped here.
        upstream_method = "GET" if method == "HEAD" else method
        response: Answer | None = None
        streaming = False
        try:
            if endpoint.kind == "infer":
                body, length, transcoded, requested = await self._infer_body(receive, headers, declared, pool_prefix)
            elif endpoint.kind in protocol.GENERATE_KINDS:
                body = await self._generate_body(receive, headers, declared, pool_prefix)
                length = len(body)
                # Plain JSON in, and answers as Triton writes them: events are read one by one (never compressed).
                forward = [(k, v) for k, v in forward if k not in (b"content-type", b"accept-encoding")]
                forward.append((b"content-type", b"application/json"))
            if transcoded is not None:
                # A JSON request sent on as the binary tensor extension (gateway/fastpath/json_body.py).
                forward = [(k, v) for k, v in forward if k not in _TRANSCODED_HEADERS]
                forward += [(b"content-type", b"application/octet-stream"),
                            (b"inference-header-content-length", b"%d" % transcoded)]
            async with asyncio.timeout(self.timeout):
                response = await self.pool.request(upstream_method, upstream_url, target, forward, body, length)
                size = response.content_length
                if method == "HEAD":
                    payload = await response.read(self.max_response)
                    await send({"type": "http.response.start", "status": response.status,
                                "headers": [*response.headers, (b"content-length", b"%d" % len(payload))]})
                    await send({"type": "http.response.body", "body": b""})
                    return response.status
                if endpoint.kind == "generate_stream" and response.status == 200 and _is_event_stream(response):
                    streaming = True  # relayed below, each event as it comes: the deadline covered the head only
                elif pool_prefix and (endpoint.kind not in _ANSWER_KINDS or response.status >= 400):
                    # Errors, metadata, config, statistics: small, read within a bound and renamed whole.
                    return await self._send_renamed(response, send, endpoint, pool_prefix, (contract, requested))
                elif pool_prefix:
                    # An inference answer of any size: only its first bytes are renamed, the rest goes as it comes.
                    response = await _renamed_head(response, pool_prefix, self.max_response, self.timeout)
                    size = response.content_length
                if not streaming and size is not None and size <= STREAM_THRESHOLD:
                    # Small responses (the common case) go out in one message.
                    payload = await response.read(self.max_response)
                    status = response.status
                    response_headers = response.headers
                    if endpoint.kind == "infer":
                        status, response_headers, payload = _checked(status, response_headers, payload, contract,
                                                                     requested)
                    elif endpoint.kind == "generate":
                        status, response_headers, payload = _generated(status, response_headers, payload, contract)
                    await send({"type": "http.response.start", "status": status,
                                "headers": [*response_headers, (b"content-length", b"%d" % len(payload))]})
                    await send({"type": "http.response.body", "body": payload})
                    return status
                if not streaming and size is not None and size > self.max_response:
                    raise ResponseTooLarge(f"{size} bytes")
            if streaming:
                return await events.relay(response, receive, send, self.stream_limits, contract, pool_prefix,
                                          figures() if figures is not None else None)
            # A large or streamed response: the deadline covered its head; now each read has its own.
            checking: _Judge | None = None
            if endpoint.kind == "infer":
                checking = lambda s, h, p: _checked(s, h, p, contract, requested)  # noqa: E731
            elif endpoint.kind in protocol.GENERATE_KINDS:
                checking = lambda s, h, p: _generated(s, h, p, contract)  # noqa: E731
            return await self._stream_response(response, receive, send, checking)
        except ResponseTooLarge:
            raise GatewayError(502, f"Triton's answer is over the gateway's limit of {self.max_response} bytes "
                                    "(GATEWAY_MAX_RESPONSE_BYTES); ask for less per request.") from None
        except _BodyTooLarge:
            raise GatewayError(413, f"The request body is over the limit of {self.max_body} bytes.") from None
        except _ClientGone:
            return 499
        except TimeoutError:
            raise GatewayError(504, f"Triton did not answer within {self.timeout:g} s.") from None
        except UpstreamError as exc:
            log.info("upstream %s failed: %s", upstream_url, exc)
            raise GatewayError(502, "Triton is unreachable or broke the connection; the deployment may be "
                                    "restarting. Retry shortly.", {"Retry-After": "2"}) from None
        finally:
            if response is not None:
                response.close()  # a no-op after a complete read; otherwise the connection is dropped, not pooled

    async def _send_renamed(self, response: Answer, send: Send, endpoint: Endpoint, prefix: str,
                            checking: tuple[contracts.Contract | None, tuple[str, ...] | None]) -> int:
        """A pool's small answer (an error, metadata, config, statistics) with the caller's names, read whole
        within POOL_ANSWER_MAX_BYTES and parsed off the event loop when large."""
        payload = await response.read(min(self.max_response, POOL_ANSWER_MAX_BYTES))
        headers = [(k, v) for k, v in response.headers if k != b"inference-header-content-length"]
        given = dict(response.headers).get(b"inference-header-content-length")
        length = int(given) if given is not None and given.isdigit() and len(given) <= 18 else None
        status = response.status
        if _has(response.headers, b"content-encoding"):
            # Never asked for (accept-encoding is not forwarded): unfiltered statistics would name every model.
            raise GatewayError(502, "The pool's Triton answered compressed; retry without Accept-Encoding.")
        if len(payload) > THREAD_PARSE_BYTES:
            payload, length = await asyncio.to_thread(pool_names.rewrite_response, endpoint, payload, length, prefix)
        else:
            payload, length = pool_names.rewrite_response(endpoint, payload, length, prefix)
        if length is not None:
            headers.append((b"inference-header-content-length", b"%d" % length))
        if endpoint.kind == "infer":  # after the renaming: the caller's names, the caller's words
            status, headers, payload = _checked(status, headers, payload, *checking)
        elif endpoint.kind in protocol.GENERATE_KINDS:
            status, headers, payload = _generated(status, headers, payload, checking[0])
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"content-length", b"%d" % len(payload))]})
        await send({"type": "http.response.body", "body": payload})
        return status

    async def _stream_response(self, response: Answer, receive: Receive, send: Send,
                               checking: _Judge | None = None) -> int:
        """Relay a large or chunked response piece by piece, within GATEWAY_MAX_RESPONSE_BYTES. A chunked one
        that ends within STREAM_THRESHOLD is sent whole, so that its size can still be refused with a 502."""
        pieces = response.iter_body(self.max_response, idle_timeout=self.timeout)
        buffered: list[bytes] = []
        size = 0
        if response.content_length is None:
            async for piece in pieces:
                buffered.append(piece)
                size += len(piece)
                if size > STREAM_THRESHOLD:
                    break
            else:
                payload = b"".join(buffered)
                status, headers = response.status, response.headers
                if checking is not None:  # Triton answers chunked too: a whole small answer is checked alike
                    status, headers, payload = checking(status, headers, payload)
                await send({"type": "http.response.start", "status": status,
                            "headers": [*headers, (b"content-length", b"%d" % len(payload))]})
                await send({"type": "http.response.body", "body": payload})
                return status
        out = list(response.headers)
        if response.content_length is not None:
            out.append((b"content-length", b"%d" % response.content_length))
        # ASGI servers drop what is sent after a disconnect without telling: watch for it, and stop reading
        # Triton's answer (the connection is then closed, not pooled).
        gone = asyncio.ensure_future(_wait_for_disconnect(receive))
        try:
            await send({"type": "http.response.start", "status": response.status, "headers": out})
            for piece in buffered:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            try:
                async for piece in pieces:
                    if gone.done():
                        raise _ClientGone()
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
            except (UpstreamError, TimeoutError) as exc:
                # Too late for an error status: end the connection so that the client sees an incomplete answer.
                log.warning("aborted a streamed response from upstream: %r", exc)
                return 502
            await send({"type": "http.response.body", "body": b""})
            return response.status
        except OSError:
            raise _ClientGone() from None  # a server that does raise on sending to a closed connection
        finally:
            gone.cancel()
            await pieces.aclose()

    async def _infer_body(self, receive: Receive, headers: dict[bytes, bytes], declared: int | None,
                          pool_prefix: str = ""
                          ) -> tuple[bytes | AsyncIterator[bytes], int | None, int | None, tuple[str, ...] | None]:
        """The body of an inference request, checked (gateway/protocol.py) before anything reaches Triton:
        bytes, or for a large binary request the JSON header read and checked and the rest streamed; when a
        JSON request was transcoded to the binary tensor extension, the length of its new JSON header; and the
        outputs it asks for (None: all of them). What it may cost: gateway/bodies.py."""
        header_length = _header_length(headers)
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding not in (b"identity", b"gzip", b"deflate"):
            raise GatewayError(415, "Content-Encoding must be gzip, deflate or none.")
        # JSON has its own, lower cap, refused before a byte of it is read where the headers tell its size.
        if header_length is not None and header_length > self.max_json:
            raise bodies.json_too_large(header_length, self.max_json)
        json_only = header_length is None
        if json_only and encoding == b"identity" and declared is not None and declared > self.max_json:
            raise bodies.json_too_large(declared, self.max_json)
        if encoding == b"identity" and header_length and declared is not None and declared > STREAM_THRESHOLD:
            # A large binary request: read only up to the end of its JSON header, stream the tensors after it.
            prefix = await _read_prefix(receive, header_length, self.max_body)
            checked = await self._check(prefix[:header_length], header_length, declared)
            self._check_pool_json(pool_prefix, header_length)
            return _prepend(prefix, _stream_body(receive, declared - len(prefix))), declared, None, checked.outputs
        limit = self.max_json if json_only else self.max_body
        if encoding == b"identity":
            body = await _read_body(receive, limit, json_only)
        else:
            # Triton would inflate it without a limit; inflate it here as it comes, and send it plain.
            inflater = bodies.Inflater(limit, self.max_inflate_ratio,
                                       _json_inflates_too_large if json_only else _inflates_too_large)
            body = await bodies.read_inflated(receive, inflater, self.max_body, self.body_threads)
        checked = await self._check(body[:header_length] if header_length is not None else body, header_length,
                                    len(body))
        if checked.body is not None:
            self._check_pool_json(pool_prefix, checked.header_length)
            return checked.body, len(checked.body), checked.header_length, checked.outputs
        self._check_pool_json(pool_prefix, len(body) if header_length is None else header_length)
        return body, len(body), None, checked.outputs

    async def _generate_body(self, receive: Receive, headers: dict[bytes, bytes], declared: int | None,
                             pool_prefix: str) -> bytes:
        """The body of a generate request (a JSON object of input names to values), read within the JSON limit and
        checked for depth: Triton parses it whole, as it does an inference request's JSON, so a shared pool's Triton
        gets as little of it as of an inference's, and a large one is parsed off the event loop as theirs are."""
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding != b"identity":
            raise GatewayError(415, "A generate request is plain JSON: send it without Content-Encoding.")
        if declared is not None and declared > self.max_json:
            raise bodies.json_too_large(declared, self.max_json)
        body = await _read_body(receive, self.max_json, json_only=True)
        self._check_pool_json(pool_prefix, len(body))
        if len(body) > bodies.INLINE_JSON_BYTES:
            async with self.parse_budget.hold(len(body)):
                await self.parsers.run(protocol.check_generate_request, body, self.max_depth)
        else:
            protocol.check_generate_request(body, self.max_depth)
        return body

    def _check_pool_json(self, pool_prefix: str, json_bytes: int) -> None:
        """A shared pool's Triton parses the JSON it is sent into its own DOM (about 16 bytes per number, for all of
        the pool's teams): only a little reaches it. FP32 and integer data was sent on as binary already
        (gateway/fastpath/json_body.py); what stays text is bounded here."""
        if pool_prefix and json_bytes > self.max_pool_json:
            raise GatewayError(413, f"The request sends {json_bytes} bytes of JSON for Triton to parse; a deployment "
                                    f"in a shared pool takes at most {self.max_pool_json} "
                                    "(GATEWAY_MAX_POOL_JSON_BYTES), beyond the FP32 and integer data the gateway "
                                    f"converts itself: {bodies.binary_advice()}.")

    async def _check(self, json_part: bytes, header_length: int | None, total: int) -> json_body.Checked:
        if header_length is not None:
            if header_length > total:
                raise GatewayError(400, f"Inference-Header-Content-Length is {header_length}, more than the "
                                        f"{total} bytes of the body.")
            if header_length == 0:
                if total == 0:
                    raise GatewayError(400, "The request body is empty: send a KServe v2 inference request.")
                # Triton's raw binary request: the whole body is the one input, sized by the model
                return json_body.Checked()
        elif total == 0:
            raise GatewayError(400, "The request body is empty: send a KServe v2 inference request (JSON).")
        binary = total - header_length if header_length is not None else None
        if binary is not None and len(json_part) <= json_body.CACHED_HEADER_BYTES and self.fast_path:
            return self.header_checks.check(json_part, binary)  # a binary request's header, as a client sends it again
        arguments = (json_part, binary, self.max_depth, self.max_tensor, self.transcode)
        if len(json_part) > bodies.INLINE_JSON_BYTES:
            # Large JSON: checked in the gateway's parser processes (simdjson holds the GIL while it parses, for
            # seconds on a large body), GATEWAY_JSON_PARSE_BYTES_IN_FLIGHT at a time, so that their memory is bounded.
            async with self.parse_budget.hold(len(json_part)):
                return await self.parsers.run(self.check_json, *arguments)
        return self.check_json(*arguments)


def _checked(status: int, headers: list[tuple[bytes, bytes]], payload: bytes, contract: contracts.Contract | None,
             requested: tuple[str, ...] | None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """A whole small answer to an inference request, as the caller gets it (_checked_answer). Triton compresses
    its answers for a client that accepts it: such an answer is inflated (within the small-answer bound) to be
    checked, and passed on compressed as it came unless it had to change."""
    encoding = dict(headers).get(b"content-encoding")
    plain = payload
    if encoding is not None:
        try:
            plain = _inflate_answer(payload, encoding)
        except ValueError:
            return status, headers, payload  # not what Triton writes: nothing to judge it by
    better = _checked_answer(status, headers, plain, contract, requested)
    if better is None:
        if status == 200 and encoding is None:
            return status, *_said_once(headers, payload)
        return status, headers, payload
    kept = [(k, v) for k, v in headers
            if k not in (b"content-type", b"inference-header-content-length", b"content-encoding")]
    return better[0], [*kept, (b"content-type", b"application/json")], better[1]


# Triton answers a generate request to a model that sent several responses with HTTP 200 and this error.
_GENERATE_MANY = "generate expects model to produce exactly 1 response"


def _generated(status: int, headers: list[tuple[bytes, bytes]], payload: bytes,
               contract: contracts.Contract | None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """A whole answer to a generate request, as the caller gets it. Triton answers its own failures to build one
    answer with HTTP 200 and an error object: a model that sent several pieces is the caller's choice of endpoint
    (400 naming generate_stream), a model's failure a 500 in the words an inference's gets (gateway/contract.py)."""
    if status == 200 and not payload.startswith(b'{"error":'):
        return status, headers, payload
    if status == 200:
        try:
            message = json.loads(payload)["error"]
        except (ValueError, TypeError, KeyError):
            return status, headers, payload
        if not isinstance(message, str):
            return status, headers, payload
        model = contract.model if contract is not None else "the model"
        if message.startswith(_GENERATE_MANY):
            status, message = 400, (f"Model '{model}' answered with more than one response (it streams): use "
                                    f"POST .../v2/models/{model}/generate_stream for its pieces as Server-Sent "
                                    "Events, or gRPC's ModelStreamInfer.")
        else:
            status, message = contracts.reword(500, message, contract)
        payload = json.dumps({"error": message}).encode()
    else:
        better = _checked_answer(status, headers, payload, contract, None)
        if better is None:
            return status, headers, payload
        status, payload = better
    kept = [(k, v) for k, v in headers if k not in (b"content-type", b"content-encoding")]
    return status, [*kept, (b"content-type", b"application/json")], payload


_Judge = Callable[[int, list[tuple[bytes, bytes]], bytes], tuple[int, list[tuple[bytes, bytes]], bytes]]
# The answers of the inference endpoints, whose first bytes name the model (renamed in a pool as they pass).
_ANSWER_KINDS = frozenset({"infer", "generate"})


def _said_once(headers: list[tuple[bytes, bytes]], payload: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The answer with its "parameters" keys each said once (gateway/answer_params.py): as it came unless one
    repeats. A compressed answer is passed on as it came."""
    given = dict(headers).get(b"inference-header-content-length")
    header_length = int(given) if given is not None and given.isdigit() and len(given) <= 18 else None
    if given is not None and header_length is None:
        return headers, payload  # not what Triton writes: where its JSON ends is unknown
    fixed = answer_params.without_repeated_keys(payload, header_length)
    if fixed is None:
        return headers, payload
    payload, header_length = fixed
    if header_length is not None:
        headers = [(k, b"%d" % header_length if k == b"inference-header-content-length" else v) for k, v in headers]
    return headers, payload


def _inflate_answer(payload: bytes, encoding: bytes) -> bytes:
    if encoding.strip().lower() not in (b"gzip", b"deflate"):
        raise ValueError("unknown encoding")
    inflater = zlib.decompressobj(wbits=47)  # gzip or zlib, told apart by their headers
    try:
        plain = inflater.decompress(payload, STREAM_THRESHOLD * 4)
    except zlib.error as exc:
        raise ValueError(str(exc)) from None
    if inflater.unconsumed_tail or not inflater.eof:
        raise ValueError("over the bound, or cut short")
    return plain


def _checked_answer(status: int, headers: list[tuple[bytes, bytes]], payload: bytes,
                    contract: contracts.Contract | None, requested: tuple[str, ...] | None) -> tuple[int, bytes] | None:
    """A better (status, body) for Triton's answer to an inference request, or None to pass it on: an error
    in words for the caller (gateway/contract.py), or a 500 naming the outputs a 200 lacks."""
    if status >= 400:
        better = protocol.client_error(status, payload)
        if better is not None:
            status, payload = better
        try:
            message = json.loads(payload)["error"]
        except (ValueError, TypeError, KeyError):
            return better
        if not isinstance(message, str):
            return better
        status, message = contracts.reword(status, message, contract)
        return status, json.dumps({"error": message}).encode()
    if status != 200 or contract is None:
        return None
    declared = tuple(t.name for t in contract.outputs)
    # An output asked for but not declared is Triton's to refuse (400): only the declared ones are owed.
    expected = declared if requested is None else tuple(n for n in requested if n in declared)
    header = _answer_header(headers, payload)
    missing = contracts.missing_outputs(header, expected)
    if not missing:
        return None
    return 500, json.dumps({"error": contracts.missing_message(contract.model, missing,
                                                               requested is not None)}).encode()


def _answer_header(headers: list[tuple[bytes, bytes]], payload: bytes) -> bytes:
    """The JSON part of an answer: all of it, or the header of a binary one."""
    for name, value in headers:
        if name == b"inference-header-content-length" and value.isdigit() and len(value) <= 18:
            return payload[:int(value)]
    return payload


class Answer(Protocol):
    """An upstream answer as the relay reads it: upstream.Response, or a pool's with its head renamed."""

    status: int
    headers: list[tuple[bytes, bytes]]
    content_length: int | None

    async def read(self, limit: int) -> bytes: ...

    def iter_body(self, limit: int, idle_timeout: float | None = None) -> AsyncGenerator[bytes, None]: ...

    def close(self) -> None: ...


class _RenamedHead:
    """A pool's inference answer whose first bytes were renamed (pool_names.rename_head); the rest passes as it
    comes. Its lengths (Content-Length, Inference-Header-Content-Length) are the renamed ones."""

    def __init__(self, response: Answer, head: bytes, rest: AsyncGenerator[bytes, None], removed: int) -> None:
        self.status = response.status
        self.headers = [(k, _shorter(v, removed) if k == b"inference-header-content-length" else v)
                        for k, v in response.headers]
        self.content_length = response.content_length - removed if response.content_length is not None else None
        self._response = response
        self._head = head
        self._rest = rest

    async def read(self, limit: int) -> bytes:
        parts = [piece async for piece in self.iter_body(limit)]
        return b"".join(parts)

    async def iter_body(self, limit: int, idle_timeout: float | None = None) -> AsyncGenerator[bytes, None]:
        # The limit and idle timeout were given to the upstream's reader when the head was read.
        try:
            if self._head:
                yield self._head
            async for piece in self._rest:
                yield piece
        finally:
            await self._rest.aclose()

    def close(self) -> None:
        self._response.close()


def _shorter(value: bytes, removed: int) -> bytes:
    return b"%d" % (int(value) - removed) if value.isdigit() and len(value) <= 18 else value


async def _renamed_head(response: upstream.Response, prefix: str, limit: int, timeout: float) -> _RenamedHead:
    """Read at most pool_names.HEAD_SCAN_BYTES of the answer and take the pool's prefix off its model_name."""
    rest = response.iter_body(limit, idle_timeout=timeout)
    head = b""
    while len(head) < pool_names.HEAD_SCAN_BYTES:
        try:
            head += await anext(rest)
        except StopAsyncIteration:
            break
    given = dict(response.headers).get(b"inference-header-content-length")
    header_length = int(given) if given is not None and given.isdigit() and len(given) <= 18 else None
    head, removed = pool_names.rename_head(head, prefix, header_length)
    return _RenamedHead(response, head, rest, removed)


class _BodyTooLarge(Exception):
    pass


_ClientGone = bodies.ClientGone


async def _read_body(receive: Receive, limit: int, json_only: bool = False) -> bytes:
    parts = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            if json_only:
                raise bodies.json_too_large(None, limit)
            raise GatewayError(413, f"The request body is over the limit of {limit} bytes.")
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


async def _read_prefix(receive: Receive, at_least: int, limit: int) -> bytes:
    """The body's first messages, until they hold `at_least` bytes (the client's Content-Length says more come)."""
    parts = []
    size = 0
    while size < at_least:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise GatewayError(413, f"The request body is over the limit of {limit} bytes.")
        parts.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(parts)


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for chunk in rest:
        yield chunk


async def _stream_body(receive: Receive, remaining: int) -> AsyncIterator[bytes]:
    """The rest of a body whose length is known; a client that goes away aborts the upstream request (the
    upstream client drops a connection whose request was not written whole)."""
    while remaining > 0:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone()
        chunk = message.get("body", b"")
        remaining -= len(chunk)
        if remaining < 0:
            raise _BodyTooLarge()
        if chunk:
            yield chunk
        if not message.get("more_body") and remaining:
            raise _ClientGone()


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _json_inflates_too_large(limit: int) -> Refusal:
    return bodies.json_too_large(None, limit)


def _inflates_too_large(limit: int) -> Refusal:
    return GatewayError(413, f"The request body inflates to over the limit of {limit} bytes.")


def _with_revision(send: Send, revision: int) -> Send:
    """`send`, adding the header that names the revision that answered (a canary's, or the stable one's)."""
    header = (b"modelport-revision", b"%d" % revision)

    async def sending(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), header]}
        await send(message)

    return sending


def load_portal_urls() -> None:
    """Import the portal's URLconf, every view module it includes, and build its reverse lookup: what the first
    request would otherwise do."""
    from django.urls import get_resolver

    get_resolver().reverse_dict  # noqa: B018 - read for what it builds


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in scope["headers"]}


def _is_event_stream(response: Answer) -> bool:
    return dict(response.headers).get(b"content-type", b"").startswith(b"text/event-stream")


def _has(headers: list[tuple[bytes, bytes]], name: bytes) -> bool:
    return any(k == name for k, _ in headers)


def _content_length(headers: dict[bytes, bytes]) -> int | None:
    value = headers.get(b"content-length")
    if value is None:
        return None
    if not value.isdigit() or len(value) > 18:
        raise GatewayError(400, "Content-Length must be a number of bytes.")
    return int(value)


def _header_length(headers: dict[bytes, bytes]) -> int | None:
    value = headers.get(b"inference-header-content-length")
    if value is None:
        return None
    value = value.strip()
    if not value.isdigit() or len(value) > 18:
        raise GatewayError(400, "Inference-Header-Content-Length must be the byte length of the JSON header.")
    return int(value)


def _cookies(headers: dict[bytes, bytes]) -> dict[str, str]:
    raw = headers.get(b"cookie")
    if not raw:
        return {}
    jar: SimpleCookie = SimpleCookie()
    with contextlib.suppress(Exception):
        jar.load(raw.decode("latin-1"))
    return {key: morsel.value for key, morsel in jar.items()}


def _model_label(route: Route, endpoint: Endpoint | None) -> str:
    # Prometheus keeps a time series per label value: only the deployment's own models get one of their own, so
    # that requests for random names cannot grow the metrics without bound.
    if endpoint is None or not endpoint.model:
        return ""
    return endpoint.model if endpoint.model in route.models else stats.OTHER_MODEL


async def _send_error(send: Send, status: int, message: str, headers: dict[str, str]) -> None:
    # KServe v2's error shape, which tritonclient shows to its user.
    body = json.dumps({"error": message}).encode()
    out = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    out += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    with contextlib.suppress(Exception):  # the client may be gone already
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": body})
