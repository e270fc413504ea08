"""The trial call of a python model at inspection: one request on inputs made from its declared signature, to a
Triton of its own started as every local deployment's is (sandboxed), and the answer's outputs compared with the
signature: names, datatypes and shapes. This module holds what the registry knows (the request, the verdict's
shape, when to call); the call itself needs a Triton, which deployments own: the registry asks for it through its
`python_trial_call` signal (models_registry/signals.py), answered by deployments/runtimes/local/trial_call.py.

Why (issue 25): a python model returning its output under another name than its signature's was accepted, became
ready, and Triton answered it with HTTP 200 and `"outputs": []`. TorchScript gets a trial run for the same reason
(trial_run.py); a python model runs only inside Triton's python backend (pb_utils), so its trial is a real call.

With the version's example request (an upload field, modelport/core/example_request.py) the call sends that
instead of zeros, and the model must answer it. Without one, a model that fails on zeros (a step decoding images
raises on empty bytes) is accepted, unchecked, with a note naming its exception: a model failing on made-up input
says nothing about the model. An answer that contradicts the signature is refused either way.

What it cannot check, and says so in the version's note: a model with requirements (its environment is built at
deploy time, not at inspection), where this machine has no local Triton, or zeros the model refuses or fails on
(INVALID_ARG, or an exception: zeros are no image, say). The gateway still refuses, at serve time, any answer
missing an output.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelport.core.example_request import ExampleRequest
from modelport.core.signature import Signature
from modelport.core.trial_run import TRIAL_BATCH, TRIAL_DYNAMIC_SIZE, excerpt, trial_batch, trial_shape

log = logging.getLogger(__name__)

MODEL_NAME = "model"
_ERROR_MAX_CHARS = 600


@dataclass(frozen=True)
class TrialCall:
    ran: bool
    problems: list[str]
    note: str  # stored with the version: what was checked, or why not
    memory_bytes: int = 0  # the peak of the model's own processes after the call (0: not measured)


@dataclass(frozen=True)
class TrialFindings:
    """What a trial at inspection adds to the version: its note (into the definition), and what the model's own
    processes took at their peak (0: not measured), kept as the version's measured memory."""

    definition: dict[str, Any]
    memory_bytes: int = 0


def trial_request(signature: Signature) -> tuple[dict[str, Any], int | None]:
    """The request (zeros, empty strings for BYTES, false for BOOL; optional inputs left out) and the batch size it
    carries (None: none)."""
    batch = trial_batch(signature)
    inputs = []
    for tensor in signature.inputs:
        if tensor.optional:
            continue  # left out, as a caller may leave it out: a zero is seldom a value the model takes (max_tokens)
        shape = trial_shape(tensor.dims, batch)
        fill: Any = "" if tensor.datatype == "BYTES" else False if tensor.datatype == "BOOL" else 0
        inputs.append({"name": tensor.name, "datatype": tensor.datatype, "shape": shape,
                       "data": [fill] * math.prod(shape)})
    return {"inputs": inputs}, batch


def clip(text: str) -> str:
    # What the model or its server chose to say is untrusted: the TorchScript trial run's bounded, printable excerpt.
    return excerpt(text, _ERROR_MAX_CHARS)


def python_findings(archive: Path, signature: Signature, has_requirements: bool,
                    example: ExampleRequest | None = None) -> dict[str, Any]:
    """For inspection: the trial call's note for the version's definition; ArtifactRejected when it failed. The
    call sends `example` (the version's example request) where there is one, zeros otherwise."""
    return python_trial(archive, signature, has_requirements, example).definition


def python_trial(archive: Path, signature: Signature, has_requirements: bool,
                 example: ExampleRequest | None = None, decoupled: bool = False) -> TrialFindings:
    """python_findings, with what the model took at its trial call."""
    from django.conf import settings

    from models_registry.validation import ArtifactRejected

    # Not run (no note): switched off, or the model has requirements, whose environment is built when it is
    # deployed; the gateway then still refuses any answer missing an output.
    if not settings.PYTHON_TRIAL_CALL or has_requirements or not signature.inputs or not signature.outputs:
        return TrialFindings({})
    from models_registry.signals import python_trial_call

    responses: list[tuple[object, object]] = list(python_trial_call.send(
        sender=None, archive=archive, signature=signature, timeout=float(settings.TRIAL_RUN_TIMEOUT_SECONDS),
        example=example, decoupled=decoupled))
    answers = [answer for _, answer in responses if isinstance(answer, TrialCall)]
    if not answers:
        return TrialFindings({"trial_call": "not run: no runtime answers the trial call here"})
    outcome = answers[0]
    if outcome.problems:
        fed = ("one call on the example request" if example is not None else
               f"one call on zeros, batch {TRIAL_BATCH} where the first dimension is -1, other -1 dimensions "
               f"{TRIAL_DYNAMIC_SIZE}")
        if decoupled:
            fed = "streamed, " + fed
        raise ArtifactRejected(
            f"The python model does not answer as its declared signature says ({fed}): " + "; ".join(outcome.problems))
    return TrialFindings({"trial_call": outcome.note}, outcome.memory_bytes)
