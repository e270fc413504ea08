"""Chat templates: how an OpenAI chat request's messages become a text model's one `text_input` (issue 33).

A version may carry a Jinja chat template, uploaded beside the model (`chat_template`), rendered as Hugging Face's
transformers renders one (`apply_chat_template`): Jinja's `ImmutableSandboxedEnvironment` with `trim_blocks` and
`lstrip_blocks`, the `loopcontrols` extension, `raise_exception(message)` for a template that refuses a conversation,
and the variables `messages` (a list of `{"role", "content"}`), `add_generation_prompt` (true: end with the
assistant's turn opened), `bos_token` and `eos_token` (empty: the gateway knows no tokenizer). A version without one
gets DEFAULT_TEMPLATE.

The template is the team's code running in the gateway every team shares, so the sandbox is not the only bound
(docs/security.md, "Chat templates"):
- Python's internals are out of reach: the sandbox refuses attributes that start with an underscore and the
  functions that would reach them (`''.__class__.__mro__`, `cycler.__init__.__globals__`); the immutable sandbox
  refuses the methods that change a list or dict.
- Time: RENDER_SECONDS, checked on every line of the compiled template, every call and every filter it makes (a
  trace function in the rendering thread), so nested loops, recursive macros and `range()` chains end in an error.
- Size: MAX_OUTPUT_CHARS for what it writes and for any value it builds. Every operator that can make a large value
  from a small one (`*`, `**`, `+`, `%`), every call and filter, and every `namespace` assignment is checked
  before or as the value is made, so `'x' * 10**9`, `'x'|center(10**9)` or doubling a string in a loop is refused
  before it takes the memory.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from functools import wraps
from types import FrameType
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

MAX_TEMPLATE_BYTES = 64 * 1024
MAX_OUTPUT_CHARS = 1024 * 1024
RENDER_SECONDS = 0.5
TEMPLATE_NAME = "<chat template>"
# Used when a version has no chat template: each message on its own lines as "role: content", then the assistant's
# turn opened. Readable by any text model, and what a model trained on plain dialogue continues naturally.
DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
# A width or precision in a format string ("%999999999s", "{:>999999999}") makes a string that large at once.
_LARGE_WIDTH = re.compile(r"\d{7,}")
_MAX_EXPONENT = 4096


class TemplateRejected(ValueError):
    """A chat template that does not compile, or is too large: the upload names the line."""


class RenderFailed(Exception):
    """The template could not turn these messages into a prompt: it refused them, failed, or went past a bound."""


def _too_large(what: str) -> RenderFailed:
    return RenderFailed(f"The chat template made {what} over the limit of {MAX_OUTPUT_CHARS} characters.")


def _check_size(value: Any) -> Any:
    if isinstance(value, str | bytes | list | tuple | dict) and len(value) > MAX_OUTPUT_CHARS:
        raise _too_large("a value")
    return value


def _check_arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_OUTPUT_CHARS:
            raise RenderFailed(f"The chat template passed the number {value}, over the limit of {MAX_OUTPUT_CHARS} "
                               "for a width, count or length.")
        _check_size(value)


class _Deadline:
    """The rendering thread's deadline, checked by a trace function on every line of the compiled template."""

    def __init__(self, seconds: float) -> None:
        self.ends = time.monotonic() + seconds
        self.seconds = seconds

    def check(self) -> None:
        if time.monotonic() > self.ends:
            raise RenderFailed(f"The chat template took more than {self.seconds:g} s to render; it was stopped.")

    def trace(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        self.check()
        if frame.f_code.co_filename == TEMPLATE_NAME:
            return self.trace_lines
        return None

    def trace_lines(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        self.check()
        return self.trace_lines


class _BoundedNamespace(Namespace):
    def __setitem__(self, name: str, value: Any) -> None:
        Namespace.__setitem__(self, name, _check_size(value))


def _bounded_filter(function: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_arguments(args, kwargs)
        if function.__name__ == "do_format" and args and isinstance(args[0], str) and _LARGE_WIDTH.search(args[0]):
            raise _too_large("a format width")
        return _check_size(function(*args, **kwargs))

    return bounded


def _raise_exception(message: Any) -> None:
    raise jinja2.TemplateError(str(message))


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context: Any, op: str, left: Any, right: Any) -> Any:
        if op == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(count, int) \
                        and len(seq) * count > MAX_OUTPUT_CHARS:
                    raise _too_large("a repeated value")
        elif op == "**":
            if isinstance(right, int) and abs(right) > _MAX_EXPONENT:
                raise RenderFailed(f"The chat template raised a number to the power {right}, over {_MAX_EXPONENT}.")
        elif op == "%" and isinstance(left, str) and _LARGE_WIDTH.search(left):
            raise _too_large("a format width")
        elif op == "+" and isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
            if len(left) + len(right) > MAX_OUTPUT_CHARS:
                raise _too_large("a joined value")
        return _check_size(self.binop_table[op](left, right))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        # A string's format method, as the sandbox hands it to the template: its widths are checked first.
        owner = getattr(value, "__self__", None)
        if isinstance(owner, str) and getattr(value, "__name__", "") in ("format", "format_map") \
                and _LARGE_WIDTH.search(owner):
            raise _too_large("a format width")
        return super().wrap_str_format(value)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _check_arguments(args, kwargs)
        return _check_size(super().call(__context, __obj, *args, **kwargs))


def _environment() -> _BoundedEnvironment:
    environment = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols],
                                      autoescape=False)
    environment.filters = {name: _bounded_filter(f) for name, f in environment.filters.items()}
    environment.globals["namespace"] = _BoundedNamespace
    environment.globals["raise_exception"] = _raise_exception
    environment.globals.pop("lipsum", None)
    return environment


