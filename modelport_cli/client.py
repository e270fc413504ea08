"""The portal's REST API over `requests`: bearer auth, errors as one line, and retries of the requests that are
safe to repeat."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.auth import AuthBase

from modelport_cli import __version__
from modelport_cli.errors import CliError, ExitCode, one_line

CONNECT_TIMEOUT = 10.0
# Long enough for a chunk of a tus upload on a slow link and for a synchronous DELETE (the portal waits up to
# 20 s for Triton to stop).
READ_TIMEOUT = 120.0
# Delays before each retry of a request that is safe to repeat: a GET, or a POST that carries an Idempotency-Key.
RETRY_DELAYS: tuple[float, ...] = (0.5, 1.0, 2.0)
# What a proxy or load balancer in front of the portal answers while the portal restarts.
RETRY_STATUSES = frozenset({502, 503, 504})


class ApiError(CliError):
    """The portal answered with an error status."""

    def __init__(self, status: int, code: str, message: str, fields: dict[str, list[str]], method: str,
                 path: str) -> None:
        # A 404 is a name on the command line that the token's team does not have: a wrong name (2), as --help
        # says, not a refusal (1); a CI job tells a typo from a broken portal by the code.
        super().__init__(f"{message} (HTTP {status} from {method} {path})",
                         ExitCode.USAGE if status == 404 else ExitCode.ERROR)
        self.status = status
        self.api_code = code  # the portal's error code; `code` is the exit code
        self.reason = message
        self.fields = fields


class NetworkError(CliError):
    """No HTTP answer at all: refused, reset, timed out, name not found."""


class _BearerAuth(AuthBase):
    # An auth object rather than a default header: with none, requests would take credentials from ~/.netrc and
    # replace the token with them.
    def __init__(self, token: str) -> None:
        self.token = token

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self.token}"
        return request


class Client:
    def __init__(self, base_url: str, token: str, session: requests.Session | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session or requests.Session()
        self.session.auth = _BearerAuth(token)
        self.session.headers["User-Agent"] = f"modelport-cli/{__version__}"

    def url(self, path_or_url: str) -> str:
        if path_or_url.startswith(("http://", "https://")):
            return path_or_url
        return self.base_url + path_or_url

    def send(self, method: str, path_or_url: str, *, headers: dict[str, str] | None = None, data: Any = None,
             json: Any = None, params: dict[str, Any] | None = None, stream: bool = False) -> requests.Response:
        """One request, whatever the status; a failure without an answer becomes NetworkError. `stream`: the body
        is left unread (read it with read_at_most)."""
        url = self.url(path_or_url)
        try:
            return self.session.request(method, url, headers=headers, data=data, json=json, params=params,
                                        timeout=(CONNECT_TIMEOUT, READ_TIMEOUT), stream=stream)
        except requests.RequestException as exc:
            raise NetworkError(describe_network_error(exc, method, url)) from exc

    def call(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None,
             idempotency_key: bool | None = None, stream: bool = False, data: bytes | None = None,
             headers: dict[str, str] | None = None) -> requests.Response:
        """An API call that raises ApiError for a 4xx/5xx. POSTs carry an Idempotency-Key (unless told not to), so
        that one retried after a lost answer is not applied twice; the same key is sent on every retry. `data`: a
        body of bytes instead of `json`, with its `headers` (Content-Type)."""
        headers = dict(headers or {})
        if idempotency_key is None:
            idempotency_key = method == "POST"
        if idempotency_key:
            headers["Idempotency-Key"] = str(uuid.uuid4())
        retry = method in ("GET", "HEAD") or idempotency_key
        for attempt in range(len(RETRY_DELAYS) + 1):
            last = attempt == len(RETRY_DELAYS)
            try:
                response = self.send(method, path, headers=headers, data=data, json=json, params=params,
                                     stream=stream)
            except NetworkError:
                if not retry or last:
                    raise
            else:
                if response.status_code < 400:
                    return response
                if not retry or last or response.status_code not in RETRY_STATUSES:
                    raise api_error(response)
            time.sleep(RETRY_DELAYS[attempt])
        raise AssertionError("unreachable")

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self.call("GET", path, params=params).json()


def read_at_most(response: requests.Response, max_bytes: int) -> bytes:
    """The body of a streamed answer, refused past `max_bytes` so that an answer of any size costs no more memory
    than that."""
    data = bytearray()
    try:
        for chunk in response.iter_content(64 * 1024):
            data += chunk
            if len(data) > max_bytes:
                raise CliError(f"the portal's answer is over {max_bytes:,} bytes (GET {urlsplit(response.url).path}): "
                               "ask for fewer lines", ExitCode.ERROR)
    except requests.RequestException as exc:
        raise NetworkError(f"the answer was cut off: {exc}") from exc
    finally:
        response.close()
    return bytes(data)


def api_error(response: requests.Response) -> ApiError:
    """The portal's {"error": {"code", "message", "fields"}} as one line; also copes with Triton's {"error": "..."},
    DRF's {"detail": "..."} and a proxy's HTML page."""
    method = (response.request.method if response.request is not None else None) or "?"
    path = urlsplit(response.url).path if response.url else "?"
    code, message, fields = "", "", {}
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            code = str(error.get("code") or "")
            message = str(error.get("message") or "")
            raw_fields = error.get("fields") or {}
            if isinstance(raw_fields, dict):
                fields = {str(k): [str(m) for m in (v if isinstance(v, list) else [v])] for k, v in raw_fields.items()}
        elif isinstance(error, str):
            message = error
        elif "detail" in body:
            message = str(body["detail"])
    elif response.text and "text/plain" in response.headers.get("Content-Type", ""):
        message = response.text[:300]
    # The portal's message names the fields already; add only what it left out.
    missing = [f"{name}: {' '.join(msgs)}" for name, msgs in fields.items() if " ".join(msgs) not in message]
    message = "; ".join(part for part in [message, *missing] if part) or response.reason or "request failed"
    if response.status_code == 401:
        message += " (check MODELPORT_TOKEN or --token)"
    return ApiError(response.status_code, code, one_line(message), fields, method, path)


def describe_network_error(exc: BaseException, method: str, url: str) -> str:
    where = f"{method} {url}"
    if isinstance(exc, requests.Timeout):
        return f"no answer from the portal within {READ_TIMEOUT:g} s ({where})"
    return f"cannot reach the portal: {_root_reason(exc)} ({where})"


def _root_reason(exc: BaseException) -> str:
    """The useful part of a requests/urllib3 exception chain, e.g. "Connection refused"."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    deepest = exc
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        deepest = current
        if isinstance(current, OSError) and current.strerror:
            return str(current.strerror)
        for nested in (getattr(current, "reason", None), current.__cause__, current.__context__, *current.args):
            if isinstance(nested, BaseException):
                stack.append(nested)
    # urllib3 puts object reprs into its messages: "<HTTPConnection object at 0x7f..>: Failed to ..."
    text = re.sub(r"<[^>]* at 0x[0-9a-f]+>:?\s*", "", str(deepest)) or type(deepest).__name__
    return one_line(text)
