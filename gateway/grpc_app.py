"""The gRPC inference gateway: Triton's GRPCInferenceService (the KServe v2 gRPC protocol) for API tokens of the
deployment's team, forwarded to the deployment's current Triton.

    client = tritonclient.grpc.InferenceServerClient("modelport.example.com:8001")
    headers = {"authorization": "Bearer mp_...", "modelport-deployment": "digits-prod"}
    client.infer("digits", inputs, headers=headers)

The token goes in the `authorization` metadata, the deployment's name in `modelport-deployment` (gRPC metadata
keys are lower case). It is the HTTP gateway (gateway/app.py) for gRPC, built from the same parts: the cached
access decisions (gateway/access.py), the rate limit per user and team shared through Redis
(gateway/ratelimit.py), the statistics per deployment and model (gateway/stats.py), the body and tensor limits,
and the refusal of Triton's admin methods (gateway/grpc_protocol.py). Messages are forwarded as bytes: a generic
handler with no (de)serializer receives and sends them as they came off the wire, and only the small fields of an
inference request are read (never its tensors) to refuse what would crash Triton.

A canary rollout (deployments/canary.py) is split per call, and per message of a stream, as over HTTP
(gateway/access.py, `choose`): a unary call's initial metadata `modelport-revision` names the revision that
answered, and a client pins one by sending that metadata (a stream's pin holds for all its messages).

It runs in a process of its own (`manage.py grpc_gateway`, started by bin/run-portal): measured inside uvicorn's
process instead, gRPC kept 38% of its throughput while HTTP traffic ran at the same time (bench/grpc_placement.py,
docs/benchmarks.md).

Statuses: the HTTP gateway's refusals map to the gRPC codes users expect (grpc_protocol.grpc_code: 401
UNAUTHENTICATED, 404 NOT_FOUND, 403 PERMISSION_DENIED, 400 INVALID_ARGUMENT, 413/429 RESOURCE_EXHAUSTED, 502/503
UNAVAILABLE with a `retry-after` trailing metadata in seconds, 504 DEADLINE_EXCEEDED); Triton's own answers pass
through with its code, in the HTTP gateway's words (gateway/contract.py). In ModelStreamInfer a refused request is
answered in the stream with an error message naming its model and id, as Triton answers its own per-request errors
(which get the same words, the request's id in front), and the stream goes on; a revoked token or a deleted
deployment ends the stream. A decoupled (streaming) model's request in a stream gets an upstream call of its own,
its responses relayed as Triton sends them, bounded per request by the stream settings (issue 33, docs/api.md
"Streaming models over gRPC"); a stream whose caller leaves a response unread for GATEWAY_STREAM_SEND_SECONDS is
ended whole (_StreamRelay._write).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, InterfaceError

from accounts.tokens import parse_bearer
from gateway import admission, grpc_protocol, not_found, pool_names, scale_from_zero, stats, traced
from gateway import stream_figures as figures_of
from gateway.access import Access, Caller, Choice, Route
from gateway.cold_start import ColdStarts
from gateway.contract import Contract, missing_message, reword
from gateway.grpc_connections import Calls, Shedder
from gateway.grpc_protocol import Method
from gateway.protocol import Refusal
from gateway.ratelimit import RateLimiter
from gateway.stream_slots import StreamSlots
from infra import tracing
from infra.open_files import connection_cap, raise_open_files_limit

log = logging.getLogger(__name__)

DEPLOYMENT_KEY = "modelport-deployment"
# Names the revision that answered (initial metadata of a unary call); sent by a client, pins one (as over HTTP).
REVISION_KEY = "modelport-revision"
MAX_DEPLOYMENT_NAME = 255
MODEL_READY = "/inference.GRPCInferenceService/ModelReady"
FLUSH_SECONDS = 5.0
CHANNEL_IDLE_SECONDS = 120.0  # upstream channels unused this long are closed (old revisions' servers)
MAX_CONCURRENT_STREAMS = 1000  # HTTP/2 streams (calls in flight) per client connection
# gRPC's own words when the channel to Triton failed (as opposed to Triton answering UNAVAILABLE itself): the
# client then gets the HTTP gateway's message rather than internal addresses.
_CONNECTION_FAILURES = ("failed to connect", "connection refused", "socket closed", "connection reset",
                        "broken pipe", "dns resolution failed", "connection timed out", "goaway", "keepalive",
                        "endpoint closing", "transport closed", "unavailable")


class GrpcFailure(Exception):
    """An answer the gateway gives itself: a gRPC code, a message that says what to do, and the HTTP status that
    the statistics count it as."""

    def __init__(self, code: grpc.StatusCode, message: str, status: int, retry_after: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.retry_after = retry_after

    @classmethod
    def from_refusal(cls, exc: Refusal) -> GrpcFailure:
        return cls(grpc.StatusCode[grpc_protocol.grpc_code(exc.status)], exc.message, exc.status,
                   exc.headers.get("Retry-After", ""))


class Channels:
    """One channel (one HTTP/2 connection, every call multiplexed on it) per upstream Triton for unary calls, and
    one for ModelStreamInfer calls, each opened on first use and closed once its target is unused for
    CHANNEL_IDLE_SECONDS; and the callables per method, which cost a little to make.

    The streams' channel does not probe the bandwidth-delay product (`grpc.http2.bdp_probe` 0), which gRPC core
    otherwise uses to grow each call's receive window to megabytes on a fast link: a stream whose caller does not
    read stops being read by the gateway, and what Triton may then push into the gateway is that window, per
    stream. Measured with 40 streams whose callers read nothing (a scripted upstream sending 64 KiB pieces as fast
    as it was let, GATEWAY_STREAM_SEND_SECONDS=1): 4.2 MiB taken per stream and the process grown by 182 MiB with
    probing, 0.13 MiB and 20 MiB without. A message larger than the window still comes whole (core opens the window
    to the size of the message being read). Unary calls keep probing: their answers are read as they come."""

    STREAM_OPTIONS = [("grpc.http2.bdp_probe", 0)]

    def __init__(self, options: list[tuple[str, Any]]) -> None:
        self.options = options
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.streaming: dict[str, grpc.aio.Channel] = {}
        self.used: dict[str, float] = {}
        self.unary: dict[tuple[str, str], grpc.aio.UnaryUnaryMultiCallable] = {}

    def channel(self, target: str) -> grpc.aio.Channel:
        self.used[target] = time.monotonic()
        channel = self.channels.get(target)
        if channel is None:
            channel = self.channels[target] = grpc.aio.insecure_channel(target, options=self.options)
        return channel

    def stream_channel(self, target: str) -> grpc.aio.Channel:
        self.used[target] = time.monotonic()
        channel = self.streaming.get(target)
        if channel is None:
            channel = self.streaming[target] = grpc.aio.insecure_channel(
                target, options=self.options + self.STREAM_OPTIONS)
        return channel

    def touch(self, target: str) -> None:
        if target in self.channels or target in self.streaming:
            self.used[target] = time.monotonic()

    def unary_call(self, target: str, path: str) -> grpc.aio.UnaryUnaryMultiCallable:
        call = self.unary.get((target, path))
        if call is None or target not in self.channels:
            call = self.unary[(target, path)] = self.channel(target).unary_unary(path)
        else:
            self.used[target] = time.monotonic()
        return call

    async def sweep(self, idle_seconds: float = CHANNEL_IDLE_SECONDS) -> None:
        cutoff = time.monotonic() - idle_seconds
        for target in [t for t, used in self.used.items() if used < cutoff]:
            await self._close(target)

    async def close(self) -> None:
        for target in {*self.channels, *self.streaming}:
            await self._close(target)

    async def _close(self, target: str) -> None:
        self.used.pop(target, None)
        channels = [self.channels.pop(target, None), self.streaming.pop(target, None)]
        for key in [k for k in self.unary if k[0] == target]:
            del self.unary[key]
        for channel in channels:
            if channel is not None:
                # Calls still running on it (a long stream) get the grace period, then are cancelled.
                await channel.close(grace=5.0)


class GrpcGateway:
    def __init__(self) -> None:
        self.access = Access(ttl=settings.GATEWAY_CACHE_TTL_SECONDS)
        self.limiter = RateLimiter(settings.GATEWAY_RATE_LIMIT_PER_SECOND, settings.GATEWAY_RATE_LIMIT_BURST,
                                   redis_url=settings.REDIS_URL)
        self.collector = stats.StatsCollector()
        self.max_body = settings.GATEWAY_MAX_BODY_BYTES
        self.max_response = settings.GATEWAY_MAX_RESPONSE_BYTES
        self.max_tensor = settings.GATEWAY_MAX_TENSOR_BYTES
        self.timeout = settings.GATEWAY_UPSTREAM_TIMEOUT_SECONDS
        # A decoupled model's request in a ModelStreamInfer stream holds a stream slot of its team while it
        # streams, and is bounded as a /generate_stream is (docs/security.md, "Streams"); the slots are shared with
        # the web processes through the rate limiter's Redis (gateway/stream_slots.py).
        self.streams = StreamSlots(settings.GATEWAY_MAX_STREAMS_PER_TEAM, redis_url=settings.REDIS_URL)
        self.stream_idle = settings.GATEWAY_STREAM_IDLE_SECONDS
        self.stream_seconds = settings.GATEWAY_MAX_STREAM_SECONDS
        self.stream_bytes = settings.GATEWAY_MAX_STREAM_BYTES
        self.send_seconds = settings.GATEWAY_STREAM_SEND_SECONDS
        self.channels = Channels([
            ("grpc.max_receive_message_length", _int32(self.max_response)),
            ("grpc.max_send_message_length", _int32(self.max_body)),
        ])
        self.cold_starts = ColdStarts()  # held first requests to idle-unloaded pool revisions
        self.wakes = scale_from_zero.Wakes()  # held requests to dedicated deployments scaled to zero
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.background: asyncio.Task[None] | None = None
        # The connection cap that sheds the connections idle longest (gateway/grpc_connections.py); without it
        # (not Linux) gRPC core's own cap, which refuses every new connection at the cap, is all there is.
        self.calls = Calls()
        self.shedder: Shedder | None = None
        self.shedding = Shedder.available()

    # --- Process ---------------------------------------------------------------------------------------------

    def build_server(self) -> grpc.aio.Server:
        server = grpc.aio.server(options=[
            # The HTTP gateway's body limit, checked by gRPC before the message is handed over (after inflating a
            # compressed one); past it the client gets RESOURCE_EXHAUSTED.
            ("grpc.max_receive_message_length", _int32(self.max_body)),
            ("grpc.max_send_message_length", _int32(self.max_response)),
            ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
            # A second gateway on the same port must fail to start, not share the port unnoticed.
            ("grpc.so_reuseport", 0),
            *slow_client_options(self.shedding),
        ])
        server.add_generic_rpc_handlers((_Handlers(self),))
        return server

    async def start(self, address: str) -> int:
        """Listen on `address` ("host:port"; port 0 picks one) and return the port."""
        self.server = self.build_server()
        self.port = self.server.add_insecure_port(address)
        await self.server.start()
        if self.shedding:
            self.shedder = Shedder(self.port, connection_caps()[0], self.calls)
            self.shedder.start()
        else:
            log.warning("gRPC gateway: no /proc/self/fd here, so at GATEWAY_GRPC_MAX_CONNECTIONS new connections "
                        "are refused rather than taking the place of idle ones")
        self.background = asyncio.get_running_loop().create_task(self._housekeeping())
        return self.port

    async def stop(self, grace: float = 5.0) -> None:
        if self.server is not None:
            await self.server.stop(grace)
        if self.shedder is not None:
            await asyncio.to_thread(self.shedder.stop)
        if self.background is not None:
            self.background.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.background
        await self._flush()
        await self.limiter.close()
        await self.streams.close()
        self.cold_starts.close()
        self.wakes.close()
        await self.channels.close()

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            await self._flush()
            await self.channels.sweep()

    async def _flush(self) -> None:
        buckets = self.collector.take()
        if buckets:
            try:
                await sync_to_async(stats.flush, thread_sensitive=False)(buckets)
            except Exception:
                log.exception("could not write gateway statistics")

    # --- Calls -----------------------------------------------------------------------------------------------

    async def health(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """grpc.health.v1 for probes: the gateway itself is serving (no deployment, no credential)."""
        return grpc_protocol.HEALTH_SERVING

    async def unary(self, path: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if tracing.tracer is not None:  # the whole cost of tracing while it is off (infra/tracing.py)
            return await traced.unary(tracing.tracer, self._unary, path, request, _metadata(context), context)
        return await self._unary(path, request, context, None)

    async def _unary(self, path: str, request: bytes, context: grpc.aio.ServicerContext,
                     span: traced.Span | None) -> bytes:
        started = time.perf_counter()
        caller: Caller | None = None
        response = b""
        method_name = ""  # Triton's method, once classified
        route: Route | None = None
        choice: Choice | None = None
        model = ""
        status = 500
        summary = grpc_protocol.InferSummary()
        try:
            metadata = _metadata(context)
            caller, _ = await self._caller(metadata)
            route = await self._route(caller, metadata)
            try:
                method = grpc_protocol.classify(path)
                method_name = method.name
                if method.kind == "infer":
                    summary = grpc_protocol.read_infer_request(request)
                    model = summary.model
                    grpc_protocol.check_infer_request(summary, self.max_tensor)
                else:
                    model = self._model(method, request)
                # The HTTP gateway's 429 and 404, for a dedicated deployment as for a shared one.
                choice, pooled = admission.admit(self.limiter, caller, route, model, metadata.get(REVISION_KEY),
                                                 grpc=True).taken()
                if pooled is not None and method.kind not in ("health", "server"):
                    request = await self._to_pool(route, pooled, caller, model, request)
                elif pooled is None:  # scaled to zero: held until a pod of the revision is ready
                    await scale_from_zero.wake(self.wakes, route, choice, caller.team_id)
                # A streaming model's ModelInfer is refused here, in words naming ModelStreamInfer (issue 33).
                contract = admission.contract(route, choice, model, method.kind)
            except Refusal as exc:
                raise GrpcFailure.from_refusal(exc) from None
            if pooled is not None and method.name == "ServerReady":
                await context.send_initial_metadata(((REVISION_KEY, str(choice.revision)),))
                status = 200
                return await self._pooled_ready(choice.upstream, pooled, context)
            await context.send_initial_metadata(((REVISION_KEY, str(choice.revision)),))
            in_flight = stats.IN_FLIGHT.labels(route.team, route.name)
            in_flight.inc()
            prefix = pooled.prefix if pooled is not None else ""
            try:
                response = await self._forward(choice.upstream, path, request, context, contract, prefix)
            finally:
                in_flight.dec()
            if prefix:
                response = pool_names.grpc_response(method.kind, response, prefix)
            if contract is not None:
                _check_answer(response, contract, summary.outputs)
            status = 200
            return response
        except GrpcFailure as exc:
            status = exc.status
            await _abort(context, exc)
        except (DatabaseError, InterfaceError):  # InterfaceError: a connection PostgreSQL dropped
            log.warning("gRPC gateway: the database is unreachable", exc_info=True)
            status = 503
            await _abort(context, _DATABASE_DOWN)
        except asyncio.CancelledError:
            status = 499  # the client went away (or its deadline passed) before the answer
            raise
        finally:
            if route is not None:
                self.collector.observe(route.deployment_id, route.team, route.name, _model_label(route, model), status,
                                       time.perf_counter() - started, choice.revision if choice else 0)
            if span is not None:
                traced.describe_grpc(span, method_name, caller, route, choice,
                                     _model_label(route, model) if route is not None else "", status, len(request),
                                     len(response))

    async def stream(self, context: grpc.aio.ServicerContext) -> None:
        if tracing.tracer is not None:  # as unary(): the whole cost of tracing while it is off
            await traced.stream(tracing.tracer, self._stream, _metadata(context), context)
            return
        await self._stream(context, None)

    async def _stream(self, context: grpc.aio.ServicerContext, span: traced.Span | None) -> None:
        caller: Caller | None = None
        route: Route | None = None
        relay: _StreamRelay | None = None
        status = 200
        try:
            try:
                metadata = _metadata(context)
                caller, token = await self._caller(metadata)
                route = await self._route(caller, metadata)
            except GrpcFailure as exc:
                status = exc.status
                await _abort(context, exc)
                return
            except (DatabaseError, InterfaceError):  # InterfaceError: a connection PostgreSQL dropped
                status = _DATABASE_DOWN.status
                await _abort(context, _DATABASE_DOWN)
                return
            relay = _StreamRelay(self, context, token, route.name, metadata.get(REVISION_KEY))
            await relay.run()
            if relay.slow_reader:
                status = 408
        except asyncio.CancelledError:
            status = 499
            raise
        finally:
            if span is not None:
                traced.describe_stream(span, caller, route, status, relay.requests if relay is not None else 0)

    # --- Steps -------------------------------------------------------------------------------------------------

    async def _caller(self, metadata: dict[str, str]) -> tuple[Caller, str]:
        authorization = metadata.get("authorization")
        if authorization is None:
            raise GrpcFailure(grpc.StatusCode.UNAUTHENTICATED, "Authentication required: send the metadata "
                              "'authorization: Bearer <token>' with a Modelport API token.", 401)
        raw = parse_bearer(authorization)
        if raw is None:
            raise GrpcFailure(grpc.StatusCode.UNAUTHENTICATED, "Use the metadata 'authorization: Bearer <token>' "
                              "with a Modelport API token.", 401)
        caller = await self.access.token(raw)
        if caller is None:
            raise GrpcFailure(grpc.StatusCode.UNAUTHENTICATED, "The API token is invalid, expired or revoked.", 401)
        return caller, raw

    async def _route(self, caller: Caller, metadata: dict[str, str]) -> Route:
        name = metadata.get(DEPLOYMENT_KEY, "")
        if not name:
            raise GrpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"Name the deployment in the '{DEPLOYMENT_KEY}' "
                              "metadata (as in /serve/<deployment>/ over HTTP).", 400)
        route = await self.access.routes.get((caller.team_id, name)) if len(name) <= MAX_DEPLOYMENT_NAME else None
        if route is None:
            raise GrpcFailure.from_refusal(not_found.no_deployment(name, caller.team_name))
        return route

    async def _to_pool(self, route: Route, pooled: pool_names.Pooled, caller: Caller, model: str,
                       request: bytes) -> bytes:
        """A request to a revision in a shared pool (issue 24), its model checked already (not_found.check_model,
        whoever's a name is in the pool): an idle-unloaded revision is loaded while the request is held, and the
        model is named as the pool names it."""
        await admission.cold_start(self.cold_starts, self.access.routes, route, pooled, caller)
        return pool_names.grpc_request(request, pooled.prefix)

    async def _pooled_ready(self, target: str, pooled: pool_names.Pooled, context: grpc.aio.ServicerContext) -> bytes:
        """ServerReady of a shared deployment: its own models' ModelReady in the pool, never the pool server's,
        which speaks for every team's models (the HTTP gateway's rule, pool_names.ready_answer)."""
        ready: list[bool] = []
        if pooled.loaded:
            ready = list(await asyncio.gather(*(self._model_ready(target, name, context)
                                                 for name in pool_names.ready_names(pooled))))
        # ServerReadyResponse{ready: true} is field 1, varint 1; false is the empty message.
        return b"\x08\x01" if pool_names.ready_answer(pooled, ready) else b""

    async def _model_ready(self, target: str, name: str, context: grpc.aio.ServicerContext) -> bool:
        request = pool_names.grpc_ready_request(name)
        remaining = context.time_remaining()
        timeout = self.timeout if remaining is None else min(self.timeout, max(remaining, 0.001))
        try:
            answer: bytes = await self.channels.unary_call(target, MODEL_READY)(request, timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
        return answer == b"\x08\x01"

    def _model(self, method: Method, request: bytes) -> str:
        """The model a request other than an inference names (for the statistics), after checking it."""
        if method.kind in ("health", "server"):
            return ""
        name, _ = grpc_protocol.model_name(request)
        if not name and method.kind != "stats":
            raise Refusal(400, f"{method.name} needs the model's name.")
        return name

    async def _forward(self, target: str, path: str, request: bytes, context: grpc.aio.ServicerContext,
                       contract: Contract | None = None, pool_prefix: str = "") -> bytes:
        timeout = self.timeout
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = min(timeout, max(remaining, 0.001))
        try:
            call = self.channels.unary_call(target, path)
            if tracing.tracer is not None:
                parent = tracing.traceparent()  # the gateway's span, the parent of Triton's
                if parent is not None:
                    response: bytes = await call(request, timeout=timeout, metadata=(("traceparent", parent.decode()),))
                    return response
            response = await call(request, timeout=timeout)
            return response
        except grpc.aio.AioRpcError as exc:
            raise self._upstream_failure(exc, target, contract, pool_prefix) from None

    def _upstream_failure(self, exc: grpc.aio.AioRpcError, target: str,
                          contract: Contract | None = None, pool_prefix: str = "") -> GrpcFailure:
        code = exc.code()
        details = pool_names.grpc_message(exc.details() or "", pool_prefix) if pool_prefix else exc.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE and details.lower().startswith(_CONNECTION_FAILURES):
            log.info("gRPC upstream %s failed: %s", target, details)
            return GrpcFailure(code, "Triton is unreachable or broke the connection; the deployment may be "
                                     "restarting. Retry shortly.", 502, "2")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return GrpcFailure(code, f"Triton did not answer within {self.timeout:g} s (or the call's deadline).",
                               504)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
            return GrpcFailure(code, f"Triton's answer is over the gateway's limit of {self.max_response} bytes "
                                     "(GATEWAY_MAX_RESPONSE_BYTES); ask for less per request.", 502)
        if code == grpc.StatusCode.CANCELLED:
            return GrpcFailure(code, "The call was cancelled.", 499)
        # Triton's own answer: in words for the caller, from the model's signature (gateway/contract.py).
        status, message = reword(grpc_protocol.http_status(code.name), details, contract)
        return GrpcFailure(code, message, status)


_DATABASE_DOWN = GrpcFailure(grpc.StatusCode.UNAVAILABLE, "The portal's database is unreachable; retry shortly.",
                             503, "5")


class _CallerGone(Exception):
    """A response could not be written: the caller's call is over."""


