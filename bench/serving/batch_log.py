"""How big the batches of a peer really were: Triton reports its batches in /v2/models/stats, the peers report
nothing comparable, so the peer code (bench/peers/) counts its inference calls and the items in them here.

Each process that runs inference overwrites 16 bytes (calls, items) in a file of its own under the directory
named by BENCH_BATCH_LOG, with one `pwrite` per batch (a few microseconds: no lock, no rename, nothing that could
slow the server under test); the orchestrator sums the files before and after a run. Standard library only: it
runs in every peer's env and in the portal's.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

_FORMAT = "<QQ"
_SIZE = struct.calcsize(_FORMAT)


class BatchLog:
    """`record(items)` after every inference call; does nothing where BENCH_BATCH_LOG is not set. Create it in the
    process that runs inference (a peer's `load()`, `setup()` or service `__init__`), not before a fork."""

    def __init__(self) -> None:
        directory = os.environ.get("BENCH_BATCH_LOG")
        self.fd: int | None = None
        self.calls = self.items = 0
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self.fd = os.open(Path(directory) / f"{os.getpid()}.bin", os.O_RDWR | os.O_CREAT, 0o644)

    def record(self, items: int) -> None:
        if self.fd is None:
            return
        self.calls += 1
        self.items += items
        os.pwrite(self.fd, struct.pack(_FORMAT, self.calls, self.items), 0)


def read(directory: Path) -> tuple[int, int]:
    """(calls, items) summed over every process that recorded into `directory`."""
    calls = items = 0
    if directory.is_dir():
        for path in directory.glob("*.bin"):
            data = path.read_bytes()[:_SIZE]
            if len(data) == _SIZE:
                c, i = struct.unpack(_FORMAT, data)
                calls, items = calls + c, items + i
    return calls, items
