"""What a served model promises its callers (its signature as the deployment serves it), and the two uses the
gateway makes of it: Triton's error answers reworded for the caller, and answers missing an output refused.

Plain functions over text and bytes, no Django. Why they exist (issue 25, "nothing silent"):
- Triton's errors are written for whoever runs the server: "[request id: <id_unknown>]" and advice such as "try
  setting max_batch_size to zero" reach a caller who can change neither. A caller who sent the wrong shape is told
  the shape the deployment takes, from its signature, and keeps the 400.
- A python model that returns outputs under other names than its signature's makes Triton answer 200 with
  `"outputs": []`: an answer missing a requested or declared output is an error that names it.
- A python model's exception reaches the caller as a 500 carrying its repr (addresses, paths). A model's fault stays
  a 500 but with words that show nothing of its internals; a model that blames the input (pb_utils.TritonError with
  code INVALID_ARG) answers 400 with its own words.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from deployments.render import served_dims
from deployments.revision_spec import ModelEntry, RevisionSpec
from modelport.core.signature import Tensor


@dataclass(frozen=True)
class TensorContract:
    name: str
    datatype: str
    shape: tuple[int, ...]  # as clients send it: the batch dimension first when the model batches (-1: any size)
    optional: bool = False  # an input a request may leave out (the signature's `optional`)

    def text(self) -> str:
        return f"'{self.name}' ({self.datatype} {_shape(self.shape)})"


@dataclass(frozen=True)
class Contract:
    model: str
    max_batch_size: int
    inputs: tuple[TensorContract, ...]
    outputs: tuple[TensorContract, ...]
    decoupled: bool = False  # it streams: /infer is refused before it reaches Triton (gateway/admission.py)
    chat_template: str = ""  # the OpenAI-compatible chat endpoint's template for it ("": the default one)

    def input(self, name: str) -> TensorContract | None:
        return next((t for t in self.inputs if t.name == name), None)

    def shape_rule(self) -> str:
        if self.max_batch_size > 0:
            return (f"the first dimension is the batch, 1 to {self.max_batch_size} rows per request; -1 is any "
                    "size")
        return "-1 is any size; this model takes no batch dimension"

    def inputs_text(self) -> str:
        return ", ".join(t.text() for t in self.inputs) or "none"

    def outputs_text(self) -> str:
        return ", ".join(t.text() for t in self.outputs) or "none"


def contract_for(entry: ModelEntry) -> Contract:
    batched = entry.max_batch_size > 0

    def tensors(items: Iterable[Tensor]) -> tuple[TensorContract, ...]:
        return tuple(TensorContract(t.name, t.datatype, tuple(served_dims(t.dims, batched)), t.optional)
                     for t in items)

    return Contract(model=entry.name, max_batch_size=entry.max_batch_size, inputs=tensors(entry.signature.inputs),
                    outputs=tensors(entry.signature.outputs), decoupled=entry.decoupled,
                    chat_template=entry.chat_template)


def contracts_for(spec: RevisionSpec | None) -> Mapping[str, Contract]:
    return {m.name: contract_for(m) for m in spec.models} if spec is not None else {}


def _shape(dims: Iterable[int]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


# --- Triton's error answers --------------------------------------------------------------------------------------

_REQUEST_ID = re.compile(r"\[request id: [^\]]*\]\s*")
# Triton 2.51's messages for the mistakes a caller makes most (measured on the real server,
# tests/test_serving_errors_e2e.py keeps them true).
_SHAPE = re.compile(r"unexpected shape for input '(?P<input>[^']*)' for model '[^']*'\. Expected \[[^\]]*\], got "
                    r"(?P<got>\[[^\]]*\])")
_BATCH = re.compile(r"inference request batch-size must be <= (?P<max>\d+) for '[^']*'")
_UNKNOWN_INPUT = re.compile(r"unexpected inference input '(?P<input>[^']*)' for model")
_UNKNOWN_OUTPUT = re.compile(r"unexpected inference output '(?P<output>[^']*)' for model")
_INPUT_COUNT = re.compile(r"expected \d+ inputs but got \d+ inputs for model")
_DATATYPE = re.compile(r"inference input '(?P<input>[^']*)' data-type is '(?P<got>[^']*)', but model '[^']*' "
                       r"expects '[^']*'")
# Operator advice Triton appends to shape errors ("try setting max_batch_size to zero", "See the model configuration
# docs"): the caller cannot change the model's configuration.
_ADVICE = re.compile(r"\s*NOTE: Setting a non-zero max_batch_size.*$", re.DOTALL)
MODEL_FAULT = ("Model '{model}' failed on this request: the fault is in the model, not in the request. Its team "
               "can try it on the deployment page and read the server's log there.")


def reword(status: int, message: str, contract: Contract | None) -> tuple[int, str]:
    """The (status, message) a caller gets for one of Triton's error answers to an inference request."""
    message = _REQUEST_ID.sub("", message).strip()
    if status == 500:
        # A model's own exception (its repr, a path, an address) or Triton's internal failure: nothing of it is for
        # the caller. The parse failures a caller causes were made 400 before (protocol.client_error).
        return status, MODEL_FAULT.format(model=contract.model if contract else "the model")
    if contract is None:
        return status, _ADVICE.sub("", message)
    if match := _SHAPE.search(message):
        tensor = contract.input(match["input"])
        if tensor is not None:
            sent = match["got"].replace(",", ", ")
            return status, (f"Input '{tensor.name}' of model '{contract.model}' takes shape {_shape(tensor.shape)} "
                            f"({tensor.datatype}; {contract.shape_rule()}); you sent {sent}.")
    if match := _BATCH.search(message):
        return status, (f"Model '{contract.model}' takes at most {match['max']} rows per request (the first dimension "
                        f"of every input is the batch): send fewer rows per request. Its inputs: "
                        f"{contract.inputs_text()}.")
    if match := _UNKNOWN_INPUT.search(message):
        return status, (f"Model '{contract.model}' has no input '{match['input']}': it takes "
                        f"{contract.inputs_text()} ({contract.shape_rule()}).")
    if match := _UNKNOWN_OUTPUT.search(message):
        return status, (f"Model '{contract.model}' has no output '{match['output']}': it gives "
                        f"{contract.outputs_text()}.")
    if _INPUT_COUNT.search(message):
        return status, (f"Model '{contract.model}' takes the inputs {contract.inputs_text()} "
                        f"({contract.shape_rule()}): send each of them once.")
    if match := _DATATYPE.search(message):
        tensor = contract.input(match["input"])
        if tensor is not None:
            return status, (f"Input '{tensor.name}' of model '{contract.model}' takes {tensor.datatype} "
                            f"{_shape(tensor.shape)}; you sent {match['got']}.")
    return status, _ADVICE.sub("", message)


