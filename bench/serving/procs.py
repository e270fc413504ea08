"""Processes and their CPU time, for the serving benchmark (run.py) and its peers (peers.py): what a process tree
and the whole machine spent, read from /proc."""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path

from bench.stack import cpu_seconds


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (Triton's python-backend stubs are its children)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def tree_cpu(pid: int, tree: bool = True) -> float:
    total = 0.0
    for member in descendants(pid) if tree else [pid]:
        with contextlib.suppress(OSError):
            total += cpu_seconds(member)
    return total


def machine_cpu() -> tuple[float, float]:
    """(busy, all) CPU seconds of the machine since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / ticks, sum(fields[:8]) / ticks


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
