"""A version's example request: a KServe v2 JSON inference request body the uploader sends with the model, checked
against the version's signature, and used for the trial call at inspection in place of zeros (a model that decodes
images cannot be judged on empty bytes), and as a default request where the portal needs one.

It is untrusted input like any body (docs/security.md, "The example request"): bounded in size before anything
reads it, every input named, typed and shaped as the signature declares, every element of the declared kind. The
elements of a BYTES input are JSON strings (their UTF-8 bytes) or {"b64": "..."} (any bytes, a PNG say: JSON
strings cannot carry them, and PostgreSQL stores no NUL in JSON). Plain functions, no Django.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

from modelport.core import datatypes
from modelport.core.json_input import TooDeep, check_depth, loads
from modelport.core.signature import Signature, Tensor

_TOP_LEVEL = {"id", "parameters", "inputs", "outputs"}
_INPUT_KEYS = {"name", "datatype", "shape", "data", "parameters"}
_INT_RANGES = {
    "INT8": (-(2**7), 2**7 - 1), "INT16": (-(2**15), 2**15 - 1), "INT32": (-(2**31), 2**31 - 1),
    "INT64": (-(2**63), 2**63 - 1), "UINT8": (0, 2**8 - 1), "UINT16": (0, 2**16 - 1), "UINT32": (0, 2**32 - 1),
    "UINT64": (0, 2**64 - 1),
}


class ExampleRequestError(ValueError):
    """The example request does not fit the signature; the message names the part and says what to fix."""


@dataclass(frozen=True)
class ExampleInput:
    tensor: Tensor
    shape: list[int]
    data: list[Any]  # flat, row-major; bytes for BYTES


@dataclass(frozen=True)
class ExampleRequest:
    inputs: tuple[ExampleInput, ...]
    batch: int | None  # the first dimension of every input, None when the signature has no batch dimension

    def to_json(self) -> dict[str, Any]:
        """The request as stored with the version: data flat, BYTES elements as {"b64": ...}."""
        return {"inputs": [
            {"name": i.tensor.name, "datatype": i.tensor.datatype, "shape": i.shape,
             "data": [{"b64": base64.b64encode(b).decode()} for b in i.data] if i.tensor.datatype == "BYTES"
             else i.data}
            for i in self.inputs]}

    def triton_body(self) -> tuple[bytes, int | None]:
        """The request as Triton's HTTP endpoint takes it, and the length of its JSON header when BYTES inputs
        follow it as binary data (Triton's binary tensor extension; None: all JSON)."""
        header: list[dict[str, Any]] = []
        blobs: list[bytes] = []
        for item in self.inputs:
            entry: dict[str, Any] = {"name": item.tensor.name, "datatype": item.tensor.datatype, "shape": item.shape}
            if item.tensor.datatype == "BYTES":
                # Triton's serialized BYTES: each element as a 4-byte little-endian length and its bytes.
                blob = b"".join(struct.pack("<I", len(b)) + b for b in item.data)
                entry["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                entry["data"] = item.data
            header.append(entry)
        head = json.dumps({"inputs": header}).encode()
        return (head + b"".join(blobs), len(head)) if blobs else (head, None)


def parse_example_request(value: Any, signature: Signature, max_bytes: int) -> ExampleRequest:
    """The example request `value` (a JSON value, or JSON text) checked against `signature`; ExampleRequestError
    naming what is wrong. `max_bytes` bounds its JSON text."""
    if isinstance(value, str | bytes):
        if len(value) > max_bytes:
            raise ExampleRequestError(f"The example request is {len(value):,} bytes; at most {max_bytes:,}.")
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise ExampleRequestError("The example request is not JSON.") from None
    try:
        check_depth(value)
    except TooDeep as exc:
        raise ExampleRequestError(f"The example request: {exc}.") from None
    size = len(json.dumps(value))
    if size > max_bytes:
        raise ExampleRequestError(f"The example request is {size:,} bytes as JSON; at most {max_bytes:,}.")
    if not isinstance(value, dict):
        raise ExampleRequestError('The example request must be a KServe v2 inference request: {"inputs": [...]}.')
    extra = sorted(set(value) - _TOP_LEVEL)
    if extra:
        raise ExampleRequestError(f"The example request has unknown fields {extra}: a KServe v2 inference request "
                                  f"has {sorted(_TOP_LEVEL)}.")
    raw_inputs = value.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise ExampleRequestError('The example request needs "inputs": a list of {"name", "datatype", "shape", '
                                  '"data"}.')
    declared = {t.name: t for t in signature.inputs}
    inputs: list[ExampleInput] = []
    for index, raw in enumerate(raw_inputs):
        inputs.append(_input(raw, f"inputs[{index}]", declared, {i.tensor.name for i in inputs}))
    # An optional input may be left out, as a request may leave it out (Triton's `optional: true`).
    missing = [name for name, tensor in declared.items()
               if not tensor.optional and name not in {i.tensor.name for i in inputs}]
    if missing:
        raise ExampleRequestError(f"The example request lacks input(s) {', '.join(repr(n) for n in missing)} of the "
                                  "signature: give every input that is not optional.")
    batch = None
    if signature.has_batch_dim:
        batches = {i.tensor.name: i.shape[0] for i in inputs}
        if len(set(batches.values())) > 1:
            raise ExampleRequestError(f"The example request's inputs have different batch sizes {batches}: the first "
                                      "dimension is the batch, the same on every input.")
        batch = next(iter(batches.values()))
    order = {t.name: n for n, t in enumerate(signature.inputs)}
    return ExampleRequest(inputs=tuple(sorted(inputs, key=lambda i: order[i.tensor.name])), batch=batch)


def example_to_store(value: Any, signature: Signature | None, max_bytes: int) -> dict[str, Any] | None:
    """The example request of an upload as the version stores it, None when there is none; `value` a JSON value or
    JSON text (a form field). Checked against the declared `signature`; without one (a format that carries its
    own) only bounded and shaped here, and checked at inspection against the signature read from the file. The
    API and the upload page both take it through here, so that both say the same of the same request."""
    if value in (None, "", {}):
        return None
    if isinstance(value, str):
        if len(value) > max_bytes:
            raise ExampleRequestError(f"The example request is {len(value):,} bytes; at most {max_bytes:,}.")
        try:
            value = loads(value)
        except ValueError as exc:
            raise ExampleRequestError(f"The example request is not JSON ({exc}).") from None
    if signature is not None:
        return parse_example_request(value, signature, max_bytes).to_json()
    size = len(json.dumps(value))
    if _holds_nul(value):
        # Stored as sent until inspection checks it: PostgreSQL stores no NUL in JSON (a 500, not a 400).
        raise ExampleRequestError('Null characters are not allowed: send such BYTES as {"b64": "<base64>"}.')
    if size > max_bytes:
        raise ExampleRequestError(f"The example request is {size:,} bytes as JSON; at most {max_bytes:,}.")
    if not isinstance(value, dict) or not isinstance(value.get("inputs"), list):
        raise ExampleRequestError('The example request must be a KServe v2 inference request: {"inputs": [...]}.')
    return value


def _holds_nul(value: Any) -> bool:
    # Iterative: the depth is bounded already, but a wide request must not recurse either.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str) and "\x00" in item:
            return True
        if isinstance(item, dict):
            stack.extend([*item.keys(), *item.values()])
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _input(raw: Any, where: str, declared: dict[str, Tensor], seen: set[str]) -> ExampleInput:
    if not isinstance(raw, dict):
        raise ExampleRequestError(f"{where} must be an object with name, datatype, shape, data.")
    extra = sorted(set(raw) - _INPUT_KEYS)
    if extra:
        raise ExampleRequestError(f"{where} has unknown fields {extra}.")
    name = raw.get("name")
    tensor = declared.get(name) if isinstance(name, str) else None
    if tensor is None:
        names = ", ".join(repr(n) for n in declared)
        raise ExampleRequestError(f"{where}.name: {str(name)[:64]!r} is not an input of the "
                                  f"signature (its inputs: {names}).")
    if name in seen:
        raise ExampleRequestError(f"{where}.name: input {name!r} is given twice.")
    where = f"{where} ({name!r})"
    datatype = raw.get("datatype")
    if datatype != tensor.datatype:
        raise ExampleRequestError(f"{where}.datatype is {str(datatype)[:20]!r}; the signature "
                                  f"declares {tensor.datatype}.")
    shape = raw.get("shape")
    if (not isinstance(shape, list) or len(shape) != len(tensor.dims)
            or not all(type(n) is int and n >= 1 for n in shape)
            or any(d != -1 and n != d for n, d in zip(shape, tensor.dims, strict=True))):
        raise ExampleRequestError(f"{where}.shape {str(shape)[:80]} does not fit the declared dims "
                                  f"{list(tensor.dims)} (positive sizes; -1 is any size).")
    data = _flat(raw.get("data"), f"{where}.data")
    if len(data) != math.prod(shape):
        raise ExampleRequestError(f"{where}.data has {len(data):,} elements; shape {shape} holds "
                                  f"{math.prod(shape):,}.")
    return ExampleInput(tensor=tensor, shape=shape, data=[_element(v, tensor.datatype, f"{where}.data[{n}]")
                                                          for n, v in enumerate(data)])


def _flat(data: Any, where: str) -> list[Any]:
    # KServe v2 takes the data flat or nested row-major; the depth is bounded already.
    if not isinstance(data, list):
        raise ExampleRequestError(f"{where} must be a list of the tensor's elements (row-major).")
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, list):
            stack.append(iter(item))
        else:
            flat.append(item)
    return flat


_END = object()


def _element(value: Any, datatype: str, where: str) -> Any:
    if datatype == "BYTES":
        if isinstance(value, str):
            return value.encode()
        if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
            try:
                return base64.b64decode(value["b64"], validate=True)
            except (binascii.Error, ValueError):
                raise ExampleRequestError(f"{where}.b64 is not base64.") from None
        raise ExampleRequestError(f'{where} must be a string or {{"b64": "..."}} (BYTES).')
    if datatype == "BOOL":
        if type(value) is not bool:
            raise ExampleRequestError(f"{where} must be true or false (BOOL).")
        return value
    if datatype in datatypes.FLOAT_TYPES:
        if type(value) not in (int, float) or not math.isfinite(value):
            raise ExampleRequestError(f"{where} must be a finite number ({datatype}).")
        return value
    low, high = _INT_RANGES.get(datatype, (-(2**63), 2**64 - 1))
    if type(value) is not int or not low <= value <= high:
        raise ExampleRequestError(f"{where} must be an integer from {low} to {high} ({datatype}).")
    return value
