"""One Runtime out of a runtime's two launchers: the dedicated one (a server, or a Kubernetes Deployment, per
revision) and the pool launcher (a revision's models loaded into a pool's shared Triton). The registry makes one
per runtime; here alone does a call choose between them, so neither launcher forks on placement:

- a revision's calls (check_plan, prepare, launch, logs) go by its spec's placement;
- a launch's calls (observe, abandon, check) by its ref (base.is_pool_launch);
- a deployment's (retire, stop, teardown) go to both, the pool's first: a deployment may have revisions of each
  while it moves between a pool and a server of its own;
- waking goes to the pool launcher; the periodic passes to both.
"""

from __future__ import annotations

from collections.abc import Sequence

from deployments.models import Deployment, Revision
from deployments.revision_spec import RevisionSpec
from deployments.runtimes.base import Health, Launch, Observation, Preparation, Runtime, Wake, is_pool_launch


class Placed:
    def __init__(self, dedicated: Runtime, pooled: Runtime) -> None:
        self.dedicated = dedicated
        self.pooled = pooled

    def _for_spec(self, spec: RevisionSpec) -> Runtime:
        return self.pooled if spec.placement.shared else self.dedicated

    def _for_launch(self, launch: Launch) -> Runtime:
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
