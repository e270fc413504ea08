"""The worker lanes: which worker processes consume which queues, with which pool. One table for bin/run-portal
(`python -m infra.lanes NAME` prints a lane's worker arguments), docker-compose.yml and the Kubernetes manifests
(tests check that both say the same).

Why each lane is as it is:
- reconcile: threads, since a tick is short and mostly waits (on the database, Triton, the Kubernetes API); its
  processes never run anything a team can make slow, so a stop is answered within a tick.
- inspection: prefork, the only pool where Celery's time limits hold: the soft limit raises in the task, the hard
  limit kills the child process that ignored it (with threads neither can stop a spinning inspection).
- build: pip runs in a subprocess bounded by MODELPORT_PIP_TIMEOUT_SECONDS; one at a time, since pip fills a core
  and the network.
- import: threads, since a fetch mostly waits on the network (a thread costs a 1 MiB chunk buffer, little CPU); eight
  at once, four times a team's IMPORT_MAX_ACTIVE_PER_TEAM (2), so that one team's imports, each bounded by
  IMPORT_TIME_LIMIT_SECONDS, hold at most a quarter of the lane and another team's import starts at once.
- tune: one at a time per host anyway (tuning/runner.py); its own process so that an hour of it holds nothing else.

Plain Python (no Django), so that bin/run-portal reads it in milliseconds.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from infra.queues import Queue


@dataclass(frozen=True)
class Lane:
    name: str
    queues: tuple[Queue, ...]
    pool: str
    concurrency: int

    def worker_args(self) -> list[str]:
        """What follows `celery -A portal worker`; the node name keeps two lanes of one host apart."""
        return ["-Q", ",".join(self.queues), "-P", self.pool, f"--concurrency={self.concurrency}",
                "-n", f"{self.name}@%h"]


LANES: tuple[Lane, ...] = (
    Lane("reconcile", (Queue.RECONCILE,), "threads", 4),
    Lane("inspection", (Queue.INSPECTION,), "prefork", 2),
    Lane("build", (Queue.BUILD,), "threads", 1),
    Lane("tune", (Queue.TUNE,), "threads", 1),
    Lane("import", (Queue.IMPORT,), "threads", 8),
)


def lane(name: str) -> Lane:
    for each in LANES:
        if each.name == name:
            return each
    raise KeyError(f"no lane {name!r}: one of {', '.join(each.name for each in LANES)}")


def main(argv: list[str]) -> int:
    if not argv:
        print(" ".join(each.name for each in LANES))
        return 0
    try:
        print(" ".join(lane(argv[0]).worker_args()))
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
