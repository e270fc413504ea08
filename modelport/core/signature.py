"""Model signatures: input and output tensors with KServe v2 datatypes and full shapes.

`dims` is the shape the model itself sees, batch dimension included (-1 for a dynamic dimension). A model is
batchable when every input and output has a dynamic first dimension; Triton's config then omits that dimension and
sets max_batch_size instead (the renderer does that).

An input may be declared `"optional": true` (a python model's only, checked at inspection): Triton's config then says
`optional: true` and a request may leave it out, as Triton's OpenAI frontend sends `max_tokens`, `temperature`, ...
only when the caller gave them. The key is written only when true, so every signature without one reads as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modelport.core import json_input
from modelport.core.datatypes import KSERVE_TO_NUMPY, KSERVE_TO_TRITON, TRITON_TO_KSERVE

__all__ = ["KSERVE_TO_NUMPY", "KSERVE_TO_TRITON", "TRITON_TO_KSERVE"]

# The datatype names, from the one table (modelport.core.datatypes); re-exported for existing callers.
class SignatureError(ValueError):
    """A signature that cannot be used; the message says what to fix."""


def normalize_datatype(value: object) -> str:
    """KServe name for a datatype given as KServe ('FP32') or Triton ('TYPE_FP32', 'TYPE_STRING') name."""
    allowed = f"use one of {', '.join(KSERVE_TO_TRITON)} (or Triton's TYPE_* names)"
    if value is None or value == "":
        raise SignatureError(f"datatype is missing: {allowed}")
    if not isinstance(value, str):
        raise SignatureError(f"datatype must be a string such as 'FP32', got {value!r}: {allowed}")
    upper = value.strip().upper()
    if upper in KSERVE_TO_TRITON:
        return upper
    if upper in TRITON_TO_KSERVE:
        return TRITON_TO_KSERVE[upper]
    raise SignatureError(f"unknown datatype {value!r}: {allowed}")


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str  # KServe v2 name
    dims: tuple[int, ...]
    optional: bool = False  # an input a request may leave out (Triton's `optional: true`)

    @property
    def triton_type(self) -> str:
        return KSERVE_TO_TRITON[self.datatype]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "datatype": self.datatype, "dims": list(self.dims)}
        if self.optional:
            data["optional"] = True
        return data


@dataclass(frozen=True)
class Signature:
    inputs: tuple[Tensor, ...] = field(default_factory=tuple)
    outputs: tuple[Tensor, ...] = field(default_factory=tuple)

    @property
    def has_batch_dim(self) -> bool:
        tensors = self.inputs + self.outputs
        return bool(tensors) and all(len(t.dims) >= 1 and t.dims[0] == -1 for t in tensors)

    def to_json(self) -> dict[str, Any]:
        return {"inputs": [t.to_json() for t in self.inputs], "outputs": [t.to_json() for t in self.outputs]}

    @property
    def is_empty(self) -> bool:
        return not self.inputs and not self.outputs

    @property
    def optional_inputs(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs if t.optional)


def dims_compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether two shapes can describe the same tensor: the same rank, and each dimension equal or dynamic (-1) on
    either side. Used where a declared signature meets the artifact's and where pipeline steps are chained."""
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


TENSOR_KEYS = ("name", "datatype", "dims")
OPTIONAL_KEY = "optional"  # inputs only
# Older spellings still read (deprecated in the API's schema): "data_type" for datatype, "shape" for dims, one
# spelling of each.
TENSOR_ALIASES = ("data_type", "shape")


