"""The trial run of a TorchScript upload: its declared signature checked against one call on zeros.

TorchScript files carry no signature the portal can read without running them, so the uploader declares one, and
inspection (in the worker, never in a web request) runs the model once in the runtime env, on zeros shaped like the
declared inputs, called as the serving wrapper calls it. The outputs must have the declared names, datatypes and
ranks, the declared fixed sizes, and the batch of the inputs.

The artifact is untrusted code (forward() may map any file the process can open, with torch.from_file), so the run
happens in the sandbox the local Tritons run in (modelport.core.frameworks.run_in_runtime_env with a confinement): no
network, only the runtime env and a read-only copy of the artifact visible, a scratch directory, time, CPU, memory
and process limits. Where this machine cannot build the sandbox it is not run at all while SANDBOX_REQUIRED is on.
What comes back is untrusted too: an error is echoed to the uploader only as a fixed phrase, an exception type
that is an identifier, and a short excerpt of printable ASCII (`excerpt`).

Without PyTorch in the runtime env there is nothing to run it with: the version is accepted on its declared
signature (a Kubernetes Triton image can still serve it) and the note says the check was skipped.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelport.core.frameworks import Confinement, ScriptResult, run_in_runtime_env
from modelport.core.runtime_env import RuntimeEnv
from modelport.core.signature import KSERVE_TO_NUMPY, Signature

BACKENDS = Path(__file__).resolve().parent / "backends"
PROBE_SCRIPT = BACKENDS / "torchscript_probe.py"
PROBE_MODULES = (BACKENDS / "torchscript_io.py",)
# Inputs get this batch size, so that a batch dimension that does not pass through the model shows up.
TRIAL_BATCH = 2
# A dynamic dimension other than the batch gets this size.
TRIAL_DYNAMIC_SIZE = 1
# The most of an error's own text (from code in the artifact) that is echoed: enough for "RuntimeError: expected
# 3 channels, got 4", too little to carry much of anything else.
EXCERPT_MAX_CHARS = 160
# What the probe was doing, in the portal's words (the probe's own words are the artifact's to choose).
_STAGES = {
    "load": "torch.jit.load failed",
    "signature": "the model cannot be called as declared",
    "call": "the model failed on zeros",
}
_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class TrialRunFailed(ValueError):
    """The model does not run as declared; the message says what to fix."""


@dataclass(frozen=True)
class TrialPlan:
    inputs: list[dict[str, Any]]  # {"name", "dtype", "shape"}
    outputs: list[str]
    batch: int | None  # the batch size fed, None when the signature has no batch dimension

    def to_json(self) -> str:
        return json.dumps({"inputs": self.inputs, "outputs": self.outputs})


def trial_batch(signature: Signature) -> int | None:
    """The batch size a trial feeds (None: the signature has no batch dimension)."""
    return TRIAL_BATCH if signature.has_batch_dim else None


def trial_shape(dims: tuple[int, ...], batch: int | None) -> list[int]:
    """The shape a trial feeds a tensor of these declared dims: the batch first, other -1 dims TRIAL_DYNAMIC_SIZE.
    The python trial call (python_trial.py) feeds the same."""
    shape = [d if d != -1 else TRIAL_DYNAMIC_SIZE for d in dims]
    if batch is not None:
        shape[0] = batch
    return shape


def plan_for(signature: Signature) -> TrialPlan:
    """What to feed the model; TrialRunFailed for datatypes that numpy cannot make for a TorchScript module."""
    unsupported = [t.name for t in signature.inputs + signature.outputs if t.datatype in ("BYTES", "BF16")]
    if unsupported:
        raise TrialRunFailed(
            f"the local runtime serves TorchScript with numeric tensors only, and {', '.join(unsupported)} "
            "is BYTES or BF16"
        )
    batch = trial_batch(signature)
    inputs = [{"name": t.name, "dtype": KSERVE_TO_NUMPY[t.datatype], "shape": trial_shape(t.dims, batch)}
              for t in signature.inputs]
    return TrialPlan(inputs=inputs, outputs=[t.name for t in signature.outputs], batch=batch)


def excerpt(text: object, limit: int = EXCERPT_MAX_CHARS) -> str:
    """A short, printable excerpt of text that sandboxed code chose: its last non-empty line (where Python and
    TorchScript put the message under a traceback), control and non-ASCII characters removed, whitespace collapsed,
    at most `limit` characters."""
    lines = [line for line in str(text)[-65536:].splitlines() if line.strip()]
    printable = "".join(ch if " " <= ch <= "~" else " " for ch in (lines[-1] if lines else ""))
    cleaned = " ".join(printable.split())
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 3] + "..."


def describe_error(error: object) -> str:
    """The probe's {"stage", "type", "message"} as one bounded line for the uploader."""
    if not isinstance(error, dict):
        return f"the trial run failed: {excerpt(error)}"
    phrase = _STAGES.get(str(error.get("stage")), "the trial run failed")
    kind = str(error.get("type"))
    detail = excerpt(error.get("message", ""))
    if _TYPE_NAME.fullmatch(kind) and not detail.startswith(("builtins.", kind)):
        detail = f"{kind}: {detail}" if detail else kind
    return f"{phrase}: {detail}" if detail else phrase


