"""An OpenAI chat or completions request, parsed and checked into one typed value before anything else sees it.

What the deployment cannot honour is a 400 naming the parameter, never ignored: several choices (`n` > 1,
`best_of`), log probabilities, tools and functions, structured output, logit bias, penalties, audio and image
content, `echo` and `suffix`. A parameter this API does not know is a 400 too, in OpenAI's own words
("Unrecognized request argument supplied: ..."), as OpenAI answers one: the SDK's `extra_body` reaches the gateway
as such a field, so a misspelt or unsupported setting is never silently dropped. Values that mean "not set" (null,
the documented default, an empty list of tools) are accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_MESSAGES = 1024
MAX_STOPS = 4
MAX_INT64 = 2**63 - 1
ROLES = frozenset({"system", "developer", "user", "assistant"})


class OpenAIError(Exception):
    """An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def invalid(message: str, param: str | None) -> OpenAIError:
    return OpenAIError(400, message, param)


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    name: str = ""

    def to_template(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content, **({"name": self.name} if self.name else {})}


@dataclass(frozen=True)
class Generation:
    """One chat or completions request. `messages` is set for chat, `prompt` for completions."""

    chat: bool
    model: str
    messages: tuple[Message, ...] = ()
    prompt: str = ""
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None


# Parameters accepted only with the value that means "not used"; anything else is refused, naming it.
_UNUSED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}), "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
    "function_call": (None, "none"), "parallel_tool_calls": (None,), "audio": (None,), "prediction": (None,),
    "reasoning_effort": (None,), "web_search_options": (None,), "modalities": (None, ["text"]),
    "service_tier": (None, "auto", "default"), "store": (None, False), "verbosity": (None,),
}
_CHAT_UNUSED = {**_UNUSED, "logprobs": (None, False), "top_logprobs": (None,)}
_COMPLETION_UNUSED = {**_UNUSED, "logprobs": (None,), "echo": (None, False), "suffix": (None, ""),
                      "best_of": (None, 1)}
_WHY = {
    "n": "one choice per request: send n=1 or leave it out",
    "best_of": "one choice per request: send best_of=1 or leave it out",
    "logprobs": "the model gives no log probabilities",
    "top_logprobs": "the model gives no log probabilities",
    "tools": "the model calls no tools", "tool_choice": "the model calls no tools",
    "functions": "the model calls no functions", "function_call": "the model calls no functions",
    "parallel_tool_calls": "the model calls no tools",
    "response_format": 'the model writes plain text only: use {"type": "text"} or leave it out',
    "logit_bias": "the model takes no logit bias",
    "echo": "the answer never repeats the prompt", "suffix": "the model does not insert text",
}
_COMMON = frozenset({"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "stop", "seed",
                     "user", "metadata"})
_CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "response_format"} | _CHAT_UNUSED.keys()
_COMPLETION_FIELDS = _COMMON | {"prompt"} | _COMPLETION_UNUSED.keys()


