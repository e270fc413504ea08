"""What the deployment page offers for calling a model: an example KServe v2 request built from the signature, and
copy-paste snippets (curl, tritonclient, the modelport CLI), all with the shapes Triton serves. Plain functions,
no Django."""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import urlsplit

from deployments.render import served_dims
from deployments.revision_spec import ModelEntry
from models_registry import datatypes

_FLOAT_TYPES = datatypes.FLOAT_TYPES


def _numpy_attribute(datatype: str) -> str:
    """The numpy attribute a snippet's np.zeros(dtype=np.<it>) names: float32 stands in for bfloat16, which numpy
    lacks (the client converts), and bool/object are spelt as numpy's scalar types."""
    name = datatypes.KSERVE_TO_NUMPY.get(datatype, "float32")
    return {"bool": "bool_", "object": "object_"}.get(name, name)


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


def example_request_json(signature: dict[str, Any]) -> str:
    """The example as text to edit: one line per input, so that even an image's zeros stay out of the way."""
    return request_json(example_request(signature))


def request_json(request: dict[str, Any]) -> str:
    inputs = [json.dumps(tensor) for tensor in request["inputs"]]
    return '{"inputs": [\n' + ",\n".join(f"  {line}" for line in inputs) + "\n]}"


def with_data(request: dict[str, Any], data: dict[str, list[Any]]) -> dict[str, Any]:
    """The request with the given inputs' data in place of the zeros (a sample image for the sample models)."""
    inputs = []
    for tensor in request["inputs"]:
        values = data.get(tensor["name"])
        inputs.append({**tensor, "data": list(values)} if values is not None and len(values) == math.prod(tensor["shape"])
                      else tensor)
    return {**request, "inputs": inputs}


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


# A request body this short goes inline into the curl snippet, so that it runs as copied; a longer one (an image's
# zeros) would bury the command, and goes to req.json (the page's "Download req.json" button) instead.
INLINE_BODY_LIMIT = 2048


def infer_url(base_url: str, deployment: str, model: str) -> str:
    return f"{base_url.rstrip('/')}/serve/{deployment}/v2/models/{model}/infer"


def curl_snippet(base_url: str, deployment: str, model: str, body: dict[str, Any] | None = None) -> str:
    """Runs as copied after `export MODELPORT_TOKEN=...`: the example body inline when it is short, else req.json."""
    inline = json.dumps(body, separators=(",", ":")) if body is not None else ""
    if inline and len(inline) <= INLINE_BODY_LIMIT:
        data, note = "-d '" + inline.replace("'", "'\\''") + "'", "the request body is inline"
    else:
        data, note = "-d @req.json", "req.json: the request body (Download req.json)"
    binary = [t["name"] for t in (body or {}).get("inputs", []) if t.get("datatype") == "BYTES"]
    if binary:
        # A file's raw bytes cannot travel in JSON: Try it, or the Python snippet, sends them.
        note += (f"; {', '.join(binary)} is BYTES: this JSON sends text, and a file (an image) goes with Try it "
                 "or the Python snippet")
    return (
        f"# export MODELPORT_TOKEN=<an API token> first; {note}\n"
        f"curl -sS -X POST {infer_url(base_url, deployment, model)} \\\n"
        '  -H "Authorization: Bearer $MODELPORT_TOKEN" \\\n'
        '  -H "Content-Type: application/json" \\\n'
        f"  {data}"
    )


def python_snippet(base_url: str, deployment: str, model: str, signature: dict[str, Any]) -> str:
    parts = urlsplit(base_url)
    url = f"{parts.netloc}{parts.path.rstrip('/')}/serve/{deployment}"
    ssl = ", ssl=True" if parts.scheme == "https" else ""
    lines = [
        "import os",
        "",
        "import numpy as np",
        "import tritonclient.http as httpclient",
        "",
        f'client = httpclient.InferenceServerClient(url="{url}"{ssl})',
        'headers = {"Authorization": "Bearer " + os.environ["MODELPORT_TOKEN"]}',
        "inputs = []",
    ]
    for tensor in signature.get("inputs", []):
        shape = example_shape(list(tensor.get("dims", [])))
        datatype = tensor.get("datatype", "FP32")
        lines.append(f'tensor = httpclient.InferInput("{tensor["name"]}", {shape}, "{datatype}")')
        if datatype == "BYTES":
            lines.append(f'# {tensor["name"]}: bytes per element, e.g. a file\'s: open("digit.png", "rb").read()')
            lines.append(f'tensor.set_data_from_numpy(np.array([b""] * {math.prod(shape)}, dtype=np.object_).reshape({shape}))')
        else:
            lines.append(f"tensor.set_data_from_numpy(np.zeros({shape}, dtype=np.{_numpy_attribute(datatype)}))")
        lines.append("inputs.append(tensor)")
    lines.append(f'result = client.infer("{model}", inputs, headers=headers)')
    for tensor in signature.get("outputs", []):
        lines.append(f'print(result.as_numpy("{tensor["name"]}"))')
    return "\n".join(lines)


def cli_snippet(deployment: str, model: str, base_url: str = "") -> str:
    lines = ["# modelport reads MODELPORT_URL and MODELPORT_TOKEN; req.json: the request body (Download req.json)"]
    if base_url:
        lines.append(f"export MODELPORT_URL={base_url}")
    lines.append(f"modelport infer {deployment} {model} --input req.json")
    return "\n".join(lines)
