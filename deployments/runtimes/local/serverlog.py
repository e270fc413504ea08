"""A local tritonserver's log: written through a keeper that bounds it on disk (logkeeper.py), and read back within
bytes as well as lines for its errors and its tail.

Plain functions, no Django: callers pass paths and limits in.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from deployments import logtail
from deployments.runtimes.local import logkeeper

# Triton log lines start "E1129 12:34:56.789012 4242 file.cc:123] message"; I/W/E give the severity.
_LOG_PREFIX_RE = logtail.TRITON_LINE_RE
# The model status table Triton prints when models fail: "| name | 1 | UNAVAILABLE: Internal: ... |".
_UNAVAILABLE_RE = re.compile(r"^\|\s*(\S+)\s*\|\s*(\d+)\s*\|\s*(UNAVAILABLE: .*?)\s*\|?\s*$")
MAX_ERROR_LINES = 40
# What a server's log may take on disk (settings.TRITON_LOG_MAX_BYTES), and how much of it is read for its errors.
DEFAULT_LOG_MAX_BYTES = 64 * 1024**2
# The pipe from Triton to its log keeper: room for a burst while the keeper is descheduled (Linux lets an
# unprivileged process go up to /proc/sys/fs/pipe-max-size, 1 MiB by default).
_LOG_PIPE_BYTES = 1024**2
# What the python-backend stub wrapper writes when it cannot confine a model (modelport/core/sandbox/stub.py); Triton
# itself then waits for the stub until the ready timeout, so the runtime looks for this line.
SANDBOX_ERROR_PREFIX = "modelport sandbox: "
# Error lines every start on a machine without a GPU prints; they say nothing about the models.
_HARMLESS = (
    "CudaDriverHelper has not been initialized",
    "Failed to initialize NVML",
    "DCGM unable to start",
    "Unable to allocate pinned system memory",
)

# The log keepers this process started (they exit after their server), reaped alongside.
_keepers: list[subprocess.Popen[bytes]] = []


def reap_keepers() -> None:
    """Collect the log keepers that have ended (each ends after its server), so no zombie is left."""
    _keepers[:] = [keeper for keeper in _keepers if keeper.poll() is None]


def wait_log_written(log_path: Path, timeout: float = 2.0) -> bool:
    """For a server that exited: wait (at most `timeout` s) until its log keeper has written what was still in the
    pipe and ended, so that its last words (why it failed) are in the file. Found through /proc, since the keeper
    may have been started by another process. False when it was still writing at the timeout."""
    wanted = [str(Path(logkeeper.__file__).resolve()).encode(), str(log_path).encode()]
    deadline = time.monotonic() + timeout
    while True:
        if not any(_is_keeper(entry, wanted) for entry in Path("/proc").iterdir() if entry.name.isdigit()):
            return True
        reap_keepers()
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _is_keeper(entry: Path, wanted: list[bytes]) -> bool:
    try:
        args = (entry / "cmdline").read_bytes().split(b"\0")
        state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return args[3:5] == wanted and state not in ("Z", "X")


def log_files(log_path: Path) -> list[Path]:
    """The files a server's log is in, oldest first: the one the keeper rotated, then the current one."""
    log_path = Path(log_path)
    return [log_path.with_name(logkeeper.rotated(log_path.name)), log_path]


@contextmanager
def log_writer(log_path: Path, max_bytes: int) -> Iterator[Any]:
    """The write end of a pipe to a log keeper (deployments/runtimes/local/logkeeper.py) that appends to `log_path`
    and keeps it and its rotated file within `max_bytes`: a model that prints gigabytes cannot fill the disk through
    its log. Give it to the server as stdout and stderr; this process' copy is closed on leaving, so the keeper ends
    when the server and everything that inherited it have."""
    log_path.write_bytes(b"")  # readers find the file at once, empty; a leftover rotated file is stale
    log_path.with_name(logkeeper.rotated(log_path.name)).unlink(missing_ok=True)
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    try:
        try:
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, _LOG_PIPE_BYTES)
        except OSError:
            pass  # the default 64 KiB: the keeper keeps up anyway, a burst waits a moment
        keeper = subprocess.Popen(
            [sys.executable, "-I", "-S", str(Path(logkeeper.__file__).resolve()), str(log_path), str(max_bytes)],
            stdin=read_fd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={}, cwd="/",
            start_new_session=True, close_fds=True,
        )
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    _keepers.append(keeper)
    with os.fdopen(write_fd, "wb", buffering=0) as log:
        yield log


def is_triton_line(line: str) -> bool:
    """Whether `line` is one Triton itself wrote (`I1201 14:45:15.484194 1 file.cc:472] "..."`, its message JSON-
    quoted), not a line a model's process printed on the log's stderr (onnxruntime's warnings, a model.py's prints),
    whose words the model's uploader chose."""
    return _LOG_PREFIX_RE.match(line) is not None


def log_errors(log_path: Path, limit: int = MAX_ERROR_LINES, *, max_bytes: int = logtail.DEFAULT_MAX_BYTES,
               line_max: int = logtail.DEFAULT_LINE_MAX) -> list[str]:
    """Triton's error messages in the last `max_bytes` of the log, without the timestamp prefix, each line cut to
    `line_max`; multi-line messages stay whole."""
    errors: list[str] = []
    current: list[str] | None = None
    for raw in _read_lines(log_path, max_bytes, line_max):
        line = raw.rstrip("\n")
        prefix = _LOG_PREFIX_RE.match(line)
        table_row = _UNAVAILABLE_RE.match(line)
        if prefix:
            _flush(errors, current)
            current = [line[prefix.end() :]] if prefix.group(1) == "E" else None
        elif table_row:
            _flush(errors, current)
            current = None
            name, version, status = table_row.groups()
            errors.append(f"model '{name}' version {version}: {status}")
        elif line.startswith(("error: ", SANDBOX_ERROR_PREFIX)):
            _flush(errors, current)
            current = None
            errors.append(line)
        elif current is not None and line.strip() and not line.startswith(("+-", "|")):
            current.append(line)  # continuation of a multi-line error (a Python traceback, say)
    _flush(errors, current)
    unique = list(dict.fromkeys(errors))
    return unique[-limit:]


def tail_log(path: Path, lines: int = 100, *, max_bytes: int = logtail.DEFAULT_MAX_BYTES,
             line_max: int = logtail.DEFAULT_LINE_MAX) -> str:
    """The last `lines` lines of the log and its rotated file, at most `max_bytes` of them read, each cut to
    `line_max` ("" if it does not exist yet)."""
    return logtail.read_tail(log_files(path), lines, max_bytes=max_bytes, line_max=line_max)


def _read_lines(path: Path, max_bytes: int, line_max: int) -> list[str]:
    # As many lines as `max_bytes` can hold: the bound is the bytes.
    return tail_log(path, max_bytes, max_bytes=max_bytes, line_max=line_max).splitlines(keepends=True)


def _flush(errors: list[str], current: list[str] | None) -> None:
    if not current:
        return
    message = "\n".join(current).strip()
    # Triton 2.51 logs each message as a JSON string literal: decode it so newlines in tracebacks are real.
    if len(message) >= 2 and message[0] == message[-1] == '"':
        try:
            message = str(json.loads(message))
        except ValueError:
            pass
    if not any(noise in message for noise in _HARMLESS):
        errors.append(message.strip())


def summary_error(errors: Sequence[str]) -> str | None:
    """The error most worth showing first: Triton's "failed to load" line when there is one."""
    for error in errors:
        if "failed to load" in error and not error.startswith("error: "):
            return error
    return errors[0] if errors else None
