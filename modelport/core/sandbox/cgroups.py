"""Resource limits of a sandbox through cgroups: memory, CPU and number of processes; v1 and v2.

On cgroup v1 a sandbox joins a CPU cgroup only when its revision sets resources.cpu (a CFS quota); on v2 the CPU
controller comes with the one cgroup, so each sandbox is also scheduled as a group of its own there.

A sandbox's cgroup is created below the cgroup of the process that starts it (a `modelport/` directory there), or
below SANDBOX_CGROUP_PARENT when the operator names one: the limits nest inside whatever already confines the
portal (a systemd unit, a container), and nothing is moved out of it. On cgroup v2 the parent must have the
controllers delegated (a process-free cgroup with cpu, memory and pids in its subtree_control); where nothing is
writable the sandbox runs without limits and says so.

Plain functions and dataclasses, no Django.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    memory_bytes: int | None  # None: no limit
    cpu_millicores: int | None  # None: no CPU cap
    pids: int


@dataclass(frozen=True)
class Layout:
    """Where the sandboxes' cgroups go: one directory per controller (v1), or one directory (v2)."""

    version: int  # 1 or 2; 0: none usable
    parents: dict[str, Path]  # controller -> parent directory ("" -> the v2 parent)
    note: str = ""  # why there are no (or fewer) limits


def detect(root: Path = Path("/sys/fs/cgroup"), parent: str = "",
           own_cgroup: Path = Path("/proc/self/cgroup")) -> Layout:
    """The layout on this machine. `parent`: an absolute cgroup path ("/modelport") instead of our own cgroup."""
    try:
        membership = _membership(own_cgroup.read_text())
    except OSError as exc:
        return Layout(0, {}, f"cannot read {own_cgroup}: {exc}")
    v1 = {c: root / c for c in CONTROLLERS if (root / c / "cgroup.procs").exists() and c in membership}
    if len(v1) == len(CONTROLLERS):
        parents = {c: _child(v1[c], parent or membership[c]) / "modelport" for c in CONTROLLERS}
        return _writable(Layout(1, parents))
    if (root / "cgroup.controllers").exists() and "" in membership:
        own = membership[""].rstrip("/")
        if parent:
            v2_parent = _child(root, parent)
        else:
            # A sibling of our own cgroup (v2 forbids controllers on a cgroup that holds processes, and ours does),
            # or a child of the root when we are at the root (a container with its own cgroup namespace).
            v2_parent = _child(root, own).parent / "modelport" if own else root / "modelport"
        return _writable(Layout(2, {"": v2_parent}))
    return Layout(0, {}, f"no cgroup hierarchy with the {', '.join(CONTROLLERS)} controllers under {root}")


def _membership(text: str) -> dict[str, str]:
    """/proc/self/cgroup as {controller: path}; the v2 entry ("0::/path") as "" -> path."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            result[controller] = path
    return result


def _child(base: Path, cgroup_path: str) -> Path:
    return base / cgroup_path.lstrip("/")


def _writable(layout: Layout) -> Layout:
    """Check that the parents can be created and hold controllers; a Layout with version 0 and a note if not."""
    try:
        for parent in layout.parents.values():
            parent.mkdir(parents=True, exist_ok=True)
            if layout.version == 2:
                _enable_v2_controllers(parent)
            probe = parent / f".probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
            probe.rmdir()
    except OSError as exc:
        where = ", ".join(str(p) for p in layout.parents.values())
        return Layout(0, {}, f"cgroups at {where} are not writable ({exc.strerror or exc}): run the worker as root or "
                             "delegate a cgroup to it and name it in SANDBOX_CGROUP_PARENT")
    return layout


def _enable_v2_controllers(parent: Path) -> None:
    wanted = set(CONTROLLERS)
    # Each ancestor up to the root must pass the controllers down.
    chain = [parent]
    while (chain[-1].parent / "cgroup.controllers").exists() and chain[-1].parent != chain[-1]:
        chain.append(chain[-1].parent)
    for directory in reversed(chain):
        try:
            enabled = set((directory / "cgroup.subtree_control").read_text().split())
        except FileNotFoundError:
            enabled = set()
        missing = wanted - enabled
        if missing:
            (directory / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(missing)))


def create(layout: Layout, name: str, limits: Limits) -> list[Path]:
    """The sandbox's cgroup directories with `limits` written; returns them (their cgroup.procs take the launcher)."""
    directories = []
    for controller, parent in layout.parents.items():
        if controller == "cpu" and not limits.cpu_millicores:
            # A CPU cgroup makes the kernel schedule all of Triton's threads as one entity against every other
            # process: without a limit asked for, Triton is scheduled exactly as it would be unsandboxed.
            continue
        directory = parent / name
        directory.mkdir(exist_ok=True)
        directories.append(directory)
        if layout.version == 1:
            _limit_v1(controller, directory, limits)
    if layout.version == 2:
        _limit_v2(directories[0], limits)
    return directories


