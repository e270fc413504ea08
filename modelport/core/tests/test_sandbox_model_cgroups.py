"""A pool's per-model memory cgroups (modelport/core/sandbox/cgroups.py) on this machine's real cgroup v1 hierarchy:
a model's process past its own limit is the one the kernel ends, the figure is its own peak, and a server's cgroup
goes with its models' children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelport.core.sandbox import cgroups

MIB = 2**20


@pytest.fixture
def server_cgroup() -> Iterator[Path]:
    layout = cgroups.detect()
    if layout.version != 1:
        pytest.skip(f"per-model cgroups need cgroup v1 ({layout.note or f'this machine has v{layout.version}'})")
    directory = layout.parents["memory"] / f"mp-test-models-{os.getpid()}"
    directory.mkdir(parents=True, exist_ok=True)
    yield directory
    for pid in cgroups.members([directory, *directory.iterdir()]) if directory.is_dir() else []:
        os.kill(pid, signal.SIGKILL)
    cgroups.remove([directory], wait_seconds=5)


def _waiting(child: Path, allocate_mib: int) -> subprocess.Popen[bytes]:
    """A process that allocates once it is in `child` (as a stub waits for its cgroup before the model runs)."""
    code = ("import sys, time\n"
            f"while '/{child.name}' not in open('/proc/self/cgroup').read(): time.sleep(0.01)\n"
            f"data = bytearray({allocate_mib} * 2**20)\n"
            "for i in range(0, len(data), 4096): data[i] = 1\n"
            "print('held', flush=True)\ntime.sleep(60)\n")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)


def test_a_model_past_its_own_limit_is_the_process_the_kernel_ends(server_cgroup: Path) -> None:
    small = cgroups.create_child(server_cgroup, "d1-r1-greedy", 48 * MIB)
    roomy = cgroups.create_child(server_cgroup, "d2-r1-modest", 256 * MIB)
    assert cgroups.limit_bytes(small) == 48 * MIB
    greedy, modest = _waiting(small, 200), _waiting(roomy, 32)
    try:
        assert cgroups.move(greedy.pid, small) and cgroups.move(modest.pid, roomy)
        assert greedy.wait(30) == -signal.SIGKILL  # the kernel's out-of-memory kill, in its own cgroup
        assert cgroups.oom_kills([small]) == 1
        assert modest.stdout is not None and modest.stdout.readline() == b"held\n"
        assert modest.poll() is None and cgroups.oom_kills([roomy]) == 0
        # Each figure is its own cgroup's peak: the neighbour's 200 MB never counts in it.
        assert 32 * MIB <= cgroups.peak_bytes(roomy) < 120 * MIB
        assert cgroups.peak_bytes(small) <= 48 * MIB
    finally:
        for process in (greedy, modest):
            process.kill()
            process.wait()


def test_a_servers_cgroup_is_removed_with_its_models_cgroups(server_cgroup: Path) -> None:
    child = cgroups.create_child(server_cgroup, "d3-r1-m", 64 * MIB)
    process = _waiting(child, 1)
    try:
        assert cgroups.move(process.pid, child) and process.pid in cgroups.members([child])
        assert not cgroups.remove([server_cgroup], wait_seconds=0)  # busy while its model's process lives
    finally:
        process.kill()
        process.wait()
    assert cgroups.remove([server_cgroup], wait_seconds=5) and not server_cgroup.exists()
