"""The ASGI handler of `/serve/<deployment>/v1/...`: the caller and deployment are the gateway's (gateway/app.py
found them as for /v2), the rest is here. The same admission as /v2 (gateway/admission.py: rate limit, revision
and canary choice, the model's 404, the shared pool, cold start, the model's contract), the same body bounds as a
generate request, then one call to Triton's `/v2/models/<model>/generate_stream`, streamed or not:

- Always the stream endpoint: Triton's /generate refuses a model that sends several responses (a decoupled model
  with stream=false may still send several pieces), and its stream answers a model that sends one as well. Not
  streamed, the pieces are joined within GATEWAY_MAX_RESPONSE_BYTES; streamed, each piece becomes a chunk as it
  arrives, within the relay's bounds (gateway/events.py complete_events).
- A caller who goes away ends the upstream request (its connection is closed: Triton cancels).
- Chat messages are rendered through the version's chat template in a worker thread, bounded in time and size
  (modelport/core/chat_template.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import jinja2

from deployments import pool_names as pool_model_names
from gateway import admission, events, pool_names, scale_from_zero, stats, stream_figures, upstream
from gateway import contract as contracts
from gateway.access import Caller, Choice, Route
from gateway.openai import answers, inputs, requests
from gateway.openai.requests import Generation, OpenAIError
from gateway.protocol import Endpoint, Refusal, classify
from gateway.ratelimit import RateLimiter
from gateway.stream_figures import StreamFigures
from gateway.stream_slots import StreamSlots
from gateway.upstream import UpstreamError
from modelport.core import chat_template

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

CHAT = "v1/chat/completions"
COMPLETIONS = "v1/completions"
MODELS = "v1/models"
_JSON = (b"content-type", b"application/json")
# Renders run here, off the event loop: each is bounded by chat_template.RENDER_SECONDS, so two threads serve every
# team's renders (a hostile template holds one for half a second at most).
_RENDERERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="chat-template")
_LARGE_JSON = 256 * 1024  # bodies larger than this are parsed off the event loop


class Host(Protocol):
    """What the handler uses of the gateway (gateway/app.py Gateway)."""

    limiter: RateLimiter
    collector: stats.StatsCollector
    pool: upstream.Pool
    wakes: scale_from_zero.Wakes
    streams: StreamSlots
    stream_limits: events.Limits
    timeout: float
    max_response: int
    max_json: int

    async def read_json(self, receive: Receive, headers: dict[bytes, bytes], declared: int | None) -> bytes: ...

    def check_pool_json(self, pool_prefix: str, json_bytes: int) -> None: ...

    async def into_pool(self, route: Route, pooled: pool_names.Pooled, caller: Caller, raw_rest: bytes,
                        endpoint: Endpoint) -> bytes: ...


@dataclass
class Outcome:
    """What the gateway counts the request by, once known."""

    endpoint: Endpoint | None = None
    choice: Choice | None = None
    arrived: float = 0.0  # when the request reached the gateway (time.perf_counter()), a stream's TTFT's start


def is_openai_path(path: str) -> bool:
    """Whether a /serve/ path is the OpenAI-compatible API's (its errors take OpenAI's shape)."""
    parts = path.split("/", 4)
    return len(parts) > 3 and parts[3] == "v1"


def from_refusal(refusal: Refusal) -> OpenAIError:
    param = "model" if refusal.status == 404 else None
    return OpenAIError(refusal.status, refusal.message, param, headers=refusal.headers)


async def send_error(send: Send, error: OpenAIError, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = answers.error_body(error)
    headers = [_JSON, (b"content-length", b"%d" % len(body)), *(extra or [])]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    with contextlib.suppress(Exception):  # the client may be gone already
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def serve(host: Host, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, bytes],
                declared: int | None, caller: Caller, route: Route, raw_rest: bytes, outcome: Outcome) -> int:
    """Answer one request to /serve/<deployment>/v1/...; the status to count it by."""
    extra: list[tuple[bytes, bytes]] = []
    try:
        rest = raw_rest.decode("ascii").rstrip("/")
        method = scope["method"]
        if rest == MODELS or rest.startswith(MODELS + "/"):
            _method(method, "GET", rest)
            admission.rate_limit(host.limiter, caller)
            return await _models(send, route, rest[len(MODELS) + 1:])
        if rest not in (CHAT, COMPLETIONS):
            raise OpenAIError(404, f"Unknown path /v1/{rest[3:][:200]}: this deployment serves POST /v1/chat/"
                                   "completions, POST /v1/completions and GET /v1/models.")
        _method(method, "POST", rest)
        request = requests.parse(await _body(host, receive, headers, declared), chat=rest == CHAT)
        pinned = headers.get(b"modelport-revision")
        admitted = admission.admit(host.limiter, caller, route, request.model,
                                   pinned.decode("latin-1") if pinned is not None else None)
        outcome.choice = admitted.choice
        if admitted.choice is not None:
            extra = [(b"modelport-revision", b"%d" % admitted.choice.revision)]
        choice, pooled = admitted.taken()
        target = f"v2/models/{request.model}/generate_stream"
        endpoint = classify("POST", "/" + target)
        outcome.endpoint = endpoint
        contract = inputs.check_model(admission.contract(route, choice, request.model, endpoint.kind),
                                      request.model)
        prompt = await _prompt(request, contract)
        body = json.dumps(inputs.generate_body(request, prompt, contract), ensure_ascii=False).encode()
        if len(body) > host.max_json:
            raise OpenAIError(413, f"The prompt makes a request of {len(body)} bytes for the model; the limit is "
                                   f"{host.max_json} (GATEWAY_MAX_JSON_BYTES).", "messages" if request.chat
                              else "prompt")
        raw_target = target.encode("ascii")
        prefix = ""
        if pooled is not None:
            host.check_pool_json(pooled.prefix, len(body))
            raw_target = await host.into_pool(route, pooled, caller, raw_target, endpoint)
            prefix = pooled.prefix
        else:
            await scale_from_zero.wake(host.wakes, route, choice, caller.team_id)  # scaled to zero: held meanwhile
        call = _Call(host, receive, send, request, prompt, contract, prefix, extra)
        in_flight = host.collector.in_flight(route.team, route.name)
        in_flight.inc()
        try:
            if request.stream:
                call.figures = functools.partial(
                    host.collector.stream, route.deployment_id, route.team, route.name, choice.revision,
                    outcome.arrived, model=request.model if request.model in route.models else stats.OTHER_MODEL)
                with host.streams.hold(caller.team_id, caller.team_name):
                    return await call.run(choice.upstream, raw_target, body)
            return await call.run(choice.upstream, raw_target, body)
        finally:
            in_flight.dec()
    except OpenAIError as exc:
        await send_error(send, exc, extra)
        return exc.status
    except Refusal as exc:
        await send_error(send, from_refusal(exc), extra)
        return exc.status


def _method(method: str, allowed: str, rest: str) -> None:
    if method != allowed and not (allowed == "GET" and method == "HEAD"):
        raise OpenAIError(405, f"/{rest} takes {allowed}, not {method}.", headers={"Allow": allowed})


async def _models(send: Send, route: Route, one: str) -> int:
    """The deployment's models (the serving revision's and a canary's), in OpenAI's list shape, or one of them."""
    names = set(route.models_of(route.revision)) | set(route.models_of(route.canary_revision))
    created = 0
    if one:
        if one not in names:
            raise OpenAIError(404, f"The model '{one[:200]}' does not exist in deployment '{route.name}'.", "model")
        body = answers.model_entry(one, created, route.team)
    else:
        body = answers.models_list(names, created, route.team)
    await send({"type": "http.response.start", "status": 200,
                "headers": [_JSON, (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})
    return 200


async def _body(host: Host, receive: Receive, headers: dict[bytes, bytes], declared: int | None) -> Any:
    """The request's JSON, read and bounded as a generate request's is (size, depth), then parsed."""
    try:
        raw = await host.read_json(receive, headers, declared)
    except Refusal as exc:
        raise OpenAIError(exc.status, exc.message.replace("generate request", "request")) from None
    if len(raw) > _LARGE_JSON:
        return await asyncio.to_thread(json.loads, raw)
    return json.loads(raw)


@functools.lru_cache(maxsize=256)
def _compiled(source: str) -> jinja2.Template:
    return chat_template.compile_template(source)


def _render(source: str, messages: list[dict[str, str]]) -> str:
    return chat_template.render(_compiled(source), messages, add_generation_prompt=True)


async def _prompt(request: Generation, contract: contracts.Contract) -> str:
    if not request.chat:
        return request.prompt
    source = contract.chat_template or chat_template.DEFAULT_TEMPLATE
    messages = [m.to_template() for m in request.messages]
    try:
        return await asyncio.get_running_loop().run_in_executor(_RENDERERS, _render, source, messages)
    except (chat_template.RenderFailed, chat_template.TemplateRejected) as exc:
        raise OpenAIError(400, f"Model '{contract.model}': {exc}", "messages") from None


class _Call:
    """One upstream call and the answer made of its events."""

    def __init__(self, host: Host, receive: Receive, send: Send, request: Generation, prompt: str,
                 contract: contracts.Contract, prefix: str, extra: list[tuple[bytes, bytes]]) -> None:
        self.host, self.receive, self.send, self.prompt = host, receive, send, prompt
        self.request, self.contract, self.prefix, self.extra = request, contract, prefix, extra
        self.answer = answers.Answer.start(request)
        self.started = False  # whether the answer's head went out
        # A streamed answer's figures (made once Triton's stream begins), how it ended, its bytes and its watch.
        self.figures: Callable[[], StreamFigures] | None = None
        self.ended = [stream_figures.COMPLETE]
        self.sent = 0
        self.sending = events.Sending()

    async def run(self, upstream_url: str, target: bytes, body: bytes) -> int:
        response: upstream.Response | None = None
        try:
            async with asyncio.timeout(self.host.timeout):
                response = await self.host.pool.request("POST", upstream_url, b"/" + target, [_JSON], body,
                                                        len(body))
                if response.status != 200 or not dict(response.headers).get(b"content-type", b"").startswith(
                        b"text/event-stream"):
                    raise self._upstream_error(response.status, await response.read(self.host.max_response))
            return await _until_gone(self.receive, self._answer(response))
        except TimeoutError:
            raise OpenAIError(504, f"Triton did not answer within {self.host.timeout:g} s.") from None
        except upstream.ResponseTooLarge:
            raise OpenAIError(502, "Triton's error answer is over the gateway's limit.") from None
        except UpstreamError:
            raise OpenAIError(502, "Triton is unreachable or broke the connection; the deployment may be restarting. "
                                   "Retry shortly.", headers={"Retry-After": "2"}) from None
        finally:
            if response is not None:
                response.close()  # a no-op after a complete read; otherwise Triton sees the request cancelled

    def _upstream_error(self, status: int, payload: bytes) -> OpenAIError:
        # A model's refusal of the first request (INVALID_ARG, e.g. the sample's max_tokens over its limit) comes as
        # a 400 whose body is one Server-Sent Event, `data: {"error": ...}`; Triton's own refusals as plain JSON.
        data = events.event_data(payload) if payload.startswith(b"data:") else None
        try:
            message = str((data if isinstance(data, dict) else json.loads(payload))["error"])
        except (ValueError, TypeError, KeyError):
            message = "Triton answered with an error."
        return self._error(status if status >= 400 else 502, message)

    def _error(self, status: int, message: str) -> OpenAIError:
        if self.prefix:
            message = pool_model_names.without_names(message, self.prefix)
        status, message = contracts.reword(status, message, self.contract)
        return OpenAIError(status, message)

    async def _answer(self, response: upstream.Response) -> int:
        pieces = self._pieces(response)
        try:
            if self.request.stream:
                return await self._stream(pieces)
            return await self._whole(pieces)
        finally:
            await pieces.aclose()

    async def _pieces(self, response: upstream.Response) -> AsyncGenerator[tuple[str, int], None]:
        """Each event's text and how many pieces it carries (a model whose sending fell behind sends several in one
        response, text_output [1, pieces]: a list in the event)."""
        async for raw in events.complete_events(response, self.host.stream_limits):
            data = events.event_data(raw, self.prefix)
            if not isinstance(data, dict):
                continue  # a comment or keep-alive line
            if "error" in data:
                raise self._error(500, str(data["error"]))
            output = data.get(inputs.TEXT_OUTPUT)
            text = _text(output)
            if text:
                yield text, len(output) if isinstance(output, list) else 1

    async def _whole(self, pieces: AsyncIterator[tuple[str, int]]) -> int:
        texts: list[str] = []
        size = count = 0
        try:
            async for text, carried in pieces:
                texts.append(text)
                count += carried
                size += len(text)
                if size > self.host.max_response:
                    raise OpenAIError(502, f"The model's answer is over the gateway's limit of "
                                           f"{self.host.max_response} bytes (GATEWAY_MAX_RESPONSE_BYTES): ask for "
                                           "fewer max_tokens, or stream it.")
        except events.EventsFailed as exc:
            raise OpenAIError(exc.code, exc.message) from None
        usage = answers.Usage(answers.prompt_tokens(self._prompt_text()), count)
        body = self.answer.whole("".join(texts), usage)
        await self.send({"type": "http.response.start", "status": 200,
                         "headers": [_JSON, (b"content-length", b"%d" % len(body)), *self.extra]})
        await self.send({"type": "http.response.body", "body": body})
        return 200

    async def _stream(self, pieces: AsyncIterator[tuple[str, int]]) -> int:
        """The chunks within the stream bounds of /generate_stream (gateway/events.py `watch`), counted in the
        deployment's stream figures as the relay's pieces are."""
        figures = self.figures() if self.figures is not None else None
        self.ended = [stream_figures.COMPLETE]
        try:
            return await events.watch(self._chunks(pieces, figures), None, self.send, self.host.stream_limits,
                                      self.sending, self.ended, _stream_error)
        finally:
            if figures is not None:
                figures.ended(self.ended[0])

    async def _chunks(self, pieces: AsyncIterator[tuple[str, int]], figures: StreamFigures | None) -> int:
        await self._out(None, [*events.STREAM_HEADERS, *self.extra])
        self.started = True
        count = 0
        try:
            if self.request.chat:
                await self._out(self.answer.chunk("", first=True))
            async for text, carried in pieces:
                count += carried
                await self._out(self.answer.chunk(text), figures=figures)
            await self._out(self.answer.chunk(None, self.answer.finish_reason(count)))
            if self.request.include_usage:
                await self._out(self.answer.usage_chunk(answers.Usage(answers.prompt_tokens(self._prompt_text()),
                                                                      count)))
            await self._out(answers.DONE)
        except (OpenAIError, events.EventsFailed) as exc:
            failed = exc if isinstance(exc, OpenAIError) else OpenAIError(exc.code, exc.message)
            self.ended[0] = exc.reason if isinstance(exc, events.EventsFailed) else stream_figures.MODEL_ERROR
            await self._out(_stream_error(failed.message, failed.status), bounded=False)
            await self._out(b"")
            return failed.status
        await self._out(b"")
        return 200

    async def _out(self, data: bytes | None, head: list[tuple[bytes, bytes]] | None = None, bounded: bool = True,
                   figures: StreamFigures | None = None) -> None:
        """One send of the stream (its head when `data` is None, its end when empty), watched for a slow reader;
        a chunk within GATEWAY_MAX_STREAM_BYTES, which raises EventsFailed past it."""
        limits = self.host.stream_limits
        if data and bounded:
            self.sent += len(data)
            if self.sent > limits.max_bytes:
                raise events.EventsFailed(events.too_many_bytes(limits), 502, stream_figures.LENGTH_BYTES)
        self.sending.since = now = time.perf_counter()
        if data is None:
            await self.send({"type": "http.response.start", "status": 200, "headers": head})
        else:
            await self.send({"type": "http.response.body", "body": data, "more_body": bool(data)})
        self.sending.since = 0.0
        if figures is not None and data:
            figures.piece(len(data), now)

    def _prompt_text(self) -> str:
        return self.prompt


def _stream_error(message: str, status: int) -> bytes:
    """An error after the stream began, in OpenAI's shape (the SDK raises an APIError for it)."""
    return answers.error_event(OpenAIError(status, message))


def _text(value: Any) -> str:
    """A text_output as Triton's generate endpoints write it: a string, or a list of them for a batched shape."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(v) for v in value)
    return ""


async def _until_gone(receive: Receive, answering: Coroutine[Any, Any, int]) -> int:
    """The answer's status, or 499 as soon as the caller goes away (the upstream connection is then closed)."""
    gone = asyncio.ensure_future(_wait_for_disconnect(receive))
    task = asyncio.ensure_future(answering)
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            return 499
        return task.result()
    except OSError:
        return 499
    finally:
        gone.cancel()
        task.cancel()


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


