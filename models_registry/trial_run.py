"""The trial run of a TorchScript upload: its declared signature checked against one call on zeros.

TorchScript files carry no signature the portal can read without running them, so the uploader declares one, and
inspection (in the worker, never in a web request) runs the model once in the runtime env, on zeros shaped like the
declared inputs, called as the serving wrapper calls it. The outputs must have the declared names, datatypes and
ranks, the declared fixed sizes, and the batch of the inputs. The run happens in a subprocess with a time and
memory limit (deployments.frameworks.run_in_runtime_env): the artifact is untrusted.

Without PyTorch in the runtime env there is nothing to run it with: the version is accepted on its declared
signature (a Kubernetes Triton image can still serve it) and the note says the check was skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models_registry.signature import KSERVE_TO_NUMPY, Signature

PROBE_SCRIPT = Path(__file__).resolve().parent.parent / "deployments" / "backends" / "torchscript_probe.py"
# Inputs get this batch size, so that a batch dimension that does not pass through the model shows up.
TRIAL_BATCH = 2
# A dynamic dimension other than the batch gets this size.
TRIAL_DYNAMIC_SIZE = 1
_ERROR_MAX_CHARS = 1500


class TrialRunFailed(ValueError):
    """The model does not run as declared; the message says what to fix."""


@dataclass(frozen=True)
class TrialPlan:
    inputs: list[dict[str, Any]]  # {"name", "dtype", "shape"}
    outputs: list[str]
    batch: int | None  # the batch size fed, None when the signature has no batch dimension

    def to_json(self) -> str:
        return json.dumps({"inputs": self.inputs, "outputs": self.outputs})


def plan_for(signature: Signature) -> TrialPlan:
    """What to feed the model; TrialRunFailed for datatypes that numpy cannot make for a TorchScript module."""
    unsupported = [t.name for t in signature.inputs + signature.outputs if t.datatype in ("BYTES", "BF16")]
    if unsupported:
        raise TrialRunFailed(
            f"the local runtime serves TorchScript with numeric tensors only, and {', '.join(unsupported)} "
            "is BYTES or BF16"
        )
    batch = TRIAL_BATCH if signature.has_batch_dim else None
    inputs = []
    for tensor in signature.inputs:
        shape = [d if d != -1 else TRIAL_DYNAMIC_SIZE for d in tensor.dims]
        if batch is not None:
            shape[0] = batch
        inputs.append({"name": tensor.name, "dtype": KSERVE_TO_NUMPY[tensor.datatype], "shape": shape})
    return TrialPlan(inputs=inputs, outputs=[t.name for t in signature.outputs], batch=batch)


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _ERROR_MAX_CHARS else "…" + text[-_ERROR_MAX_CHARS:]


def judge(signature: Signature, plan: TrialPlan, result: object) -> list[str]:
    """Differences between what the trial run returned (the probe's JSON, untrusted) and the declared outputs."""
    if not isinstance(result, dict):
        return ["the trial run gave no answer"]
    if "error" in result:
        return [_clip(str(result["error"]))]
    outputs = result.get("outputs")
    if not isinstance(outputs, dict):
        return ["the trial run gave no outputs"]
    problems = []
    for tensor in signature.outputs:
        got = outputs.get(tensor.name)
        if not isinstance(got, dict) or not isinstance(got.get("shape"), list):
            problems.append(f"output '{tensor.name}' was not returned")
            continue
        dtype, shape = str(got.get("dtype")), got["shape"]
        expected_dtype = KSERVE_TO_NUMPY[tensor.datatype]
        if dtype != expected_dtype:
            problems.append(f"output '{tensor.name}' is {dtype}, declared {tensor.datatype} ({expected_dtype})")
        if len(shape) != len(tensor.dims):
            problems.append(f"output '{tensor.name}' has shape {shape}, declared dims {list(tensor.dims)}")
            continue
        for axis, (declared, actual) in enumerate(zip(tensor.dims, shape, strict=True)):
            if axis == 0 and plan.batch is not None:
                if actual != plan.batch:
                    problems.append(
                        f"output '{tensor.name}' has batch size {actual} for a batch of {plan.batch}: the first "
                        "dimension must be the batch on every input and output (or declare fixed dims)"
                    )
            elif declared != -1 and actual != declared:
                problems.append(
                    f"output '{tensor.name}' has shape {shape}, declared dims {list(tensor.dims)} (-1: any size)"
                )
                break
    return problems


def trial_run(
    path: Path, signature: Signature, *, runtime_env: Any, timeout: float, memory_bytes: int
) -> list[str]:
    """Problems found by running the TorchScript file at `path` on zeros in `runtime_env` ([] when it runs as
    declared). Raises TrialRunFailed for a signature that cannot be tried."""
    from deployments.frameworks import run_in_runtime_env

    plan = plan_for(signature)
    outcome = run_in_runtime_env(runtime_env, PROBE_SCRIPT, [str(Path(path).resolve()), plan.to_json()],
                                 timeout=timeout, memory_bytes=memory_bytes)
    if outcome.timed_out:
        return [f"the trial run on zeros did not finish within {timeout:g} s"]
    error = outcome.result.get("error") if isinstance(outcome.result, dict) else None
    if outcome.out_of_memory or (isinstance(error, str) and "can't allocate memory" in error):
        # torch reports a refused allocation as its own error, which the probe passes on.
        return [f"the trial run on zeros needed more than {memory_bytes // 2**20:,} MiB of memory"]
    if outcome.result is None:
        detail = _clip(outcome.stderr) or f"exit status {outcome.returncode}"
        return [f"the trial run on zeros crashed: {detail}"]
    return judge(signature, plan, outcome.result)


@dataclass(frozen=True)
class TrialOutcome:
    ran: bool
    problems: list[str]
    note: str  # stored with the version: what was checked, or why not


def check_torchscript(path: Path, signature: Signature) -> TrialOutcome:
    """The trial run with the configured runtime env and limits."""
    from django.conf import settings

    from deployments import frameworks
    from deployments.runtimes.local import triton as local_triton

    try:
        env = local_triton.find_runtime_env(settings.MODELPORT_RUNTIME_ENV)
    except local_triton.RuntimeEnvError:
        env = None
    if env is None or "torch" not in frameworks.detect(env.site_packages):
        return TrialOutcome(False, [], "not run: the runtime env has no PyTorch, so the declared signature is unchecked")
    try:
        problems = trial_run(path, signature, runtime_env=env, timeout=settings.TRIAL_RUN_TIMEOUT_SECONDS,
                             memory_bytes=settings.TRIAL_RUN_MEMORY_MB * 2**20)
    except TrialRunFailed as exc:
        # A Triton image's libtorch backend may serve what the local wrapper cannot: accepted, but unchecked.
        return TrialOutcome(False, [], f"not run: {exc}")
    if problems:
        return TrialOutcome(True, problems, "failed: " + "; ".join(problems))
    return TrialOutcome(True, [], "passed: one call on zeros matched the declared signature")


def torchscript_findings(path: Path, declared: Signature) -> dict[str, Any]:
    """For inspection: the trial run's note for the version's definition; ArtifactRejected when it failed."""
    from models_registry.validation import ArtifactRejected

    outcome = check_torchscript(path, declared)
    if outcome.problems:
        raise ArtifactRejected(
            "The TorchScript model does not run as its declared signature says (one call on zeros, batch "
            f"{TRIAL_BATCH} where the first dimension is -1, other -1 dimensions {TRIAL_DYNAMIC_SIZE}): "
            + "; ".join(outcome.problems)
        )
    return {"trial_run": outcome.note}
