"""Each model in a pool's Triton confined to, and measured by, its own memory (issue 30): a pool is no team's
failure domain.

The pool's Triton is its sandbox's PID 1. Were the server's cgroup to reach its limit, the kernel could kill Triton
and with it every team's models; and the memory the server's whole process tree gained while a model loaded counted
what neighbours allocated meanwhile, and none of what the model grew to once used (onnxruntime's arena grows at the
first request). So:

- Each loaded model's stub processes are moved into a memory cgroup of their own below the server's, limited to
  what the pool reserved for the model (pools.reservations): a model past it loses its own stub. The stub wrapper
  (modelport/core/sandbox/stub.py) waits for the move before any model code runs (MODELPORT_STUB_PLACEMENT_SECONDS);
  each stub moved is made the kernel's first choice at an out-of-memory kill, before Triton. Once loaded, its data
  segment is limited to what it maps plus what its cgroup has free, so one huge tensor fails as an error in the
  request that asked for it.
- A model's figure is its cgroup's peak (the kernel's count, its own processes' pages alone), read after the load
  and again whenever the pool's use is refreshed: what it holds after use, not what the tree gained at load. Without
  per-model cgroups, the peak resident memory (VmHWM) of its own stub processes.

Needs cgroup v1 (a cgroup that holds processes, the server's, can have limited children there); elsewhere the
models share the server's cgroup, the pool's Triton runs as before, and the capability check says so.
"""

from __future__ import annotations

import logging
import resource
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from deployments.models import PoolServer
from deployments.runtimes.local import triton as local_triton
from modelport.core.sandbox import cgroups

log = logging.getLogger(__name__)

PLACE_EVERY_SECONDS = 0.02  # a stub waits for its move this long at most per step: well within a load's seconds


def server_environment(confined_per_model: bool) -> dict[str, str]:
    """What a pool's Triton passes to its python-backend stubs (the wrapper and the generated models read it)."""
    env = {"MODELPORT_MAX_OUTPUT_BYTES": str(settings.POOL_MAX_OUTPUT_BYTES)}
    if confined_per_model:
        env["MODELPORT_STUB_PLACEMENT_SECONDS"] = f"{settings.POOL_STUB_PLACEMENT_SECONDS:g}"
    return env


def per_model_available(cgroup_version: int) -> bool:
    return cgroup_version == 1


def _memory_dir(server: PoolServer) -> Path | None:
    if not server.sandboxed or not server.cgroups:
        return None
    directories = [Path(d) for d in server.cgroups]
    return cgroups.memory_directory(directories) if cgroups.model_cgroups_available(directories) else None


def model_dir(server: PoolServer, name: str) -> Path | None:
    """The model's memory cgroup in `server` (None: this server has no per-model cgroups)."""
    parent = _memory_dir(server)
    return parent / name if parent is not None else None


def stub_pids(server: PoolServer, repository: Path, name: str) -> list[int]:
    """The processes of `server` serving model `name`."""
    return model_pids(server.pid, repository, name)


def model_pids(server_pid: int, repository: Path, name: str) -> list[int]:
    """The processes of the Triton at `server_pid` serving model `name`: their command line names its directory in
    the repository (Triton starts each stub with the model's path, through `bash -c "exec ..."` and the wrapper)."""
    mark = f"{repository}/{name}/".encode()
    found = []
    for pid in local_triton.server_pids(server_pid):
        if pid == server_pid:
            continue
        try:
            if mark in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def prepare(server: PoolServer, name: str, limit_bytes: int) -> Path | None:
    """The model's cgroup, made afresh with its limit before its load (None: no per-model cgroups here)."""
    parent = _memory_dir(server)
    if parent is None:
        return None
    return cgroups.create_child(parent, name, limit_bytes)


def place(server: PoolServer, repository: Path, name: str, directory: Path) -> int:
    """Move the model's stub processes that are not in its cgroup yet into it; how many were moved."""
    inside = set(cgroups.members([directory]))
    moved = 0
    for pid in stub_pids(server, repository, name):
        if pid in inside:
            continue
        _kill_first(pid)  # before the move: the stub waits for the move, then runs the model
        if cgroups.move(pid, directory):
            moved += 1
    return moved


def _kill_first(pid: int) -> None:
    """Should the server's cgroup ever run out as a whole, the kernel chooses a stub before Triton (oom_score_adj,
    kept across the stub's exec)."""
    try:
        Path(f"/proc/{pid}/oom_score_adj").write_text("1000")
    except OSError:
        pass


# Beyond what the cgroup has free, the address space a stub may still map for data: small, so that one huge tensor
# fails as an allocation error rather than through the kernel's killer.
DATA_MARGIN_BYTES = 16 * 2**20


