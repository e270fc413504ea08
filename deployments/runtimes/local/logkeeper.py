"""Keeps a local Triton's log within a size: reads what Triton and its models write (a pipe on stdin) and appends it
to the log file, which it rotates once to `<log>.1` when the file reaches half of the limit, so both files together
never hold more than the limit.

Run as `python -I -S logkeeper.py LOG MAX_BYTES` by triton.start_server(), in a session of its own like the server
(it outlives the worker that started it and ends when every writer of the pipe has: Triton, its stubs, the sandbox
launcher). Standard library only, and nothing of the portal: the same file is imported by the tests.

It never stops reading: a full pipe would block Triton and the python models in their writes, so a write the disk
refuses (full, or the deployment's directory removed) is dropped, and a model writing gigabytes costs this process
CPU but neither the disk nor a stalled server.
"""

from __future__ import annotations

import os
import signal
import sys

CHUNK = 64 * 1024
MINIMUM_MAX_BYTES = 2 * CHUNK


def rotated(path: str) -> str:
    return path + ".1"


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    except OSError:
        return None


def keep(source: int, path: str, max_bytes: int) -> None:
    """Copy `source` to `path` until end of file, rotating at max_bytes / 2."""
    half = max(max_bytes, MINIMUM_MAX_BYTES) // 2
    fd = _open(path)
    try:
        size = os.fstat(fd).st_size if fd is not None else 0
    except OSError:
        size = 0
    while True:
        try:
            chunk = os.read(source, CHUNK)
        except InterruptedError:
            continue
        if not chunk:
            break
        if size + len(chunk) > half:
            if fd is not None:
                os.close(fd)
            try:
                os.replace(path, rotated(path))
            except OSError:
                pass
            fd = _open(path)
            if fd is not None:
                try:
                    os.ftruncate(fd, 0)  # the rename failed: start the file again rather than grow it
                except OSError:
                    pass
            size = 0
        if fd is None:
            fd = _open(path)  # the directory may be back (or the disk no longer full)
            if fd is None:
                continue
        try:
            size += os.write(fd, chunk)
        except OSError:
            pass  # dropped: never block the writers
    if fd is not None:
        os.close(fd)


def main(argv: list[str]) -> int:
    # A terminal's Ctrl-C or hang-up and a stop of the portal must not end it before its server: Triton would get
    # SIGPIPE on its next line. It ends at end of file, when its server has.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    path, max_bytes = argv[1], int(argv[2])
    keep(0, path, max_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
