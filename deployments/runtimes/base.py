"""What the reconciler needs from a runtime (the local Triton processes, or a Kubernetes cluster)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from deployments.models import Deployment, Revision
from deployments.revision_spec import RevisionSpec


@dataclass(frozen=True)
class Launch:
    """A server (or set of pods) serving one revision."""

    revision_id: int
    url: str  # what the gateway proxies to
    description: str  # for events: "pid 123, port 8000" or "Deployment acme/digits, 2 replicas"
    ref: int | str  # runtime-specific handle (a TritonServer id, a Kubernetes object name)


@dataclass(frozen=True)
class Ready:
    ready: bool
    message: str
    detail: str = ""  # Triton's own error lines, a pod's last log lines
    cancelled: bool = False


@dataclass(frozen=True)
class Health:
    ok: bool
    message: str = ""
    detail: str = ""


class RuntimeUnavailable(Exception):
    """The runtime cannot act at all: no cluster configured or reachable, S3 not configured, a request refused.
    The message says what to set or fix; the reconciler shows it as the deployment's status."""


class Runtime(Protocol):
    def check_plan(self, spec: RevisionSpec) -> dict[str, list[str]]:
        """Why this runtime cannot serve `spec` (its policy, and Triton's rules for its target), keyed by field:
        "replicas", "resources.gpu", "runtime", ... or "<model name>.<field>" for one model. Empty when it can."""

    def prepare(self, revision: Revision) -> None:
        """Render (and publish) the revision's model repository; idempotent. Raises RenderError."""

    def launch(self, revision: Revision) -> Launch:
        """Start the revision's server, or adopt the one that is already there."""

    def wait_ready(self, launch: Launch, keep_waiting: Callable[[], bool]) -> Ready:
        """Wait until it serves every model; `keep_waiting()` renews the caller's lease and says whether to go on."""

    def abandon(self, launch: Launch) -> None:
        """A launch that did not become ready: stop it."""

    def check(self, deployment: Deployment) -> Health:
        """Is the serving revision still serving?"""

    def retire(self, deployment: Deployment, keep: Launch) -> list[str]:
        """Stop what serves other revisions; returns a message per stopped server."""

    def stop(self, deployment: Deployment) -> None:
        """Stop serving (keep what is needed to start again)."""

    def teardown(self, deployment: Deployment) -> None:
        """Remove everything the deployment left: servers, files, cluster objects."""

    def logs(self, deployment: Deployment, lines: int) -> str:
        """The tail of Triton's log."""