def fit_data_limit(server: PoolServer, name: str) -> None:
    """Limit each of the model's processes' data segment (RLIMIT_DATA) to what it maps now plus what its cgroup has
    free: an allocation past the model's limit (one huge tensor) then fails as an error in the request that asked
    for it, instead of the kernel ending the process. Set once the model has loaded (its thread stacks and
    allocator reserves, which are mapped but mostly not resident, some 57 MB of an idle onnxruntime stub here, grow
    with the cores), and again at each refresh as its use grows."""
    directory = model_dir(server, name)
    if directory is None or not directory.is_dir():
        return
    free = max(0, cgroups.limit_bytes(directory) - cgroups.usage_bytes(directory))
    for pid in cgroups.members([directory]):
        mapped = _status_bytes(pid, "VmData")
        if not mapped:
            continue
        ceiling = mapped + free + DATA_MARGIN_BYTES
        try:
            resource.prlimit(pid, resource.RLIMIT_DATA, (ceiling, ceiling))
        except (OSError, ValueError):
            pass  # gone, or (unprivileged) not allowed to raise it again: the cgroup's limit holds anyway


@contextmanager
def placing(server: PoolServer, repository: Path, name: str, directory: Path | None) -> Iterator[None]:
    """While the body loads model `name`, move each stub Triton starts for it into its cgroup (they wait for it)."""
    if directory is None:
        yield
        return
    done = threading.Event()

    def run() -> None:
        while not done.wait(PLACE_EVERY_SECONDS):
            try:
                place(server, repository, name, directory)
            except OSError:  # a process gone between the listing and the move
                continue

    thread = threading.Thread(target=run, name=f"place-{name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)
        place(server, repository, name, directory)  # one that started at the very end


def adopt(server: PoolServer, repository: Path, name: str) -> None:
    """Move into its cgroup a stub Triton started for a loaded model outside a load (a python backend that starts a
    dead model's process again), which waits for that: the health check and the idle-unload pass, every few seconds,
    call this, well within POOL_STUB_PLACEMENT_SECONDS. (The Triton here does not restart a killed model process:
    such a model fails its requests until it is loaded again, as before.)"""
    directory = model_dir(server, name)
    if directory is not None and directory.is_dir():
        try:
            place(server, repository, name, directory)
        except OSError:
            pass


def measure(server: PoolServer, repository: Path, name: str) -> int:
    """The model's own peak memory: its cgroup's, else the sum of its stub processes' peak resident memory."""
    directory = model_dir(server, name)
    if directory is not None and directory.is_dir():
        return cgroups.peak_bytes(directory)
    return sum(_vm_hwm(pid) for pid in stub_pids(server, repository, name))


def model_peaks(server_pid: int, repository: Path, names: list[str]) -> dict[str, int]:
    """The peak resident memory of the processes serving each model of `names` in the Triton at `server_pid`, summed
    per model (0: none found): what a dedicated server or the trial call measures a model by, its own processes
    beside Triton's. One listing of the server's processes for all of them (a health check calls this)."""
    marks = {name: f"{repository}/{name}/".encode() for name in names}
    peaks = dict.fromkeys(names, 0)
    for pid in local_triton.server_pids(server_pid):
        if pid == server_pid:
            continue
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        for name, mark in marks.items():
            if mark in command:
                peaks[name] += _vm_hwm(pid)
                break
    return peaks


def limit_reached(server: PoolServer, name: str) -> int:
    """The model's limit if the kernel killed one of its processes for passing it, else 0."""
    directory = model_dir(server, name)
    if directory is None or not directory.is_dir():
        return 0
    return cgroups.limit_bytes(directory) if cgroups.oom_kills([directory]) else 0


def remove(server: PoolServer, name: str) -> None:
    """Remove the model's cgroup if its stubs have exited already (an unload ends them within seconds, and the pool's
    lock is not held for them): else the next refresh removes it (remove_unused), or the server's removal."""
    directory = model_dir(server, name)
    if directory is not None and directory.is_dir():
        cgroups.remove([directory], wait_seconds=0)


def remove_unused(server: PoolServer, loaded: set[str]) -> None:
    """Remove the empty cgroups of models no longer loaded in `server`."""
    parent = _memory_dir(server)
    if parent is None:
        return
    for directory in (d for d in parent.iterdir() if d.is_dir() and d.name not in loaded):
        cgroups.remove([directory], wait_seconds=0)


def _vm_hwm(pid: int) -> int:
    return _status_bytes(pid, "VmHWM")


def _status_bytes(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