@dataclass
class _Pending:
    started: float
    model: str
    request_id: str


@dataclass
class _Upstream:
    """One ModelStreamInfer call to one Triton: the requests sent on it that await their answer, in order (Triton
    answers a stream's requests to non-decoupled models in order, one answer each). A decoupled model's request
    never goes on it (it answers 0..N times, interleaved with the others): it gets an upstream call of its own
    (_StreamRelay._decoupled)."""

    target: str
    route: Route
    call: Any  # grpc.aio.StreamStreamCall
    revision: int = 0
    pending: collections.deque[_Pending] = field(default_factory=collections.deque)
    pump: asyncio.Task[None] | None = None
    writing: bool = True


class _StreamRelay:
    """One client stream. Each request is checked as a unary one would be (access re-checked from the cache, so a
    revoked token ends the stream within the cache window) and sent on the stream to the route's current Triton.

    Requests go to an upstream stream per target: when a rollout moves the deployment to a new server, new
    requests go to the new one while the old stream finishes what it was sent (and a canary split can send each
    request to either). Answers are relayed as they come, from every upstream stream."""

    def __init__(self, gateway: GrpcGateway, context: grpc.aio.ServicerContext, token: str, name: str,
                 pinned: str | None = None) -> None:
        self.gateway = gateway
        self.pinned = pinned
        self.context = context
        self.token = token
        self.name = name
        self.upstreams: dict[str, _Upstream] = {}  # the one taking new requests, per target
        self.opened: list[_Upstream] = []  # every upstream stream not finished yet, finishing ones included
        self.decoupled: set[asyncio.Task[None]] = set()  # decoupled models' requests still streaming
        self.write_lock = asyncio.Lock()
        # The slow reader's watch (GATEWAY_STREAM_SEND_SECONDS): when the response being written was handed to
        # gRPC (0.0: none is waiting), and one timer per stream, armed by a write when none is, that looks at it.
        self.loop = asyncio.get_running_loop()
        self.sending = 0.0
        self.watch: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[Any] | None = None
        self.slow_reader = False
        self.requests = 0  # the caller's requests read (its span's attribute, with tracing on)

    async def run(self) -> None:
        self.task = asyncio.current_task()
        # The response headers go now, not with the first response: gRPC core sends them with whichever batch
        # comes first, and a status sent while a first response still waits for the caller's window would send
        # them twice, which core refuses (the slow reader's status below could then never be sent).
        await self.context.send_initial_metadata(())
        try:
            await self._relay()
        except _CallerGone:
            return  # nothing more can reach the caller; _relay's `finally` has cancelled the stream's work
        except asyncio.CancelledError:
            if not self.slow_reader:
                raise
            # Ended by the watch below (the work of the stream is cancelled by _relay's `finally`): the caller gets
            # the status after the responses it has not read, if it ever reads them.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            await self._end_slow_reader()

    async def _relay(self) -> None:
        try:
            while True:
                message = await self.context.read()
                if message is grpc.aio.EOF:
                    break
                try:
                    await self._handle(message)
                except GrpcFailure as exc:
                    await _abort(self.context, exc)
                    return
                except (DatabaseError, InterfaceError):  # InterfaceError: a connection PostgreSQL dropped
                    await _abort(self.context, _DATABASE_DOWN)
                    return
            for upstream in list(self.opened):
                await self._stop_writing(upstream)
            pumps = [u.pump for u in self.opened if u.pump is not None] + list(self.decoupled)
            if pumps:
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            # The client is gone, or the stream was ended: nothing more is relayed, and each decoupled request's
            # upstream call is cancelled, which Triton passes on to the model (request.is_cancelled()).
            if self.watch is not None:
                self.watch.cancel()
            for task in list(self.decoupled):
                task.cancel()
            for upstream in self.opened:
                upstream.call.cancel()
                if upstream.pump is not None:
                    upstream.pump.cancel()
                route = upstream.route
                for entry in upstream.pending:
                    stats.IN_FLIGHT.labels(route.team, route.name).dec()
                    if self.slow_reader:  # its answer would not have been read: counted as the caller's doing
                        self.gateway.collector.observe(route.deployment_id, route.team, route.name,
                                                       _model_label(route, entry.model), 408,
                                                       time.perf_counter() - entry.started, upstream.revision)
                upstream.pending.clear()

    async def _handle(self, message: bytes) -> None:
        gateway = self.gateway
        started = time.perf_counter()
        self.requests += 1
        caller = await gateway.access.token(self.token)
        if caller is None:
            raise GrpcFailure(grpc.StatusCode.UNAUTHENTICATED, "The API token is invalid, expired or revoked.", 401)
        route = await gateway.access.routes.get((caller.team_id, self.name))
        if route is None:
            raise GrpcFailure.from_refusal(not_found.no_deployment(self.name, caller.team_name))
        summary = grpc_protocol.InferSummary()
        try:
            summary = grpc_protocol.read_infer_request(message)
            grpc_protocol.check_infer_request(summary, gateway.max_tensor)
            choice, pooled = admission.admit(gateway.limiter, caller, route, summary.model, self.pinned,
                                             grpc=True).taken()
            if pooled is not None:
                # Held here while an idle revision loads: the stream's later requests wait behind it, in order.
                message = await gateway._to_pool(route, pooled, caller, summary.model, message)
            else:  # scaled to zero: held here likewise, the stream's later requests behind it
                await scale_from_zero.wake(gateway.wakes, route, choice, caller.team_id)
            target = choice.upstream
        except Refusal as exc:
            gateway.collector.observe(route.deployment_id, route.team, route.name, _model_label(route, summary.model),
                                      exc.status, time.perf_counter() - started)
            await self._write(grpc_protocol.stream_error_response(exc.message, summary.model, summary.id))
            return
        gateway.channels.touch(target)  # a long stream keeps its channel from being swept as idle
        found = route.contract(choice.revision, summary.model)
        if found is not None and found.decoupled:
            await self._start_decoupled(caller, route, choice.revision, target, summary, message, started)
            return
        upstream = self.upstreams.get(target)
        if upstream is None or not upstream.writing:
            upstream = self._open(target, route, choice.revision)
        # A rollout moved the route: the old server's stream takes no more and just finishes; the streams to the
        # route's current servers (the serving revision's, a canary's) stay open for the next requests.
        current = {route.grpc_target, route.canary_grpc_target}
        for other in list(self.upstreams.values()):
            if other is not upstream and other.writing and other.target not in current:
                await self._stop_writing(other)
        entry = _Pending(started, summary.model, summary.id)
        upstream.pending.append(entry)
        stats.IN_FLIGHT.labels(route.team, route.name).inc()
        try:
            await upstream.call.write(message)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            # The upstream stream has ended: its pump answers what it still owed; this request is answered here.
            log.info("gRPC upstream stream to %s ended: %r", target, exc)
            with contextlib.suppress(ValueError):
                upstream.pending.remove(entry)
                await self._fail(upstream, [entry])
            upstream.writing = False

    async def _start_decoupled(self, caller: Caller, route: Route, revision: int, target: str,
                               summary: grpc_protocol.InferSummary, message: bytes, started: float) -> None:
        """A decoupled model's request: a stream slot of the team is taken (refused in the stream past
        GATEWAY_MAX_STREAMS_PER_TEAM), then it is streamed on an upstream call of its own."""
        entry = _Pending(started, summary.model, summary.id)
        slot = contextlib.ExitStack()
        try:
            slot.enter_context(self.gateway.streams.hold(caller.team_id, caller.team_name))
        except Refusal as exc:
            self.gateway.collector.observe(route.deployment_id, route.team, route.name,
                                           _model_label(route, entry.model), exc.status, time.perf_counter() - started,
                                           revision)
            await self._write(grpc_protocol.stream_error_response(_with_id(exc.message, entry), entry.model,
                                                                  entry.request_id, final=True))
            return
        stats.IN_FLIGHT.labels(route.team, route.name).inc()
        task = asyncio.get_running_loop().create_task(self._decoupled(route, revision, target, entry, message, slot))
        self.decoupled.add(task)
        task.add_done_callback(self.decoupled.discard)

    async def _decoupled(self, route: Route, revision: int, target: str, entry: _Pending, message: bytes,
                         slot: contextlib.ExitStack) -> None:
        """One decoupled request on its own upstream ModelStreamInfer call: each response relayed as Triton sends
        it (its pieces, Triton's `triton_final_response` flags, the empty final response when the caller asked for
        it with `triton_enable_empty_final_response`), until Triton ends the call. Its own call, because a request
        in a gRPC stream cannot be cancelled alone: ending this one call cancels just this request in Triton, when a
        bound below is passed or the caller goes away."""
        gateway = self.gateway
        remaining = self.context.time_remaining()
        call = gateway.channels.stream_channel(target).stream_stream(grpc_protocol.STREAM_METHOD)(
            timeout=remaining, metadata=_trace_metadata())
        contract = route.contract(revision, entry.model)
        status = 200
        received = 0
        deadline = time.monotonic() + gateway.stream_seconds
        # The stream's figures, as HTTP's relay counts them (gateway/stream_figures.py): each response relayed is a
        # piece (the empty final response a caller asked for too: it is what the caller reads last).
        figures = gateway.collector.stream(route.deployment_id, route.team, route.name, revision, entry.started,
                                           model=_model_label(route, entry.model))
        ended = figures_of.COMPLETE
        try:
            await call.write(message)
            await call.done_writing()
            while True:
                left = deadline - time.monotonic()
                try:
                    response = await asyncio.wait_for(call.read(), min(gateway.stream_idle, max(left, 0.0)))
                except TimeoutError:
                    status = 504
                    ended = figures_of.LENGTH_SECONDS if left <= gateway.stream_idle else figures_of.IDLE
                    if left <= gateway.stream_idle:
                        words = (f"The stream ran for its most of {gateway.stream_seconds:g} s "
                                 "(GATEWAY_MAX_STREAM_SECONDS); it was ended and the request cancelled in Triton.")
                    else:
                        words = (f"The model sent nothing for {gateway.stream_idle:g} s (GATEWAY_STREAM_IDLE_SECONDS); "
                                 "the stream was ended and the request cancelled in Triton.")
                    await self._write(grpc_protocol.stream_error_response(
                        _with_id(words, entry), entry.model, entry.request_id, final=True))
                    return
                if response is grpc.aio.EOF:
                    return
                received += len(response)
                if received > gateway.stream_bytes:
                    status = 502
                    ended = figures_of.LENGTH_BYTES
                    await self._write(grpc_protocol.stream_error_response(_with_id(
                        f"The model's answers to this request passed {gateway.stream_bytes} bytes "
                        "(GATEWAY_MAX_STREAM_BYTES); the stream was ended and the request cancelled in Triton.",
                        entry), entry.model, entry.request_id, final=True))
                    return
                if route.pooled:
                    response = pool_names.grpc_stream_response(response, route.deployment_id)
                error = grpc_protocol.stream_error(response)
                if error:
                    final = grpc_protocol.stream_final(response) is not False
                    status, response = _reworded_stream_error(grpc_protocol.stream_error_status(error), error,
                                                              contract, entry, final)
                    ended = figures_of.MODEL_ERROR
                    await self._write(response)
                    continue
                await self._write(response)
                figures.piece(len(response))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                status = 499
                ended = figures_of.CANCELLED
                return
            ended = figures_of.UPSTREAM
            pooled = route.pooled_for(revision)
            failure = gateway._upstream_failure(exc, target, contract, pooled.prefix if pooled is not None else "")
            status = failure.status
            await self._write(grpc_protocol.stream_error_response(_with_id(failure.message, entry), entry.model,
                                                                  entry.request_id, final=True))
        except _CallerGone:
            status = 499
            ended = figures_of.CANCELLED
        except asyncio.CancelledError:
            if self.slow_reader:  # the caller did not take a response for GATEWAY_STREAM_SEND_SECONDS
                status = 408
                ended = figures_of.SLOW_READER
            else:
                status = 499  # the caller went away (or ended the stream)
                ended = figures_of.CANCELLED
            raise
        finally:
            figures.ended(ended)  # first: what follows must not keep a cancelled stream counted in flight
            call.cancel()  # nothing when Triton has ended it; otherwise Triton cancels the request
            slot.close()
            stats.IN_FLIGHT.labels(route.team, route.name).dec()
            gateway.collector.observe(route.deployment_id, route.team, route.name, _model_label(route, entry.model),
                                      status, time.perf_counter() - entry.started, revision)

    def _open(self, target: str, route: Route, revision: int = 0) -> _Upstream:
        remaining = self.context.time_remaining()
        call = self.gateway.channels.stream_channel(target).stream_stream(grpc_protocol.STREAM_METHOD)(
            timeout=remaining, metadata=_trace_metadata())
        upstream = _Upstream(target=target, route=route, call=call, revision=revision)
        self.opened = [u for u in self.opened if not (u.pump is not None and u.pump.done() and not u.pending)]
        self.opened.append(upstream)
        self.upstreams[target] = upstream
        upstream.pump = asyncio.get_running_loop().create_task(self._pump(upstream))
        return upstream

    async def _stop_writing(self, upstream: _Upstream) -> None:
        if upstream.writing:
            upstream.writing = False
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await upstream.call.done_writing()

    async def _pump(self, upstream: _Upstream) -> None:
        route = upstream.route
        try:
            async for response in upstream.call:
                entry = upstream.pending.popleft() if upstream.pending else None
                if route.pooled:
                    response = pool_names.grpc_stream_response(response, route.deployment_id)
                error = grpc_protocol.stream_error(response)
                status = 200
                if error:
                    status = grpc_protocol.stream_error_status(error)
                    if entry is not None:
                        status, response = _reworded_stream_error(
                            status, error, route.contract(upstream.revision, entry.model), entry)
                if entry is not None:
                    stats.IN_FLIGHT.labels(route.team, route.name).dec()
                    self.gateway.collector.observe(route.deployment_id, route.team, route.name,
                                                   _model_label(route, entry.model),
                                                   status, time.perf_counter() - entry.started, upstream.revision)
                await self._write(response)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                log.info("gRPC upstream stream to %s failed: %s %s", upstream.target, exc.code(), exc.details())
        except _CallerGone:
            return  # what it still owes is let go by the relay's end (_relay's `finally`)
        finally:
            upstream.writing = False
            if self.upstreams.get(upstream.target) is upstream:
                del self.upstreams[upstream.target]
        if upstream.pending:
            # Requests Triton never answered (it stopped or broke the stream): each gets an error, none is lost
            # silently; the next request opens a new stream.
            owed = list(upstream.pending)
            upstream.pending.clear()
            await self._fail(upstream, owed)

    async def _fail(self, upstream: _Upstream, entries: list[_Pending]) -> None:
        route = upstream.route
        for entry in entries:
            stats.IN_FLIGHT.labels(route.team, route.name).dec()
            self.gateway.collector.observe(route.deployment_id, route.team, route.name,
                                           _model_label(route, entry.model), 502,
                                           time.perf_counter() - entry.started, upstream.revision)
            await self._write(grpc_protocol.stream_error_response(
                "Triton is unreachable or broke the stream before answering; the deployment may be restarting. "
                "Retry this request.", entry.model, entry.request_id))

    async def _write(self, message: bytes) -> None:
        async with self.write_lock:
            # grpc.aio's write returns once gRPC core has put the message on the connection, which waits for the
            # caller's HTTP/2 window and the socket (measured: a caller that reads nothing holds the write, and what
            # the gateway holds is this message; docs/security.md, "A slow reader"). One clock read per response,
            # and no timer of its own: the stream's watch (_check_sending) looks at `sending`.
            self.sending = now = self.loop.time()
            if self.watch is None:
                self.watch = self.loop.call_at(now + self.gateway.send_seconds, self._check_sending)
            try:
                await self.context.write(message)
            except Exception as exc:
                # The call is over: the caller cancelled it or went away while this waited (gRPC core fails the
                # write's batch), or a status was sent. Not a failure of the model's, nor a stream that completed.
                raise _CallerGone from exc
            finally:
                self.sending = 0.0

    def _check_sending(self) -> None:
        """The watch: a response handed to gRPC GATEWAY_STREAM_SEND_SECONDS ago and not yet taken ends the stream
        (the task running it is cancelled, and `run` ends it as a slow reader's); one still within its time is
        looked at again when its time is up; none waiting, the watch rests until the next write arms it. So it
        wakes at most once per GATEWAY_STREAM_SEND_SECONDS while responses flow."""
        self.watch = None
        since = self.sending
        if not since or self.slow_reader or self.task is None:
            return
        due = since + self.gateway.send_seconds
        if self.loop.time() < due:
            self.watch = self.loop.call_at(due, self._check_sending)
            return
        self.slow_reader = True
        self.task.cancel()

    async def _end_slow_reader(self) -> None:
        """End the call with a status. gRPC core queues it behind the responses the caller has not read (HTTP/2
        sends a stream's trailers after its data), so it reaches a caller that reads again and none that does not;
        grpcio has no way for a server to reset one call. Its completion is not awaited: the handler returns, and
        what stays is gRPC core's part of the call (the one response it was writing) until the caller reads, resets
        the call, its deadline passes or its connection closes."""
        send_seconds = self.gateway.send_seconds
        log.info("a gRPC stream's caller read nothing for %g s: ended", send_seconds)
        if self.context.done():
            return  # a status is on its way already (the stream was being ended, its status behind the responses)
        try:
            async with asyncio.timeout(0.05):  # time for core to take the batch, not for the caller to read it
                await self.context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, (
                    f"The stream's responses were not read for {send_seconds:g} s (GATEWAY_STREAM_SEND_SECONDS): "
                    "the stream was ended and its requests cancelled in Triton. Read a stream's responses as "
                    "they come."))
        except TimeoutError:
            pass  # the status waits in gRPC core; the call is over for the gateway (see grpcio's AbortError)


