"""The open-files limit of a server process: raised to what the system allows at start, so that the server's own
connection caps (portal/web_server.py, the gRPC gateway's) are what binds under a flood of connections, never
EMFILE, which fails every other caller's request (a database connection, a model file, Triton) too."""

from __future__ import annotations

import resource

# Descriptors kept for everything but client connections: the database, storage, logs, upstream Tritons.
RESERVED_DESCRIPTORS = 1024
# When the hard limit is unlimited, the kernel still caps a process (fs.nr_open, 1,048,576 by default).
_UNLIMITED = 1 << 20


def raise_open_files_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return _UNLIMITED if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # a container may forbid it: the limits below then follow the lower one
        return soft
    return target


def connection_cap(configured: int, open_files: int) -> int:
    """At most `configured` client connections, and never so many that the process runs out of descriptors."""
    room = open_files - RESERVED_DESCRIPTORS if open_files > 2 * RESERVED_DESCRIPTORS else open_files // 2
    return max(1, min(configured, room))