def parse(body: Any, chat: bool) -> Generation:
    """The request of POST /v1/chat/completions (chat) or /v1/completions, or OpenAIError naming what to fix."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.", None)
    known = _CHAT_FIELDS if chat else _COMPLETION_FIELDS
    for key in body:
        if key not in known:
            raise invalid(f"Unrecognized request argument supplied: {str(key)[:100]}", str(key)[:100])
    for key, allowed in (_CHAT_UNUSED if chat else _COMPLETION_UNUSED).items():
        if key in body and not any(body[key] == a and type(body[key]) is type(a) or (a == 0 and _is_zero(body[key]))
                                   for a in allowed):
            raise invalid(f"'{key}' is not supported by this deployment: {_WHY.get(key, 'leave it out')}.", key)
    if chat and body.get("response_format") not in (None, {"type": "text"}):
        raise invalid(f"'response_format' is not supported by this deployment: {_WHY['response_format']}.",
                      "response_format")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required: the name of a model of this deployment (GET /v1/models lists them).",
                      "model")
    stream = _optional(body, "stream", bool) or False
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise invalid("'stream_options' is only allowed with stream: true.", "stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}:
            raise invalid("'stream_options' takes {\"include_usage\": true|false}.", "stream_options")
        include_usage = _optional(options, "include_usage", bool, "stream_options.include_usage") or False
    max_tokens = _optional_int(body, "max_tokens", 1, MAX_INT64)
    if chat:
        newer = _optional_int(body, "max_completion_tokens", 1, MAX_INT64)
        if newer is not None and max_tokens is not None and newer != max_tokens:
            raise invalid("Send one of 'max_tokens' and 'max_completion_tokens'.", "max_completion_tokens")
        max_tokens = newer if newer is not None else max_tokens
    temperature = _optional_number(body, "temperature", 0.0, 2.0)
    top_p = _optional_number(body, "top_p", 0.0, 1.0)
    if top_p is not None and top_p <= 0:
        raise invalid("'top_p' must be greater than 0 and at most 1.", "top_p")
    seed = _optional_int(body, "seed", 0, MAX_INT64)
    _optional(body, "user", str)
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise invalid("'metadata' must be an object of strings.", "metadata")
    return Generation(chat=chat, model=model, messages=_messages(body.get("messages")) if chat else (),
                      prompt="" if chat else _prompt(body.get("prompt")), stream=stream, include_usage=include_usage,
                      max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=_stop(body.get("stop")),
                      seed=seed)


def _is_zero(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


def _optional(data: Mapping[str, Any], key: str, kind: type, param: str | None = None) -> Any:
    value = data.get(key)
    if value is not None and not isinstance(value, kind):
        raise invalid(f"'{param or key}' must be {_KIND_WORDS[kind]}.", param or key)
    return value


_KIND_WORDS = {bool: "true or false", str: "a string"}


def _optional_int(data: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid(f"'{key}' must be an integer from {low} to {high}.", key)
    return value


def _optional_number(data: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise invalid(f"'{key}' must be a number from {low:g} to {high:g}.", key)
    return float(value)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > MAX_STOPS:
        raise invalid(f"'stop' must be a string or a list of at most {MAX_STOPS} strings.", "stop")
    return tuple(s for s in stops if s)


def _messages(value: Any) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise invalid("'messages' must be a non-empty list of {\"role\", \"content\"} objects.", "messages")
    if len(value) > MAX_MESSAGES:
        raise invalid(f"'messages' has {len(value)} messages; this deployment takes at most {MAX_MESSAGES}.",
                      "messages")
    return tuple(_message(m, f"messages[{i}]") for i, m in enumerate(value))


def _message(value: Any, where: str) -> Message:
    if not isinstance(value, dict):
        raise invalid(f"'{where}' must be an object with 'role' and 'content'.", where)
    for key in value:
        if key not in ("role", "content", "name"):
            what = "tool calls" if key in ("tool_calls", "tool_call_id", "function_call") else "it"
            raise invalid(f"'{where}.{str(key)[:50]}' is not supported by this deployment (the model takes text "
                          f"messages only, without {what}).", f"{where}.{str(key)[:50]}")
    role = value.get("role")
    if role == "tool" or role == "function":
        raise invalid(f"'{where}.role' {role!r} is not supported: the model calls no tools.", f"{where}.role")
    if role not in ROLES:
        raise invalid(f"'{where}.role' must be one of {', '.join(sorted(ROLES))}.", f"{where}.role")
    name = value.get("name")
    if name is not None and not isinstance(name, str):
        raise invalid(f"'{where}.name' must be a string.", f"{where}.name")
    return Message(role=role, content=_content(value.get("content"), f"{where}.content"), name=name or "")


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        raise invalid(f"'{where}' is required: the message's text.", where)
    if not isinstance(value, list):
        raise invalid(f"'{where}' must be a string or a list of text parts.", where)
    texts = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise invalid(f"'{where}[{i}]' is a {str(kind)[:30]!r} part: this deployment takes text parts only "
                          '({"type": "text", "text": ...}).', f"{where}[{i}].type")
        if not isinstance(part.get("text"), str):
            raise invalid(f"'{where}[{i}].text' must be a string.", f"{where}[{i}].text")
        texts.append(part["text"])
    return "".join(texts)


def _prompt(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) > 1 and all(isinstance(p, str) for p in value):
        raise invalid("'prompt' is a list of several prompts: this deployment takes one prompt per request.",
                      "prompt")
    raise invalid("'prompt' must be a string (token ids are not supported: the gateway knows no tokenizer).",
                  "prompt")