# --- Answers missing an output -----------------------------------------------------------------------------------


def requested_outputs(request: object) -> tuple[str, ...] | None:
    """The output names an inference request asks for (its "outputs"), or None: it asks for all of them."""
    if not isinstance(request, dict):
        return None
    outputs = request.get("outputs")
    if not isinstance(outputs, list) or not outputs:
        return None
    names = tuple(o["name"] for o in outputs if isinstance(o, dict) and isinstance(o.get("name"), str))
    return names or None


def missing_outputs(answer_json: bytes, expected: Iterable[str]) -> list[str]:
    """The names among `expected` that Triton's JSON answer (or the JSON header of a binary one) holds no output
    for. Without parsing the tensors: Triton writes each output object as `{"name":"<name>",...` and escapes every
    quote inside a string, so that sequence can only stand where an output object begins."""
    return [name for name in expected if b'{"name":' + json.dumps(name, ensure_ascii=False).encode() not in answer_json]


def missing_message(model: str, missing: list[str], requested: bool) -> str:
    names = ", ".join(f"'{n}'" for n in missing)
    which = "asked for in the request" if requested else "declared in its signature"
    return (f"Model '{model}' answered without its output {names} ({which}): the model returned other outputs "
            "or none. The fault is in the model; its team must make it return every output of its signature.")