class _Handlers(grpc.GenericRpcHandler):
    """Every method of Triton's service goes to the gateway's handlers as raw bytes (no deserializer, no
    serializer); other services are not served (UNIMPLEMENTED), except the gateway's own health check."""

    def __init__(self, gateway: GrpcGateway) -> None:
        self.gateway = gateway
        self.stream = grpc.stream_stream_rpc_method_handler(_stream_behaviour(gateway))
        self.health = grpc.unary_unary_rpc_method_handler(_counted(gateway, gateway.health))
        self.known: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        path: str = handler_call_details.method  # type: ignore[attr-defined]
        if path == grpc_protocol.STREAM_METHOD:
            return self.stream
        if path == grpc_protocol.HEALTH_CHECK:
            return self.health
        if not path.startswith(grpc_protocol.PREFIX):
            return None
        handler = self.known.get(path)
        if handler is None:
            handler = grpc.unary_unary_rpc_method_handler(_unary_behaviour(self.gateway, path))
            if len(self.known) < 64:  # Triton's methods, not every name a client makes up
                self.known[path] = handler
        return handler


# Each handler counts its call as in progress on its connection, which the connection cap then never closes.

def _counted(gateway: GrpcGateway, handler: Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]
             ) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
    async def behaviour(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        peer = gateway.calls.begin(context.peer())
        try:
            return await handler(request, context)
        finally:
            gateway.calls.end(peer)

    return behaviour


def _unary_behaviour(gateway: GrpcGateway, path: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
    async def behaviour(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        peer = gateway.calls.begin(context.peer())  # as _counted does, without a coroutine more per call
        try:
            return await gateway.unary(path, request, context)
        finally:
            gateway.calls.end(peer)

    return behaviour


def _stream_behaviour(gateway: GrpcGateway) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]:
    async def behaviour(request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        peer = gateway.calls.begin(context.peer())
        try:
            await gateway.stream(context)  # reads with context.read()
        finally:
            gateway.calls.end(peer)

    return behaviour


def connection_caps() -> tuple[int, int]:
    """The cap at which connections idle longest are closed (gateway/grpc_connections.py), and gRPC core's own,
    twice it, at which new connections are refused: new connections are accepted between two sweeps up to that.
    Both within the open-files limit (raised to its hard limit here)."""
    configured = settings.GATEWAY_GRPC_MAX_CONNECTIONS
    room = connection_cap(2 * configured, raise_open_files_limit())
    return min(configured, max(1, room // 2)), room


def slow_client_options(shedding: bool = True) -> list[tuple[str, int]]:
    """gRPC core's own bounds on connections (docs/security.md, "Slow clients"): grpcio has no hook per accepted
    connection, so no count per client address; these bound what any client's connections hold. With `shedding`
    (the sweep of gateway/grpc_connections.py runs), core's cap is the sweep's headroom; without, it is the cap."""
    cap, room = connection_caps()
    return [
        # A connection that has not sent the HTTP/2 preface and its SETTINGS by then is closed (half-open
        # connections, half a preface); gRPC's default is 120 s.
        ("grpc.server_handshake_timeout_ms", _ms(settings.GATEWAY_GRPC_HANDSHAKE_TIMEOUT_SECONDS)),
        # Beyond this many open connections new ones are closed at once, before EMFILE fails everyone's calls.
        ("grpc.max_allowed_incoming_connections", room if shedding else cap),
        # A connection without calls this long is sent GOAWAY (clients reconnect on their next call).
        ("grpc.max_connection_idle_ms", _ms(settings.GATEWAY_GRPC_IDLE_SECONDS)),
        # A peer that vanished (no FIN: a cut cable, a killed VM) is found by a ping unanswered within 20 s.
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
    ]


def _ms(seconds: float) -> int:
    return _int32(int(seconds * 1000))


def _int32(value: int) -> int:
    return min(value, 2**31 - 1)  # gRPC's message size options are C ints; over 2 GiB it cannot go anyway


def _trace_metadata() -> tuple[tuple[str, str], ...] | None:
    """The `traceparent` metadata of an upstream stream call: the caller's stream's span (the current one, in the
    stream's task and the decoupled requests' tasks it starts), so that Triton's spans of its requests are its
    children; None with tracing off."""
    if tracing.tracer is None:
        return None
    parent = tracing.traceparent()
    return (("traceparent", parent.decode()),) if parent is not None else None


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if isinstance(value, str):
            out[key] = value
    return out


def _model_label(route: Route, model: str) -> str:
    # As over HTTP: only the deployment's own models get a time series of their own.
    if not model:
        return ""
    return model if model in route.models else stats.OTHER_MODEL


def _check_answer(response: bytes, contract: Contract, requested: list[str]) -> None:
    """A GrpcFailure (INTERNAL) naming the outputs a ModelInferResponse lacks, as the HTTP gateway answers."""
    declared = [t.name for t in contract.outputs]
    expected = declared if not requested else [n for n in requested if n in declared]
    got = grpc_protocol.answer_outputs(response)
    if got is None:
        return  # not Triton's message shape: nothing to judge by
    missing = [n for n in expected if n not in got]
    if missing:
        raise GrpcFailure(grpc.StatusCode.INTERNAL, missing_message(contract.model, missing, bool(requested)), 500)


def _with_id(message: str, entry: _Pending) -> str:
    return f"[request id: {entry.request_id}] {message}" if entry.request_id else message


def _reworded_stream_error(status: int, error: str, contract: Contract | None,
                           entry: _Pending, final: bool = False) -> tuple[int, bytes]:
    """Triton's error for one request of a stream in the words a unary call gets (gateway/contract.py: no operator
    advice, the shape the model takes, a model's fault without its internals), written as the gateway's own
    refusals in a stream are (naming the model and the request id). The request's id also stays in front of the
    message, as Triton writes it: tritonclient hands a stream's error to the callback as the message alone, and a
    client tells its answers apart by it."""
    status, message = reword(status, error, contract)
    return status, grpc_protocol.stream_error_response(_with_id(message, entry), entry.model, entry.request_id, final)


async def _abort(context: grpc.aio.ServicerContext, failure: GrpcFailure) -> NoReturn:
    if failure.retry_after:
        context.set_trailing_metadata((("retry-after", failure.retry_after),))
    await context.abort(failure.code, failure.message)
    raise AssertionError("context.abort() raises")
