"""The OpenAI-shaped answers: a whole chat completion or text completion, the chunks of a streamed one, the model
list and errors. Plain functions of values to JSON bytes.

`usage` (the gateway knows no model's tokenizer, so it counts what it can see, the same way every time):
completion_tokens is the number of pieces the model sent, the elements of its text_output (one per response, or
several in one when the model's sending fell behind; the sample text generator's max_tokens counts pieces, so the two
agree); prompt_tokens is the number of whitespace-separated words of the prompt as the model got it (after
the chat template), an approximation of a tokenizer's count; total_tokens is their sum.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.openai.requests import Generation, OpenAIError

DONE = b"data: [DONE]\n\n"
_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
          404: "invalid_request_error", 405: "invalid_request_error", 413: "invalid_request_error",
          415: "invalid_request_error", 429: "rate_limit_error"}
_CODES = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def to_json(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def prompt_tokens(prompt: str) -> int:
    return len(prompt.split())


@dataclass(frozen=True)
class Answer:
    """What one answer's chunks share: its id, creation time and model."""

    request: Generation
    id: str
    created: int

    @classmethod
    def start(cls, request: Generation) -> Answer:
        prefix = "chatcmpl-" if request.chat else "cmpl-"
        return cls(request, prefix + secrets.token_hex(12), int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion" if self.request.chat else "text_completion"

    def finish_reason(self, pieces: int) -> str:
        limit = self.request.max_tokens
        return "length" if limit is not None and pieces >= limit else "stop"

    def whole(self, text: str, usage: Usage) -> bytes:
        """The answer not streamed: every piece joined."""
        reason = self.finish_reason(usage.completion_tokens)
        choice: dict[str, Any]
        if self.request.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                      "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return _json({"id": self.id, "object": self.object, "created": self.created, "model": self.request.model,
                      "system_fingerprint": None, "choices": [choice], "usage": usage.to_json()})

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False) -> bytes:
        """One streamed event: a piece (`text`), the chat's opening role (`first`), or the end (`finish_reason`)."""
        choice: dict[str, Any]
        if self.request.chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
            kind = "text_completion"
        data: dict[str, Any] = {"id": self.id, "object": kind, "created": self.created, "model": self.request.model,
                                "system_fingerprint": None, "choices": [choice]}
        if self.request.include_usage:
            data["usage"] = None  # as OpenAI sends it: only the last chunk carries the usage
        return event(data)

    def usage_chunk(self, usage: Usage) -> bytes:
        kind = "chat.completion.chunk" if self.request.chat else "text_completion"
        return event({"id": self.id, "object": kind, "created": self.created, "model": self.request.model,
                      "system_fingerprint": None, "choices": [], "usage": usage.to_json()})


def event(data: Any) -> bytes:
    return b"data: " + _json(data) + b"\n\n"


def models_list(names: Iterable[str], created: int, owner: str) -> bytes:
    return _json({"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": owner}
                                             for name in sorted(names)]})


def model_entry(name: str, created: int, owner: str) -> bytes:
    return _json({"id": name, "object": "model", "created": created, "owned_by": owner})


def error_body(error: OpenAIError) -> bytes:
    return _json({"error": error_object(error)})


def error_object(error: OpenAIError) -> dict[str, Any]:
    kind = _TYPES.get(error.status, "server_error" if error.status >= 500 else "invalid_request_error")
    code = error.code or _CODES.get(error.status)
    return {"message": error.message, "type": kind, "param": error.param, "code": code}


def error_event(error: OpenAIError) -> bytes:
    """An error after the stream began: the SDK raises an APIError for an event whose data holds "error"."""
    return event({"error": error_object(error)})


def _json(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
