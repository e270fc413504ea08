#!/usr/bin/env python3
"""The python-backend stub wrapper of a Kubernetes pool's Triton: each model's processes confined to its own memory.

Usage (what the stub entry of the pod's backend directory runs, pool_triton.sh):
    python3 -I pool_stub.py REAL_STUB [STUB ARGS...]

A pool's Triton serves every team's ONNX, TorchScript and SavedModel models through Modelport's generated
python-backend models (deployments/render.py), so that each model runs in stub processes of its own rather than
inside Triton's process. Triton starts one stub per model instance (`bash -c "exec <backend dir>/python/
triton_python_backend_stub <model path> ..."`); in a pool's pod that file runs this, which, before any model code,

- limits the process's data segment (RLIMIT_DATA, soft and hard: its private writable mappings, the heap, thread
  stacks, every allocator's arenas) to the model's own limit, which the pool's agent wrote for it from the loads
  Secret (`$MODELPORT_MODEL_LIMITS_DIR/<model>`, a directory only the agent can write): an allocation past it fails
  in this process (a 400 for the request that asked, triton_batching.out_of_memory), and no later code can raise it
  again without CAP_SYS_RESOURCE, which no container of the pod has;
- makes itself the kernel's first choice should the pod's memory limit be reached anyway (`oom_score_adj` 1000,
  kept across the exec), so that a stub is killed before Triton, whose death would take every team's models.

A pod has no writable cgroup filesystem, so the local pool's per-model memory cgroups
(deployments/runtimes/local/pool_memory.py) cannot be made here: the rlimit is what confines. Anything missing or
malformed (no limit for this model, a model path outside the repository) fails the model's load: a model never
runs less confined than planned.

Standard library only, Python 3.8+: it runs with the Triton image's python3.
"""

from __future__ import annotations

import os
import re
import resource
import sys
from pathlib import PurePosixPath

LIMITS_ENV = "MODELPORT_MODEL_LIMITS_DIR"
REPOSITORY_ENV = "MODELPORT_REPOSITORY"
MODEL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}")
LIMIT_FILE_BYTES = 32
KILL_FIRST = "1000"


class Refused(Exception):
    """Why the model may not run here: its load fails, with this in Triton's log."""


def model_name(model_path: str, repository: str) -> str:
    """The model a stub serves, from the path Triton gives it (`<repository>/<model>/<version>/model.py`)."""
    path, root = PurePosixPath(model_path), PurePosixPath(repository)
    if ".." in path.parts or not path.is_absolute():
        raise Refused(f"model path {model_path!r} is not a plain path in the repository")
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise Refused(f"model path {model_path!r} is outside the repository {repository}") from None
    if len(parts) < 3 or not MODEL_NAME_RE.fullmatch(parts[0]):
        raise Refused(f"model path {model_path!r} names no model of the repository")
    return parts[0]


def read_limit(directory: str, name: str) -> int:
    """The model's memory limit in bytes, as the agent wrote it."""
    path = os.path.join(directory, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            text = os.read(fd, LIMIT_FILE_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise Refused(f"no memory limit was given for model {name!r} ({exc.strerror})") from None
    try:
        limit = int(text.decode("ascii").strip()) if len(text) <= LIMIT_FILE_BYTES else 0
    except (UnicodeDecodeError, ValueError):
        limit = 0
    if limit <= 0:
        raise Refused(f"the memory limit given for model {name!r} is not a positive number of bytes")
    return limit


def confine(limit: int) -> None:
    """Limit this process (and what it execs) to `limit` bytes of data, and put it first in line for the kernel's
    out-of-memory killer. Lowering both the soft and the hard limit, and raising oom_score_adj, need no privilege."""
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    with open("/proc/self/oom_score_adj", "w") as handle:
        handle.write(KILL_FIRST)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        # Triton first runs the stub without arguments and expects status 1; anything else makes it try to chmod
        # the file (which is read-only here).
        return 1
    real_stub, stub_args = args[0], args[1:]
    try:
        limits = os.environ.get(LIMITS_ENV, "")
        if not limits:
            raise Refused(f"{LIMITS_ENV} is not set: the pool's models cannot be confined")
        name = model_name(stub_args[0], os.environ.get(REPOSITORY_ENV, "/models"))
        confine(read_limit(limits, name))
    except (Refused, OSError, ValueError) as exc:
        sys.stderr.write(f"modelport pool: could not confine the model's process: {exc}\n")
        sys.stderr.flush()
        return 2
    os.execv(real_stub, [real_stub, *stub_args])
    return 2  # not reached


if __name__ == "__main__":
    sys.exit(main())