_ENVIRONMENT = _environment()


def compile_template(source: str) -> jinja2.Template:
    """The compiled template; TemplateRejected naming the line of a syntax error, or the size."""
    size = len(source.encode("utf-8"))
    if size > MAX_TEMPLATE_BYTES:
        raise TemplateRejected(f"The chat template is {size} bytes; the limit is {MAX_TEMPLATE_BYTES} bytes.")
    try:
        code = _ENVIRONMENT.compile(source, name=None, filename=TEMPLATE_NAME)
        return _ENVIRONMENT.template_class.from_code(_ENVIRONMENT, code, _ENVIRONMENT.make_globals(None))
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateRejected(f"The chat template does not compile: line {exc.lineno}: {exc.message}") from None


def render(template: jinja2.Template, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True,
           seconds: float = RENDER_SECONDS) -> str:
    """The prompt the template makes of `messages`, within `seconds` and MAX_OUTPUT_CHARS; RenderFailed saying
    why not. Meant for a worker thread: it sets that thread's trace function for the render's duration."""
    deadline = _Deadline(seconds)
    previous = sys.gettrace()
    sys.settrace(deadline.trace)
    try:
        parts: list[str] = []
        written = 0
        for part in template.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                      bos_token="", eos_token=""):
            written += len(part)
            if written > MAX_OUTPUT_CHARS:
                raise _too_large("a prompt")
            parts.append(part)
        return "".join(parts)
    except RenderFailed:
        raise
    except jinja2.TemplateError as exc:
        raise RenderFailed(f"The chat template refused the messages: {_short(exc)}") from None
    except RecursionError:
        raise RenderFailed("The chat template recursed too deeply; it was stopped.") from None
    except Exception as exc:  # the template's own fault (a TypeError, a ZeroDivisionError): its words, short
        raise RenderFailed(f"The chat template failed on these messages: {type(exc).__name__}: {_short(exc)}") from None
    finally:
        sys.settrace(previous)


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 300 else text[:300] + "..."


__all__ = ["DEFAULT_TEMPLATE", "MAX_OUTPUT_CHARS", "MAX_TEMPLATE_BYTES", "RENDER_SECONDS", "RenderFailed",
           "TemplateRejected", "compile_template", "render"]