def _parse_tensor(raw: object, where: str, *, is_input: bool = False) -> Tensor:
    if not isinstance(raw, dict):
        raise SignatureError(f"{where} must be an object with name, datatype and dims")
    # A misspelt key ("dimz") is refused rather than ignored, as every field of an API body is.
    known = (*TENSOR_KEYS, *TENSOR_ALIASES, *((OPTIONAL_KEY,) if is_input else ()))
    unknown = sorted(str(key) for key in raw if key not in known)
    if unknown:
        has = ", ".join(TENSOR_KEYS) + (" and, for an input, optional" if is_input else "")
        if OPTIONAL_KEY in unknown:
            raise SignatureError(f"{where}: only an input can be optional (a model always gives its outputs): "
                                 "leave 'optional' out")
        raise SignatureError(f"{where} has unknown keys {unknown[:5]}: a tensor has {has}")
    optional = raw.get(OPTIONAL_KEY, False)
    if not isinstance(optional, bool):
        raise SignatureError(f"{where}.optional must be true or false, got {str(optional)[:40]!r}")
    for key, alias in zip(TENSOR_KEYS[1:], TENSOR_ALIASES, strict=True):
        if key in raw and alias in raw:
            raise SignatureError(f"{where} gives both {key!r} and {alias!r}: give {key!r} alone")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SignatureError(f"{where}.name must be a non-empty string")
    if not name.isprintable():
        # Tensor names go into Triton's configuration and its log, which a pool shares between teams, as
        # onnx_inspect's check of the names inside a model says.
        raise SignatureError(f"{where}.name {name[:100]!r} holds a character that is not printable (a NUL, a "
                             "newline, a tab, an escape, a line separator): use printable characters")
    try:
        datatype = normalize_datatype(raw.get("datatype", raw.get("data_type")))
    except SignatureError as exc:
        raise SignatureError(f"{where} ({name}): {exc}") from None
    dims = raw.get("dims", raw.get("shape"))
    if dims is None:
        # Never taken as [-1]: a guessed shape would be served and fail at the first request.
        raise SignatureError(f"{where} ({name}): dims are missing: give the full shape, -1 for a dynamic dimension, "
                             "e.g. [-1, 3, 224, 224]")
    if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise SignatureError(f"{where} ({name}): dims must be a list of integers, -1 for a dynamic dimension")
    if any(d == 0 or d < -1 for d in dims):
        raise SignatureError(f"{where} ({name}): dims must be positive integers or -1, got {dims}")
    return Tensor(name=name, datatype=datatype, dims=tuple(dims), optional=optional)


def parse_signature(raw: object) -> Signature:
    """Parse a signature given as JSON text or as a decoded object {"inputs": [...], "outputs": [...]}."""
    if isinstance(raw, (str, bytes)):
        try:
            raw = json_input.loads(raw)
        except json_input.TooDeep as exc:
            raise SignatureError(f"signature: {exc}") from None
        except ValueError as exc:
            raise SignatureError(f"signature is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise SignatureError('signature must be a JSON object: {"inputs": [...], "outputs": [...]}')
    unknown = set(raw) - {"inputs", "outputs"}
    if unknown:
        raise SignatureError(f"signature has unknown keys {sorted(unknown)}: only 'inputs' and 'outputs' are allowed")
    inputs = raw.get("inputs")
    outputs = raw.get("outputs")
    if not isinstance(inputs, list) or not inputs:
        raise SignatureError("signature.inputs must be a non-empty list")
    if not isinstance(outputs, list) or not outputs:
        raise SignatureError("signature.outputs must be a non-empty list")
    parsed_in = tuple(_parse_tensor(t, f"signature.inputs[{i}]", is_input=True) for i, t in enumerate(inputs))
    parsed_out = tuple(_parse_tensor(t, f"signature.outputs[{i}]") for i, t in enumerate(outputs))
    names = [t.name for t in parsed_in + parsed_out]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SignatureError(f"tensor names must be unique across inputs and outputs: {duplicates} repeated")
    if parsed_in and all(t.optional for t in parsed_in):
        raise SignatureError("every input is optional: a request must send at least one, so declare one of them "
                             "required (leave its 'optional' out)")
    return Signature(inputs=parsed_in, outputs=parsed_out)


def signature_from_json(data: dict[str, Any] | None) -> Signature:
    """Rebuild a stored (already validated) signature."""
    if not data:
        return Signature()
    return parse_signature(data)
