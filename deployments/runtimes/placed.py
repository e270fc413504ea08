"""One Runtime out of a runtime's two launchers: the dedicated one (a server, or a Kubernetes Deployment, per
revision) and the pool launcher (a revision's models loaded into a pool's shared Triton). The registry makes one
per runtime; here alone does a call choose between them, so neither launcher forks on placement:

- a revision's calls (check_plan, prepare, launch, logs) go by its spec's placement;
- a launch's calls (observe, abandon, check) by its ref (base.is_pool_launch);
- a deployment's (retire, stop, teardown) go to both, the pool's first: a deployment may have revisions of each
  while it moves between a pool and a server of its own;
- waking goes to the pool launcher; the periodic passes to both;
- what the pages, the API and the tuner ask (base.Answers) to the runtime itself, its dedicated launcher.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deployments.models import Deployment, Pool, Revision
from deployments.revision_spec import RevisionSpec
from deployments.runtimes.base import (
    Health,
    Launch,
    Launcher,
    Observation,
    Preparation,
    Runtime,
    TemporaryServer,
    Wake,
    is_pool_launch,
)


class Placed:
    def __init__(self, dedicated: Runtime, pooled: Launcher) -> None:
        self.dedicated = dedicated
        self.pooled = pooled

    def _for_spec(self, spec: RevisionSpec) -> Launcher:
        return self.pooled if spec.placement.shared else self.dedicated

    def _for_launch(self, launch: Launch) -> Launcher:
        return self.pooled if is_pool_launch(launch) else self.dedicated

    @property
    def ready_timeout_seconds(self) -> float:
        return self.dedicated.ready_timeout_seconds

    @property
    def poll_seconds(self) -> float:
        return self.dedicated.poll_seconds

    def check_plan(self, spec: RevisionSpec) -> dict[str, list[str]]:
        return self._for_spec(spec).check_plan(spec)

    def prepare(self, revision: Revision) -> Preparation:
        return self._for_spec(revision.spec).prepare(revision)

    def launch(self, revision: Revision) -> Launch:
        return self._for_spec(revision.spec).launch(revision)

    def observe(self, launch: Launch) -> Observation:
        return self._for_launch(launch).observe(launch)

    def abandon(self, launch: Launch) -> None:
        self._for_launch(launch).abandon(launch)

    def check(self, deployment: Deployment, launch: Launch) -> Health:
        return self._for_launch(launch).check(deployment, launch)

    def retire(self, deployment: Deployment, keep: Sequence[Launch]) -> list[str]:
        return self.pooled.retire(deployment, keep) + self.dedicated.retire(deployment, keep)

    def stop(self, deployment: Deployment) -> None:
        self.pooled.stop(deployment)
        self.dedicated.stop(deployment)

    def teardown(self, deployment: Deployment) -> None:
        self.pooled.teardown(deployment)
        self.dedicated.teardown(deployment)

    def logs(self, deployment: Deployment, lines: int, revision: Revision | None = None) -> str:
        chosen = revision or deployment.serving_revision or deployment.revision
        if chosen is not None and chosen.spec.placement.shared:
            return self.pooled.logs(deployment, lines, chosen)
        return self.dedicated.logs(deployment, lines, revision)

    def wake(self, load_id: int, wait_seconds: float) -> Wake:
        return self.pooled.wake(load_id, wait_seconds)

    def unload_idle(self) -> list[str]:
        return self.pooled.unload_idle() + self.dedicated.unload_idle()

    def sweep_orphans(self) -> list[str]:
        return self.pooled.sweep_orphans() + self.dedicated.sweep_orphans()

    def refresh_access(self) -> int:
        return self.pooled.refresh_access() + self.dedicated.refresh_access()

    # --- base.Answers: the runtime's own, whatever the placement -----------------------------------------------

    @property
    def can_tune(self) -> bool:
        return self.dedicated.can_tune

    def configuration_problems(self) -> list[str]:
        return self.dedicated.configuration_problems()

    def isolation(self, deployment: Deployment) -> dict[str, Any] | None:
        return self.dedicated.isolation(deployment)

    def server_alive(self, pid: int) -> bool:
        return self.dedicated.server_alive(pid)

    def start_temporary(self, spec: RevisionSpec, workdir: Path, label: str) -> TemporaryServer:
        return self.dedicated.start_temporary(spec, workdir, label)

    def stop_temporary(self, server: TemporaryServer) -> None:
        self.dedicated.stop_temporary(server)

    def temporary_processes(self, root: Path) -> list[tuple[int, float]]:
        return self.dedicated.temporary_processes(root)

    def stop_process(self, pid: int) -> None:
        self.dedicated.stop_process(pid)

    def refresh_pool_figures(self, shared: Pool) -> None:
        self.dedicated.refresh_pool_figures(shared)
