"""Whether a local tritonserver is ready with its models: one look (probe, for the reconciler's ticks) or a wait
(for tools and tests), with Triton's own errors from its log when it is not.

Plain functions, no Django.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field

from deployments.runtimes.local.serverlog import log_errors, summary_error, wait_log_written
from deployments.runtimes.local.triton import ServerProcess, exit_status_pending, is_alive, reap


@dataclass(frozen=True)
class ReadyResult:
    ready: bool
    message: str  # one line for a status page
    errors: tuple[str, ...] = ()  # Triton's own error lines, for the user
    exit_code: int | None = None  # set when the server exited before it was ready
    waited_seconds: float = 0.0
    models_not_ready: tuple[str, ...] = field(default_factory=tuple)


def probe(server: ServerProcess, model_names: Iterable[str], waited: float = 0.0) -> ReadyResult:
    """One look, without waiting: is the server ready with every model, still loading, or gone?"""
    names = list(model_names)
    if not is_alive(server.pid):
        code = reap(server.pid, wait=2.0)
        wait_log_written(server.log_path)
        errors = tuple(log_errors(server.log_path))
        first = _first_line(summary_error(errors)) or f"see the log at {server.log_path}"
        return ReadyResult(
            ready=False,
            message=f"tritonserver exited (code {code}) before it was ready: {first}",
            errors=errors,
            exit_code=code,
            waited_seconds=waited,
            models_not_ready=tuple(names),
        )
    not_ready = names
    if _http_ok(server, "/v2/health/ready"):
        not_ready = [n for n in names if not _http_ok(server, f"/v2/models/{n}/ready")]
        if not not_ready:
            return ReadyResult(ready=True, message="ready", waited_seconds=waited)
    errors = tuple(log_errors(server.log_path))
    summary = _first_line(summary_error(errors))
    return ReadyResult(
        ready=False,
        message=summary or f"loading {', '.join(not_ready) or 'its models'}",
        errors=errors,
        waited_seconds=waited,
        models_not_ready=tuple(not_ready),
    )


def wait_ready(
    server: ServerProcess,
    model_names: Iterable[str],
    timeout: float,
    *,
    poll_interval: float = 0.2,
) -> ReadyResult:
    """Poll until the server and every model are ready, the server exits, or `timeout` seconds pass (for tools and
    tests; the reconciler probes once per tick instead)."""
    names = list(model_names)
    start = time.monotonic()
    while True:
        waited = time.monotonic() - start
        result = probe(server, names, waited)
        if result.ready or result.exit_code is not None:
            return result
        gone = not is_alive(server.pid)
        # Gone, but its exit status not collected yet (probe waits 2 s for it, for the reconciler's ticks): the
        # caller is told the code, so wait for it too, within the timeout.
        if gone and not exit_status_pending(server.pid):
            return result
        if waited >= timeout:
            if gone:
                return result
            return dataclasses.replace(result, message=f"not ready after {timeout:g} s"
                                       + (f": {result.message}" if result.errors else ""))
        time.sleep(poll_interval)


def model_stats(server: ServerProcess, model: str) -> dict[str, object]:
    """Triton's statistics for `model` (the first entry of /v2/models/<model>/stats)."""
    with urllib.request.urlopen(f"{server.http_url}/v2/models/{model}/stats", timeout=5) as response:
        data = json.load(response)
    stats: dict[str, object] = data["model_stats"][0]
    return stats


def _first_line(text: str | None) -> str | None:
    return text.strip().splitlines()[0] if text and text.strip() else None


def _http_ok(server: ServerProcess, path: str) -> bool:
    try:
        with urllib.request.urlopen(server.http_url + path, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
