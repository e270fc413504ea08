"""What the reconciler needs from a runtime (the local Triton processes, or a Kubernetes cluster).

Every method returns within seconds: the reconciler (deployments/reconcile.py) calls one or two of them per tick and
decides from what they say, so nothing waits in a worker for a server to load. A runtime holds what serves each
revision apart (a Launch per revision), so that two revisions can run side by side: the one serving and the one
starting during a rollout, or (later) a stable and a canary revision.

Implementations register by name in runtimes/registry.py; this module imports none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from deployments.launch import Launch as Launch  # where the runtimes and the reconciler have always found it
from deployments.models import Deployment, Pool, Revision
from deployments.revision_spec import RevisionSpec


@dataclass(frozen=True)
class Preparation:
    """Where a revision's preparation stands (its repository rendered and published; later, its environments
    built). Not done: the reconciler looks again after `retry_seconds`, showing `message` meanwhile; `building`:
    what it waits for is an environment being built (the deployment shows "building" rather than "rendering");
    `build`: nobody builds it yet, so the reconciler queues the build (deployments.tasks.build_python_env). A runtime
    never queues work itself: it sits below the tasks, and only answers what it needs."""

    done: bool
    message: str = ""
    retry_seconds: float = 5.0
    building: bool = False
    build: bool = False


PREPARED = Preparation(done=True)


@dataclass(frozen=True)
class Observation:
    """What a launch is doing right now."""

    state: Literal["starting", "ready", "failed"]
    message: str = ""  # one line: why it failed, or what it waits for
    detail: str = ""  # Triton's own error lines, a pod's last log lines


@dataclass(frozen=True)
class Health:
    ok: bool
    message: str = ""
    detail: str = ""
    # The runtime could not tell (an API server that refuses or does not answer): the deployment keeps its route,
    # nothing is restarted, and `message` says why it could not tell, for the deployment's status.
    unknown: bool = False
    # An operator stopped it on purpose (`make stop-triton`): it is started again like a dead one, told as news, not
    # as an error.
    expected: bool = False

    @classmethod
    def cannot_tell(cls, reason: str) -> Health:
        return cls(ok=True, message=reason, unknown=True)


class PreparationFailed(Exception):
    """The revision's preparation failed for good (a python model's requirements could not be installed): the
    deployment fails with the message, and `detail` (pip's last lines) beside it."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class RuntimeUnavailable(Exception):
    """The runtime cannot act at all: no cluster configured or reachable, S3 not configured, a request refused.
    The message says what to set or fix; the reconciler shows it as the deployment's status."""


# --- What the pages, the API and the tuner ask a runtime (issue 32) -------------------------------------------------
# Nothing outside the registry, the tasks and the management commands imports a runtime's modules (the contract
# "runtimes-behind-the-registry" in pyproject.toml): they ask these, through runtimes/registry.py.


class ManifestsRefused(Exception):
    """A revision that cannot be turned into the configured cluster's manifests: the message says what it lacks."""


@dataclass(frozen=True)
class TemporaryServer:
    """A server of a spec outside any deployment (a tune's candidate setting), started by start_temporary on this
    machine; `handle` is the runtime's own, for stop_temporary."""

    http_url: str
    handle: object


class TemporaryServerFailed(Exception):
    """A temporary server started but never became ready: the message says why (Triton's own error line)."""


class Answers(Protocol):
    @property
    def can_tune(self) -> bool:
        """Whether this runtime starts temporary servers on this machine, which a tune measures."""

    def configuration_problems(self) -> list[str]:
        """Why no deployment can use this runtime here (a setting missing); empty when one can."""

    def isolation(self, deployment: Deployment) -> dict[str, Any] | None:
        """What the deployment page says of its server's confinement: {"sandboxed": bool | None, "note": str,
        "egress": bool}; None where the runtime does not sandbox (a cluster's pods are its own)."""

    def server_alive(self, pid: int) -> bool:
        """Whether the server process `pid` (a TritonServer's, a PoolServer's) still runs on this machine."""

    def start_temporary(self, spec: RevisionSpec, workdir: Path, label: str) -> TemporaryServer:
        """Render `spec` under `workdir` and start a server of it, confined as a deployment's is; returns once it is
        ready. RuntimeUnavailable: it cannot start here; TemporaryServerFailed: it started and never got ready."""

    def stop_temporary(self, server: TemporaryServer) -> None:
        """Stop a server start_temporary started, and remove what it left outside its workdir."""

    def temporary_processes(self, root: Path) -> list[tuple[int, float]]:
        """(pid, age in seconds) of each temporary server running here whose repository lies under `root`: what a
        sweep finds after a worker was killed mid-tune."""

    def stop_process(self, pid: int) -> None:
        """Stop a server process that temporary_processes found."""

    def refresh_pool_figures(self, shared: Pool) -> None:
        """Read what the models loaded in the `shared` pool's running server hold now into their figures (GET
        /api/v1/pools/ shows them); figures only, no state changes."""


# --- The reconciler's -----------------------------------------------------------------------------------------------


class Launcher(Protocol):
    """What serves revisions: a runtime's dedicated launcher and its pool launcher are each one (runtimes/placed.py
    puts the two behind one Runtime)."""

    @property
    def ready_timeout_seconds(self) -> float:
        """How long a launch may take to become ready; the reconciler records the deadline and fails it past that."""

    @property
    def poll_seconds(self) -> float:
        """How soon to look again at a launch that is starting."""

    def check_plan(self, spec: RevisionSpec) -> dict[str, list[str]]:
        """Why this runtime cannot serve `spec` (its policy, and Triton's rules for its target), keyed by field:
        "replicas", "resources.gpu", "runtime", ... or "<model name>.<field>" for one model. Empty when it can."""

    def prepare(self, revision: Revision) -> Preparation:
        """Render (and publish) the revision's model repository; idempotent, also when two workers run it at once.
        Raises RenderError for a revision that cannot be rendered."""

    def launch(self, revision: Revision) -> Launch:
        """Start the revision's server, or adopt the one that is already there; returns once it is started."""

    def observe(self, launch: Launch) -> Observation:
        """Is the launch serving every model yet, still starting, or failed? Never waits for it."""

    def abandon(self, launch: Launch) -> None:
        """A launch that will not serve (it failed, timed out, or a newer revision replaces it): stop it."""

    def check(self, deployment: Deployment, launch: Launch) -> Health:
        """Is the launch the deployment serves from still serving?"""

    def retire(self, deployment: Deployment, keep: Sequence[Launch]) -> list[str]:
        """Stop what serves other revisions than `keep`, and remove what they left; a message per thing removed."""

    def stop(self, deployment: Deployment) -> None:
        """Stop serving (keep what is needed to start again)."""

    def teardown(self, deployment: Deployment) -> None:
        """Remove everything the deployment left: servers, files, cluster objects."""

    def logs(self, deployment: Deployment, lines: int, revision: Revision | None = None) -> str:
        """The tail of the Triton log of `revision` (deployments/log_revision.py chooses; None: the serving
        revision's, or the one being launched before any serves)."""

    # --- Shared pools: waking and idle unloading (issue 32; deployments/runtimes/placed.py) ------------------------

    def wake(self, load_id: int, wait_seconds: float) -> Wake:
        """A request arrived for a shared revision unloaded while idle (its PoolLoad `load_id`): load it again,
        waiting at most about `wait_seconds` (the gateway's load executor calls this, never an event loop)."""

    def unload_idle(self) -> list[str]:
        """Periodic: unload the pool models unused for their idle time, finish the loads requests woke, stop pool
        servers left empty; a line per thing done."""

    def sweep_orphans(self) -> list[str]:
        """Periodic: stop the servers this runtime started that no row knows any more; a line per server."""

    def refresh_access(self) -> int:
        """Periodic: renew what its servers fetch their repositories with before it expires (a cluster's presigned
        URLs); how many were renewed."""


class Runtime(Launcher, Answers, Protocol):
    """What the registry hands out: the launchers' operations, and what the pages, the API and the tuner ask."""


# --- Shared pools (issue 32) ------------------------------------------------------------------------------------
# A runtime serves a revision placed in a pool through its pool launcher, and a dedicated one through its own
# (runtimes/placed.py puts the two behind one Runtime); a launch in a pool says so in its ref.

POOL_REF_PREFIX = "pool:"


def is_pool_launch(launch: Launch) -> bool:
    return isinstance(launch.ref, str) and launch.ref.startswith(POOL_REF_PREFIX)


@dataclass(frozen=True)
class Wake:
    """How a wake went: `busy`, the pool was busy loading something else (retry shortly); `failure`, why it did not
    load ("" when it is loaded, or when it is still loading with nothing gone wrong: `loading`)."""

    busy: bool = False
    failure: str = ""
    loading: bool = False
