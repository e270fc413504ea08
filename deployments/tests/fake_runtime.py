"""An in-memory Runtime for the reconciler's fast tests: controllable servers that become ready after a number of
looks, die, fail to load or hang, with no Triton and no cluster. The real runtimes have their own tests (a real
Triton in tests/test_deploy_e2e.py and deployments/tests/test_local_triton.py, a fake Kubernetes API server in
test_k8s_*.py); this one lets every path of the reconciler run in milliseconds."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from deployments.models import Deployment, Pool, Revision
from deployments.render import RenderError
from deployments.revision_spec import RevisionSpec
from deployments.runtimes.base import (
    PREPARED,
    Health,
    Launch,
    Observation,
    Preparation,
    PreparationFailed,
    RuntimeUnavailable,
    TemporaryServer,
    Wake,
)

State = Literal["starting", "ready", "dead", "stopped"]


@dataclass
class FakeServer:
    ref: int
    deployment_id: int
    revision_id: int
    revision_number: int
    ready_after: int | None  # looks until ready; None: it hangs
    fails_with: str  # "": loads fine
    state: State = "starting"
    looks: int = 0

    @property
    def url(self) -> str:
        return f"http://fake-triton-{self.ref}:8000"

    @property
    def grpc_target(self) -> str:
        return f"fake-triton-{self.ref}:8001"

    @property
    def running(self) -> bool:
        return self.state in ("starting", "ready")


@dataclass
class FakeRuntime:
    ready_timeout_seconds: float = 60.0
    poll_seconds: float = 1.0
    # What the next launches do: become ready after this many looks (None: never), or fail to load with a message.
    ready_after: int | None = 2
    fails_with: str = ""
    # Looks before a revision's preparation is done (an environment being built, say).
    preparing_for: int = 0
    building: bool = False  # what the preparation waits for is an environment being built
    build_fails_with: str = ""  # the preparation then fails with this (pip's lines as its detail)
    render_errors: dict[str, list[str]] = field(default_factory=dict)
    unavailable: str = ""  # every call raises RuntimeUnavailable with this message
    cannot_tell: str = ""  # check() cannot tell whether a server serves, for this reason (an API server refusing)
    one_url: str = ""  # every launch answers on this URL (a shared pool: one Triton, each revision its own names)
    servers: list[FakeServer] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    torn_down: list[int] = field(default_factory=list)
    _refs: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _preparing: dict[int, int] = field(default_factory=dict)

    def _call(self, what: str) -> None:
        self.calls.append(what)
        if self.unavailable:
            raise RuntimeUnavailable(self.unavailable)

    def server(self, launch: Launch) -> FakeServer:
        return next(s for s in self.servers if s.ref == launch.ref)

    def running(self, deployment: Deployment) -> list[FakeServer]:
        return [s for s in self.servers if s.deployment_id == deployment.pk and s.running]

    def launched_revisions(self) -> list[int]:
        return [s.revision_number for s in self.servers]

    # --- The Runtime protocol ---------------------------------------------------------------------------------

    def check_plan(self, spec: RevisionSpec) -> dict[str, list[str]]:
        return {}

    def prepare(self, revision: Revision) -> Preparation:
        self._call(f"prepare r{revision.number}")
        if self.render_errors:
            raise RenderError(self.render_errors)
        looks = self._preparing.get(revision.pk, 0) + 1
        self._preparing[revision.pk] = looks
        if looks <= self.preparing_for:
            return Preparation(False, f"Building the environment of revision {revision.number}.", retry_seconds=3.0,
                               building=self.building)
        if self.build_fails_with:
            raise PreparationFailed("pip could not install its python packages (nonexistent-pkg-zzz==9.9)",
                                    self.build_fails_with)
        return PREPARED

    def launch(self, revision: Revision) -> Launch:
        self._call(f"launch r{revision.number}")
        server = next((s for s in self.servers if s.revision_id == revision.pk and s.running), None)
        if server is None:
            server = FakeServer(ref=next(self._refs), deployment_id=revision.deployment_id, revision_id=revision.pk,
                                revision_number=revision.number, ready_after=self.ready_after,
                                fails_with=self.fails_with)
            self.servers.append(server)
        return Launch(revision_id=revision.pk, url=self.one_url or server.url, grpc_target=server.grpc_target,
                      description=f"fake server {server.ref}", ref=server.ref)

    def observe(self, launch: Launch) -> Observation:
        self._call(f"observe {launch.ref}")
        server = self.server(launch)
        if server.state == "stopped":
            return Observation("failed", "it was stopped")
        server.looks += 1
        if server.fails_with:
            server.state = "dead"
            return Observation("failed", server.fails_with, "E: the last lines of its log")
        if server.state == "ready" or (server.ready_after is not None and server.looks >= server.ready_after):
            server.state = "ready"
            return Observation("ready", "ready")
        return Observation("starting", f"loading its models (look {server.looks})")

    def abandon(self, launch: Launch) -> None:
        self._call(f"abandon {launch.ref}")
        self.server(launch).state = "stopped"

    def check(self, deployment: Deployment, launch: Launch) -> Health:
        self._call(f"check {launch.ref}")
        if self.cannot_tell:
            return Health.cannot_tell(self.cannot_tell)
        server = self.server(launch)
        if server.state == "ready":
            return Health(True)
        if server.state == "stopped by an operator":  # make stop-triton
            return Health(False, f"fake server {server.ref} was stopped by an operator", expected=True)
        return Health(False, f"fake server {server.ref} died", "E: killed")

    def retire(self, deployment: Deployment, keep: Sequence[Launch]) -> list[str]:
        self._call("retire")
        kept = {launch.ref for launch in keep}
        stopped = []
        for server in self.running(deployment):
            if server.ref not in kept:
                server.state = "stopped"
                stopped.append(f"Stopped fake server {server.ref} of revision {server.revision_number}.")
        return stopped

    def stop(self, deployment: Deployment) -> None:
        self._call("stop")
        for server in self.running(deployment):
            server.state = "stopped"

    def teardown(self, deployment: Deployment) -> None:
        self._call("teardown")
        self.stop(deployment)
        self.torn_down.append(deployment.pk)

    def logs(self, deployment: Deployment, lines: int) -> str:
        return ""

    def wake(self, load_id: int, wait_seconds: float) -> Wake:
        self._call(f"wake {load_id}")
        return Wake(failure="the fake runtime loads nothing into a pool")

    def unload_idle(self) -> list[str]:
        self._call("unload_idle")
        return []

    def sweep_orphans(self) -> list[str]:
        self._call("sweep_orphans")
        return []

    def refresh_access(self) -> int:
        self._call("refresh_access")
        return 0

    # --- What the pages, the API and the tuner ask (base.Answers): it stands in for the local runtime -------------

    can_tune: bool = True

    def configuration_problems(self) -> list[str]:
        return []

    def isolation(self, deployment: Deployment) -> dict[str, Any] | None:
        # Its servers are no processes: whether they would run sandboxed is not known.
        return {"sandboxed": None, "note": "", "egress": deployment.allow_egress}

    def server_alive(self, pid: int) -> bool:
        return False  # none of its servers is a process of this machine

    def start_temporary(self, spec: RevisionSpec, workdir: Path, label: str) -> TemporaryServer:
        raise RuntimeUnavailable(f"the fake runtime starts no temporary server ({label})")

    def stop_temporary(self, server: TemporaryServer) -> None:
        pass

    def temporary_processes(self, root: Path) -> list[tuple[int, float]]:
        return []

    def stop_process(self, pid: int) -> None:
        pass

    def refresh_pool_figures(self, shared: Pool) -> None:
        # The pools' rows are the real local runtime's, also beside this fake (tests write them as it would).
        from deployments.runtimes.local import pool as local_pool

        local_pool.refresh_figures(shared)
