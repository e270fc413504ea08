"""The TorchScript trial run with the operator's runtime env, limits and sandbox (settings MODELPORT_RUNTIME_ENV,
TRIAL_RUN_*, SANDBOX_*), for the inspection task: the run itself is the core's (modelport.core.trial_run), which
reads no settings."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from infra import sandbox_settings
from modelport.core import frameworks
from modelport.core.errors import ArtifactRejected
from modelport.core.runtime_env import RuntimeEnvError, find_runtime_env
from modelport.core.sandbox import SandboxError
from modelport.core.signature import Signature
from modelport.core.trial_run import TRIAL_BATCH, TRIAL_DYNAMIC_SIZE, TrialRunFailed, excerpt, trial_run


@dataclass(frozen=True)
class TrialOutcome:
    ran: bool
    problems: list[str]
    note: str  # stored with the version: what was checked, or why not
    memory_bytes: int = 0  # the most the sandboxed run held at once (0: not measured), the version's figure


def check_torchscript(path: Path, signature: Signature) -> TrialOutcome:
    """The trial run with the configured runtime env and limits, in the sandbox."""
    try:
        env = find_runtime_env(Path(settings.MODELPORT_RUNTIME_ENV))
    except RuntimeEnvError:
        env = None
    if env is None or "torch" not in frameworks.detect(env.site_packages):
        return TrialOutcome(False, [],
                            "not run: the runtime env has no PyTorch, so the declared signature is unchecked")
    # The trial run is confined as the local Tritons are, by the same settings.
    caps = sandbox_settings.sandbox_capabilities()
    confinement = None
    if caps.available:
        confinement = frameworks.Confinement(
            caps, sandbox_settings.sandbox_options(),
            name=sandbox_settings.sandbox_name(f"trial-{secrets.token_hex(6)}"),
            pids_max=settings.SANDBOX_PIDS_MAX,
        )
    elif settings.SANDBOX_REQUIRED:
        # Fail closed: the model's code never runs unconfined. A Kubernetes Triton can still serve it.
        return TrialOutcome(False, [], f"not run: this machine cannot sandbox uploaded code ({caps.reason}), so the "
                                       "declared signature is unchecked")
    try:
        run = trial_run(path, signature, runtime_env=env, timeout=settings.TRIAL_RUN_TIMEOUT_SECONDS,
                        memory_bytes=settings.TRIAL_RUN_MEMORY_MB * 2**20, confinement=confinement)
    except TrialRunFailed as exc:
        # A Triton image's libtorch backend may serve what the local wrapper cannot: accepted, but unchecked.
        return TrialOutcome(False, [], f"not run: {exc}")
    except SandboxError as exc:
        return TrialOutcome(False, [], f"not run: the sandbox could not be built ({excerpt(exc)})")
    if run.problems:
        return TrialOutcome(True, run.problems, "failed: " + "; ".join(run.problems))
    return TrialOutcome(True, [], "passed: one call on zeros matched the declared signature", run.peak_bytes)


def torchscript_findings(path: Path, declared: Signature) -> tuple[dict[str, Any], int]:
    """For inspection: the trial run's note for the version's definition, and what the run was measured to take
    (0: not measured; a TorchScript version had no figure and got SANDBOX_DEFAULT_MEMORY, deployments/
    server_memory.py); ArtifactRejected when it failed."""
    outcome = check_torchscript(path, declared)
    if outcome.problems:
        raise ArtifactRejected(
            "The TorchScript model does not run as its declared signature says (one call on zeros, batch "
            f"{TRIAL_BATCH} where the first dimension is -1, other -1 dimensions {TRIAL_DYNAMIC_SIZE}): "
            + "; ".join(outcome.problems)
        )
    return {"trial_run": outcome.note}, outcome.memory_bytes
