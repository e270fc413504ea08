"""The python trial call's server side (models_registry/python_trial.py asks for it through the registry's
`python_trial_call` signal, which sits below deployments): a sandboxed Triton of the model's own, started as every
local deployment's is, one call on the registry's request, stopped; and the verdict on the answer."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from django.dispatch import receiver

from deployments.runtimes.local import trial_stream
from modelport.core.example_request import ExampleRequest
from modelport.core.signature import Signature, Tensor
from modelport.core.trial_run import TRIAL_BATCH
from models_registry.python_trial import MODEL_NAME, TrialCall, clip, trial_request
from models_registry.signals import python_trial_call

_MAX_ANSWER_BYTES = 16 * 1024 * 1024
# The python backend reports an exception raised by execute() as "..., message: TypeName: text": the type is named
# in the note of a model accepted unchecked (only an identifier, never the model's text beyond `clip`).
_PREAMBLE = re.compile(r"^Failed to process the request\(s\) for model '[^']*', message: ")
_EXCEPTION = re.compile(r"([A-Za-z_][A-Za-z0-9_.]{0,99}): ")


@receiver(python_trial_call)
def _answer(sender: object, *, archive: Path, signature: Signature, timeout: float,
            example: ExampleRequest | None = None, decoupled: bool = False, **kwargs: Any) -> TrialCall:
    return call_model(archive, signature, timeout=timeout, example=example, decoupled=decoupled)


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


def _post(url: str, body: bytes, timeout: float, header_length: int | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if header_length is not None:
        # Triton's binary tensor extension: the JSON header, then the BYTES inputs' raw bytes.
        headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_length)}
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - our own Triton
            return int(response.status), response.read(_MAX_ANSWER_BYTES)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(_MAX_ANSWER_BYTES)


def call_model(archive: Path, signature: Signature, *, timeout: float,
               example: ExampleRequest | None = None, decoupled: bool = False) -> TrialCall:
    """Start a sandboxed Triton serving the archive, call it once (on `example`, or zeros), stop it, and judge the
    answer; a streaming (decoupled) model's every piece (deployments/runtimes/local/trial_stream.py)."""
    from django.conf import settings

    from deployments import pyenvs
    from deployments.render import RenderError, render_repository
    from deployments.revision_spec import ModelEntry, RevisionSpec
    from deployments.runtimes.base import RuntimeUnavailable
    from deployments.runtimes.local import pool_memory, readiness
    from deployments.runtimes.local.confined import start_confined, stop_confined
    from modelport.core.definitions import PythonDefinition
    from models_registry.validation import archive_limits

    header_length: int | None = None
    streamed: list[trial_stream.TrialInput] = []
    if example is not None:
        payload, header_length = example.triton_body()
        batch = example.batch
        streamed = [trial_stream.TrialInput(i.tensor.name, i.tensor.datatype, i.shape, i.data) for i in example.inputs]
    else:
        request, batch = trial_request(signature)
        payload = json.dumps(request).encode()
        streamed = [trial_stream.TrialInput(i["name"], i["datatype"], i["shape"], i["data"]) for i in request["inputs"]]
    entry = ModelEntry(name=MODEL_NAME, version=1, format="python", signature=signature, sha256="trial",
                       max_batch_size=max(TRIAL_BATCH, batch) if batch is not None else 0,
                       definition=PythonDefinition(), decoupled=decoupled)
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
        if decoupled:
            pieces = trial_stream.stream_call(f"{confined.process.host}:{confined.process.grpc_port}", MODEL_NAME,
                                              streamed, timeout)
        else:
            status, body = _post(f"{confined.process.http_url}/v2/models/{MODEL_NAME}/infer", payload, timeout,
                                 header_length)
        # The model's own processes' peak after a call: the version's first measured memory (issue 31), from which
        # a dedicated deployment's limit is derived (deployments/server_memory.py).
        peak = pool_memory.model_peaks(confined.process.pid, repository, [MODEL_NAME])[MODEL_NAME]
    except RenderError as exc:
        return TrialCall(True, [str(exc)], f"failed: {exc}")
    except (OSError, TimeoutError) as exc:
        return TrialCall(True, [f"the trial call got no answer ({type(exc).__name__})"], "failed: no answer")
    finally:
        if confined is not None:
            stop_confined(confined)
        shutil.rmtree(workdir, ignore_errors=True)
    if decoupled:
        outcome = stream_verdict(signature, batch, pieces, example is not None)
    else:
        outcome = verdict(signature, batch, status, body, example is not None)
    return dataclasses.replace(outcome, memory_bytes=peak)


def stream_verdict(signature: Signature, batch: int | None, streamed: trial_stream.Streamed,
                   on_example: bool) -> TrialCall:
    """A streaming model's trial outcome: every piece judged as a unary answer is, and an error that ended the stream
    treated as a unary call's 500 is (on zeros accepted unchecked with a note, on the example request refused)."""
    fed = "the example request" if on_example else "zeros"
    for index, piece in enumerate(streamed.pieces):
        problems = judge(signature, batch, piece)
        if problems:
            problems = [f"piece {index + 1} of the stream: {problem}" for problem in problems]
            return TrialCall(True, problems, "failed: " + "; ".join(problems))
    if streamed.error is not None:
        body = json.dumps({"error": streamed.error}).encode()
        return verdict(signature, batch, 500, body, on_example)
    if not streamed.pieces:
        problem = f"the streamed trial call on {fed} ended without a single piece (a response with outputs)"
        return TrialCall(True, [problem], "failed: " + problem)
    return TrialCall(True, [], f"passed: one streamed call on {fed}: each of its {len(streamed.pieces)} pieces "
                               "matched the declared signature")


def verdict(signature: Signature, batch: int | None, status: int, body: bytes, on_example: bool) -> TrialCall:
    """The trial's outcome from Triton's answer (untrusted: the model made it). On zeros, a model that refuses them
    (400) or fails on them (500: a step decoding images raises on empty bytes) is accepted unchecked, with a note
    naming the exception; on the uploader's own example request it must answer. An answer that contradicts the
    signature is refused either way."""
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    error = str(answer.get("error")) if isinstance(answer, dict) else body[:200].decode("utf-8", "replace")
    # Without the traceback the python backend appends ("At: <paths of this machine>") and its own preamble.
    message = clip(_PREAMBLE.sub("", error.split("\n\nAt:", 1)[0]))
    fed = "the example request" if on_example else "zeros"
    if status != 200 and on_example:
        problem = f"the trial call on the example request failed with HTTP {status}: {message}"
        return TrialCall(True, [problem], "failed: " + problem)
    if status == 400:
        # The model refused inputs made of zeros as invalid (INVALID_ARG): not the model's fault, not checked.
        return TrialCall(True, [], f"not checked: the model refused inputs of zeros as invalid ({message})")
    if status != 200:
        raised = _EXCEPTION.match(message)
        what = f"raised {raised.group(1)}" if raised else f"failed with HTTP {status}"
        return TrialCall(True, [], f"not checked: the model {what} on inputs of zeros (empty strings for BYTES): "
                                   f"{message}. Send an example request with the version to have it checked.")
    problems = judge(signature, batch, answer)
    if problems:
        return TrialCall(True, problems, "failed: " + "; ".join(problems))
    return TrialCall(True, [], f"passed: one call on {fed} matched the declared signature")