MAX_DIMS = 64  # more than any declared signature has; a longer "shape" is a model writing its own result
_KNOWN_DTYPES = frozenset(KSERVE_TO_NUMPY.values())


def judge(signature: Signature, plan: TrialPlan, result: object) -> list[str]:
    """Differences between what the trial run returned (the probe's JSON, untrusted) and the declared outputs."""
    if not isinstance(result, dict):
        return ["the trial run gave no answer"]
    if "error" in result:
        return [describe_error(result["error"])]
    outputs = result.get("outputs")
    if not isinstance(outputs, dict):
        return ["the trial run gave no outputs"]
    problems = []
    for tensor in signature.outputs:
        got = outputs.get(tensor.name)
        if not isinstance(got, dict) or not isinstance(got.get("shape"), list):
            problems.append(f"output '{tensor.name}' was not returned")
            continue
        # The model can write the probe's result itself: its type and shape are quoted only as known names and
        # integers, never as it sent them (a 256 KiB type of escape characters would land in the version's error).
        dtype, shape = got.get("dtype"), got["shape"]
        if len(shape) > MAX_DIMS or not all(type(n) is int for n in shape):
            problems.append(f"output '{tensor.name}' has a shape that is not a list of at most {MAX_DIMS} integers")
            continue
        expected_dtype = KSERVE_TO_NUMPY[tensor.datatype]
        if dtype != expected_dtype:
            named = dtype if dtype in _KNOWN_DTYPES else f"of an unknown type {excerpt(dtype, 40)!r}"
            problems.append(f"output '{tensor.name}' is {named}, declared {tensor.datatype} ({expected_dtype})")
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


@dataclass(frozen=True)
class TrialRunResult:
    problems: list[str]  # [] when it ran as declared
    # The most memory the run's sandbox held at once (the process that loaded torch and the model and called it;
    # 0 unconfined or without a cgroup): what its version is measured to take.
    peak_bytes: int = 0


def trial_run(
    path: Path, signature: Signature, *, runtime_env: RuntimeEnv, timeout: float, memory_bytes: int,
    confinement: Confinement | None = None,
) -> TrialRunResult:
    """What running the TorchScript file at `path` on zeros in `runtime_env` found, sandboxed by `confinement`
    (None: unconfined). Raises TrialRunFailed for a signature that cannot be tried."""
    plan = plan_for(signature)
    outcome = run_in_runtime_env(runtime_env, PROBE_SCRIPT, [plan.to_json()], artifact=Path(path),
                                 modules=PROBE_MODULES, timeout=timeout, memory_bytes=memory_bytes,
                                 confinement=confinement)
    return TrialRunResult(_problems(signature, plan, outcome, timeout, memory_bytes), outcome.peak_bytes)


def _problems(signature: Signature, plan: TrialPlan, outcome: ScriptResult, timeout: float,
              memory_bytes: int) -> list[str]:
    if outcome.timed_out:
        return [f"the trial run on zeros did not finish within {timeout:g} s"]
    if outcome.out_of_cpu_time:
        return [f"the trial run on zeros used more than {timeout:g} s of CPU time"]
    error = outcome.result.get("error") if isinstance(outcome.result, dict) else None
    message = str(error.get("message")) if isinstance(error, dict) else str(error)
    if outcome.out_of_memory or "can't allocate memory" in message:
        # torch reports a refused allocation as its own error, which the probe passes on.
        return [f"the trial run on zeros needed more than {memory_bytes // 2**20:,} MiB of memory"]
    if outcome.result is None:
        return [f"the trial run on zeros crashed: {_crash(outcome.returncode, outcome.stderr)}"]
    return judge(signature, plan, outcome.result)


def _crash(returncode: int | None, stderr: str) -> str:
    # The sandbox's launcher passes a signal on as 128 + its number, a plain subprocess as minus it.
    number = returncode - 128 if returncode is not None and returncode > 128 else -(returncode or 0)
    if number > 0:
        try:
            return f"killed by {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    return excerpt(stderr) or f"exit status {returncode}"
