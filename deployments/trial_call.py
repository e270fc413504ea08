"""The python trial call's server side (models_registry/python_trial.py asks for it through the registry's
`python_trial_call` signal, which sits below deployments): a sandboxed Triton of the model's own, started as every
local deployment's is, one call on the registry's request, stopped; and the verdict on the answer."""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from django.dispatch import receiver

from modelport.core.signature import Signature, Tensor
from modelport.core.trial_run import TRIAL_BATCH
from models_registry.python_trial import MODEL_NAME, TrialCall, clip, trial_request
from models_registry.signals import python_trial_call

_MAX_ANSWER_BYTES = 16 * 1024 * 1024


@receiver(python_trial_call)
def _answer(sender: object, *, archive: Path, signature: Signature, timeout: float, **kwargs: Any) -> TrialCall:
    return call_model(archive, signature, timeout=timeout)

def judge(signature: Signature, batch: int | None, answer: object) -> list[str]:
    """What differs between the trial call's answer (untrusted: the model made it) and the declared outputs."""
    from deployments.render import served_dims

    outputs = answer.get("outputs") if isinstance(answer, dict) else None
    if not isinstance(outputs, list):
        return ["the trial call's answer has no outputs"]
    got = {o["name"]: o for o in outputs if isinstance(o, dict) and isinstance(o.get("name"), str)}
    problems = []
    returned = ", ".join(f"'{n}'" for n in sorted(got)) or "none"
    for tensor in signature.outputs:
        out = got.get(tensor.name)
        if out is None:
            # Triton drops what the model returns under undeclared names: "none" is what a misnamed output shows.
            problems.append(f"output '{tensor.name}' was not returned (the answer held {returned}; Triton drops "
                            "outputs named otherwise than the signature: name each output as the signature does)")
            continue
        problems += _compare(tensor, out, batch, served_dims(tensor.dims, batch is not None))
    return problems


def _compare(tensor: Tensor, out: dict[str, Any], batch: int | None, declared: list[int]) -> list[str]:
    problems = []
    if out.get("datatype") != tensor.datatype:
        problems.append(f"output '{tensor.name}' is {str(out.get('datatype'))[:20]}, declared {tensor.datatype}")
    shape = out.get("shape")
    if not isinstance(shape, list) or len(shape) != len(declared):
        return [*problems, f"output '{tensor.name}' has shape {str(shape)[:60]}, declared {declared}"]
    for axis, (want, actual) in enumerate(zip(declared, shape, strict=True)):
        if axis == 0 and batch is not None:
            if actual != batch:
                problems.append(f"output '{tensor.name}' has batch size {actual} for a batch of {batch}: the first "
                                "dimension must be the batch on every input and output (or declare fixed dims)")
        elif want != -1 and actual != want:
            problems.append(f"output '{tensor.name}' has shape {shape}, declared {declared} (-1: any size)")
            break
    return problems


def _post(url: str, body: bytes, timeout: float) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - our own Triton
            return int(response.status), response.read(_MAX_ANSWER_BYTES)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(_MAX_ANSWER_BYTES)


def call_model(archive: Path, signature: Signature, *, timeout: float) -> TrialCall:
    """Start a sandboxed Triton serving the archive, call it once, stop it, and judge the answer."""
    from django.conf import settings

    from deployments import pyenvs
    from deployments.render import RenderError, render_repository
    from deployments.revision_spec import ModelEntry, RevisionSpec
    from deployments.runtimes.base import RuntimeUnavailable
    from deployments.runtimes.local import readiness
    from deployments.runtimes.local.confined import start_confined, stop_confined
    from modelport.core.definitions import PythonDefinition
    from models_registry.validation import archive_limits

    request, batch = trial_request(signature)
    entry = ModelEntry(name=MODEL_NAME, version=1, format="python", signature=signature, sha256="trial",
                       max_batch_size=TRIAL_BATCH if batch is not None else 0, definition=PythonDefinition())
    spec = RevisionSpec(runtime="local", models=(entry,))
    Path(settings.VAR_DIR).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="trial-", dir=settings.VAR_DIR))
    confined = None
    try:
        repository = workdir / "repository"
        render_repository(spec.repository(lambda _: archive), "local", repository, archive_limits=archive_limits())
        pyenvs.readable_by_all(repository)
        try:
            confined = start_confined(spec, repository, workdir / "scratch", workdir / "triton.log",
                                      label="the trial call")
        except RuntimeUnavailable as exc:
            return TrialCall(False, [], f"not run: {exc}")
        ready = readiness.wait_ready(confined.process, [MODEL_NAME], timeout=timeout)
        if not ready.ready:
            return TrialCall(True, [f"the model did not load: {clip(ready.message or 'no reason given')}"],
                             "failed: the model did not load")
        status, body = _post(f"{confined.process.http_url}/v2/models/{MODEL_NAME}/infer",
                             json.dumps(request).encode(), timeout)
    except RenderError as exc:
        return TrialCall(True, [str(exc)], f"failed: {exc}")
    except (OSError, TimeoutError) as exc:
        return TrialCall(True, [f"the trial call got no answer ({type(exc).__name__})"], "failed: no answer")
    finally:
        if confined is not None:
            stop_confined(confined)
        shutil.rmtree(workdir, ignore_errors=True)
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if status == 400:
        # The model refused inputs made of zeros as invalid (INVALID_ARG): not the model's fault, not checked.
        message = answer.get("error") if isinstance(answer, dict) else ""
        return TrialCall(True, [], f"not checked: the model refused inputs of zeros as invalid ({clip(str(message))})")
    if status != 200:
        message = answer.get("error") if isinstance(answer, dict) else body[:200].decode("utf-8", "replace")
        problem = f"the trial call on zeros failed with HTTP {status}: {clip(str(message))}"
        return TrialCall(True, [problem], "failed: " + problem)
    problems = judge(signature, batch, answer)
    if problems:
        return TrialCall(True, problems, "failed: " + "; ".join(problems))
    return TrialCall(True, [], "passed: one call on zeros matched the declared signature")


