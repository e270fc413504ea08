"""An example KServe v2 request for a served model: zeros of the right datatype and shape, from the signature as
Triton serves it. The deployment page shows it (web/inference.py) and a tune measures with it (tuning/api.py). Plain
functions, no Django."""

from __future__ import annotations

import math
from typing import Any

from deployments.render import served_dims
from deployments.revision_spec import ModelEntry
from modelport.core import datatypes

_FLOAT_TYPES = datatypes.FLOAT_TYPES


def example_shape(dims: list[int]) -> list[int]:
    """A concrete shape for a signature's dims: batch 1, and 1 for any other dynamic dimension."""
    return [1 if d == -1 else d for d in dims]


def _zero(datatype: str) -> Any:
    if datatype == "BOOL":
        return False
    if datatype == "BYTES":
        return ""
    return 0.0 if datatype in _FLOAT_TYPES else 0


# Zeros prefilled in one example request, all inputs together: 1 MiB of FP32 (a 512 × 512 image, three 224 × 224
# ones). The page carries the example twice as JSON text; a signature's dims are the uploader's to choose, and
# [-1, 100000, 100000] must not build a list of ten billion zeros in the web process.
EXAMPLE_MAX_ELEMENTS = 262_144


def _example(signature: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    inputs = []
    left_empty = []
    budget = EXAMPLE_MAX_ELEMENTS
    for tensor in signature.get("inputs", []):
        shape = example_shape(list(tensor.get("dims", [])))
        datatype = tensor.get("datatype", "FP32")
        count = max(math.prod(shape), 0)
        if count > budget:
            data: list[Any] = []
            left_empty.append(f"{tensor['name']} ({' × '.join(str(d) for d in shape)} = {count:,} elements)")
        else:
            data = [_zero(datatype)] * count
            budget -= count
        inputs.append({"name": tensor["name"], "shape": shape, "datatype": datatype, "data": data})
    return {"inputs": inputs}, left_empty


def example_request(signature: dict[str, Any]) -> dict[str, Any]:
    """A KServe v2 JSON request for the signature: zeros of the right datatype and shape, batch 1. Inputs past
    EXAMPLE_MAX_ELEMENTS keep their shape with empty data (see example_note)."""
    return _example(signature)[0]


def example_note(signature: dict[str, Any]) -> str:
    """What the example leaves for the user to fill in, or ""."""
    left_empty = _example(signature)[1]
    if not left_empty:
        return ""
    return (f"Too large to prefill here: {', '.join(left_empty)}. Fill in its data, or send it with the CLI or "
            "tritonclient (the snippets above).")


def served_signature(entry: ModelEntry) -> dict[str, Any]:
    """The signature as Triton serves it (deployments.render.served_dims): what its metadata says and what it
    answers. A tensor whose shape differs from the model's own declaration keeps that as `declared`."""
    batched = entry.max_batch_size > 0
    signature = entry.signature.to_json()
    served: dict[str, Any] = {}
    for kind in ("inputs", "outputs"):
        tensors = []
        for tensor in signature.get(kind, []):
            dims = list(tensor.get("dims", []))
            shown = served_dims(dims, batched)
            tensors.append({**tensor, "dims": shown, **({"declared": dims} if shown != dims else {})})
        served[kind] = tensors
    return served


def with_data(request: dict[str, Any], data: dict[str, list[Any]]) -> dict[str, Any]:
    """The request with the given inputs' data in place of the zeros (a sample image for the sample models)."""
    inputs = []
    for tensor in request["inputs"]:
        values = data.get(tensor["name"])
        inputs.append({**tensor, "data": list(values)}
                      if values is not None and len(values) == math.prod(tensor["shape"])
                      else tensor)
    return {**request, "inputs": inputs}