def _limit_v1(controller: str, directory: Path, limits: Limits) -> None:
    if controller == "memory" and limits.memory_bytes:
        (directory / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
        swap = directory / "memory.memsw.limit_in_bytes"
        if swap.exists():  # memory + swap: the same figure, so a limited sandbox cannot swap its way past it
            swap.write_text(str(limits.memory_bytes))
    elif controller == "cpu" and limits.cpu_millicores:
        (directory / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        (directory / "cpu.cfs_quota_us").write_text(str(limits.cpu_millicores * CPU_PERIOD_US // 1000))
    elif controller == "pids":
        (directory / "pids.max").write_text(str(limits.pids))


def _limit_v2(directory: Path, limits: Limits) -> None:
    if limits.memory_bytes:
        (directory / "memory.max").write_text(str(limits.memory_bytes))
        if (directory / "memory.swap.max").exists():
            (directory / "memory.swap.max").write_text("0")
    if limits.cpu_millicores:
        (directory / "cpu.max").write_text(f"{limits.cpu_millicores * CPU_PERIOD_US // 1000} {CPU_PERIOD_US}")
    (directory / "pids.max").write_text(str(limits.pids))


def procs_files(directories: list[Path]) -> list[str]:
    return [str(d / "cgroup.procs") for d in directories]


def oom_kills(directories: list[Path]) -> int:
    """How many processes the kernel killed for reaching the memory limit (0 when unknown)."""
    for directory in directories:
        for name in ("memory.events", "memory.oom_control"):  # v2, v1 (Linux 4.13+)
            try:
                text = (directory / name).read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
    return 0


def members(directories: list[Path]) -> list[int]:
    """The processes in the sandbox's cgroup (what is left of it after a stop must be nothing)."""
    pids: set[int] = set()
    for directory in directories:
        try:
            pids.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        except OSError:
            continue
    return sorted(pids)


def remove(directories: list[Path], wait_seconds: float = 5.0) -> bool:
    """Remove the cgroup directories (and the child cgroups in them: a pool's per-model ones) once their processes
    are gone; False if some were still busy."""
    deadline = time.monotonic() + wait_seconds
    # Children first: a cgroup with a child cgroup cannot be removed.
    left = [child for d in directories if d.is_dir() for child in _children(d)] + [d for d in directories if d.exists()]
    while left:
        for directory in list(left):
            try:
                directory.rmdir()
                left.remove(directory)
            except FileNotFoundError:
                left.remove(directory)
            except OSError:
                pass
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return not left


def _children(directory: Path) -> list[Path]:
    """The child cgroups below `directory`, deepest first."""
    found = []
    try:
        entries = sorted(e for e in directory.iterdir() if e.is_dir())
    except OSError:
        return []
    for entry in entries:
        found.extend(_children(entry))
        found.append(entry)
    return found


# --- A child cgroup per python-backend model of a shared server (a pool's Triton) ---------------------------------
#
# The pool's Triton is its sandbox's PID 1: were its cgroup to reach its limit, the kernel could kill Triton, and
# with it every team's models. Each model's stub processes go into a memory cgroup of their own below the server's,
# limited to what the pool reserved for that model, so a model past its memory loses its own stub, never the server.
# On cgroup v1 a cgroup may hold processes and have children; v2 forbids a cgroup with processes (the server's holds
# Triton) from giving its children controllers, so there this is unavailable (model_cgroups_available()).


def memory_directory(directories: list[Path]) -> Path | None:
    """The server's memory cgroup among its directories (v1: the memory controller's; v2: the one)."""
    for directory in directories:
        if (directory / "memory.limit_in_bytes").exists() or (directory / "memory.max").exists():
            return directory
    return None


def model_cgroups_available(directories: list[Path]) -> bool:
    """Whether child memory cgroups with limits of their own can be made below the server's (v1 only)."""
    memory = memory_directory(directories)
    return memory is not None and (memory / "memory.limit_in_bytes").exists()


def create_child(parent: Path, name: str, memory_bytes: int) -> Path:
    """A child memory cgroup `name` below `parent` limited to `memory_bytes` (memory and swap alike), made afresh
    so that its peak is this load's. OSError when the kernel refuses."""
    child = parent / name
    if child.is_dir():
        try:
            child.rmdir()  # a previous load's, empty: its peak would count for this one
        except OSError:
            pass  # still holds a process (an unload under way): keep it, with the new limit
    child.mkdir(exist_ok=True)
    _write_memory_limit(child, memory_bytes)
    return child


def _write_memory_limit(child: Path, memory_bytes: int) -> None:
    limit, swap = child / "memory.limit_in_bytes", child / "memory.memsw.limit_in_bytes"
    # memsw must stay >= the plain limit at every step: raise memsw first when growing, lower it last when shrinking.
    current = int(limit.read_text().strip() or 0)
    order = [swap, limit] if memory_bytes > current else [limit, swap]
    for path in order:
        if path.exists():
            path.write_text(str(memory_bytes))


def move(pid: int, directory: Path) -> bool:
    """Move process `pid` (every thread of it) into the cgroup `directory`; False if it is gone."""
    try:
        (directory / "cgroup.procs").write_text(str(pid))
        return True
    except OSError:
        return False


def peak_bytes(directory: Path) -> int:
    """The most memory the cgroup's processes held at once since it was made (0 when unknown)."""
    for name in ("memory.max_usage_in_bytes", "memory.peak"):  # v1, v2 (Linux 5.19+)
        try:
            return int((directory / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return 0


def usage_bytes(directory: Path) -> int:
    for name in ("memory.usage_in_bytes", "memory.current"):  # v1, v2
        try:
            return int((directory / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return 0


def limit_bytes(directory: Path) -> int:
    try:
        return int((directory / "memory.limit_in_bytes").read_text().strip())
    except (OSError, ValueError):
        return 0
