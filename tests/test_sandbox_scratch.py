"""A sandboxed Triton's scratch directory is bounded (issue 21, disk): a python model that writes past
SANDBOX_SCRATCH_SIZE gets ENOSPC, the host's disk is untouched, and the bytes it holds are memory charged to the
deployment's memory cgroup. Real local runtime (reconciled in the test process through eager tasks) and a real
tritonserver."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import Person
from deployments.runtimes.local import confined as local_confined
from portal import sandbox_settings
from tests.sandbox_helpers import deploy, infer, model_source, output, python_version, ready, stop_everything

pytestmark = [pytest.mark.triton, pytest.mark.django_db]

REPORT = {"inputs": [{"name": "probe", "datatype": "BYTES", "dims": [1]}],
          "outputs": [{"name": "report", "datatype": "BYTES", "dims": [1]}]}
MiB = 2**20


@pytest.fixture(autouse=True)
def _sandboxed() -> Iterator[None]:
    sandbox_settings.sandbox_capabilities.cache_clear()
    caps = sandbox_settings.sandbox_capabilities()
    if not caps.available:
        pytest.fail(f"the sandbox is not available here: {caps.reason}")
    yield
    stop_everything()
    sandbox_settings.sandbox_capabilities.cache_clear()


def _ask(server: Any, command: str) -> dict[str, Any]:
    answer = infer(server, "filler", [{"name": "probe", "datatype": "BYTES", "shape": [1], "data": [command]}])
    return dict(json.loads(output(answer, "report")[0]))


def _host_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _shmem_bytes(cgroup_dirs: list[str]) -> int | None:
    """The tmpfs and shared-memory bytes charged to the server's memory cgroup (v1 or v2), None without one."""
    for directory in cgroup_dirs:
        stat = Path(directory) / "memory.stat"
        if stat.exists():
            for line in stat.read_text().splitlines():
                if line.startswith("shmem "):
                    return int(line.split()[1])
    return None


def test_a_model_writing_past_its_scratch_bound_gets_enospc_and_the_host_disk_is_untouched(
    alice: Person, eager_tasks: Any, settings: Any,
) -> None:
    settings.SANDBOX_SCRATCH_SIZE = "24Mi"
    python_version(alice, "filler", {"model.py": model_source("filling_model")}, REPORT)
    server = ready(deploy(alice, "filler", [{"model": "filler"}]))
    host_scratch = local_confined.scratch_dir(server)
    assert host_scratch.is_dir()

    report = _ask(server, "fill")
    tmpdir, home = report["tmpdir"], report["home"]
    assert tmpdir["error"] == "ENOSPC", report
    assert tmpdir["directory"] == str(host_scratch / "tmp")  # the same path as outside, but not the same place
    # The bound is the tmpfs' size, shared by HOME, TMPDIR and /tmp (the python backend may keep a little there).
    assert 20 * MiB <= tmpdir["written"] <= 24 * MiB, report
    assert home == {"directory": str(host_scratch / "home"), "written": 0, "error": "ENOSPC"}, report
    assert report["tmp_is_tmpdir"] is True
    assert _host_bytes(host_scratch) == 0  # nothing of it reached the host's directory, nor any other of its disk
    shmem = _shmem_bytes(list(server.cgroups))
    if shmem is not None:
        assert shmem >= tmpdir["written"], (shmem, report)  # memory, counted against the deployment's limit

    # The server goes on serving, and a model that frees its scratch can write there again.
    assert _ask(server, "drop") == {"dropped": True}
    assert _host_bytes(host_scratch) == 0
