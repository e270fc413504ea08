"""What the deployment page offers for calling a model: an example KServe v2 request built from the signature, and
copy-paste snippets (curl, tritonclient, the modelport CLI), all with the shapes Triton serves. Plain functions,
no Django."""

from __future__ import annotations

import base64
import json
import math
from typing import Any
from urllib.parse import urlsplit

# The example request itself is the deployments app's (tuning measures with it too); re-exported for the pages.
from deployments.examples import EXAMPLE_MAX_ELEMENTS as EXAMPLE_MAX_ELEMENTS
from deployments.examples import example_note as example_note
from deployments.examples import example_request as example_request
from deployments.examples import example_shape as example_shape
from deployments.examples import served_signature as served_signature
from deployments.examples import with_data as with_data
from modelport.core import datatypes


def _numpy_attribute(datatype: str) -> str:
    """The numpy attribute a snippet's np.zeros(dtype=np.<it>) names: float32 stands in for bfloat16, which numpy
    lacks (the client converts), and bool/object are spelt as numpy's scalar types."""
    name = datatypes.KSERVE_TO_NUMPY.get(datatype, "float32")
    return {"bool": "bool_", "object": "object_"}.get(name, name)


def example_request_json(signature: dict[str, Any]) -> str:
    """The example as text to edit: one line per input, so that even an image's zeros stay out of the way."""
    return request_json(example_request(signature))


def request_json(request: dict[str, Any]) -> str:
    inputs = [json.dumps(tensor) for tensor in request["inputs"]]
    return '{"inputs": [\n' + ",\n".join(f"  {line}" for line in inputs) + "\n]}"


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


def curl_image_snippet(base_url: str, deployment: str, model: str, input_name: str, png: bytes) -> str:
    """For a model that takes encoded images (BYTES [-1, 1]): posts `png` itself, so that it runs as copied and
    answers as Try it does. JSON cannot carry a file's raw bytes (Triton reads a JSON string's UTF-8 as the
    element), so the body is Triton's binary tensor extension, as Try it sends a file: the JSON header, then the
    element as a 4-byte little-endian length and the bytes. The image travels in the snippet as base64; POSIX
    printf (octal escapes) and `base64 -d` rebuild it."""
    size = len(png) + 4
    header = json.dumps({"inputs": [{"name": input_name, "shape": [1, 1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": size}}]}, separators=(",", ":"))
    length = "".join(f"\\{b:03o}" for b in len(png).to_bytes(4, "little"))
    encoded = base64.b64encode(png).decode("ascii")
    return (
        f"# export MODELPORT_TOKEN=<an API token> first; {input_name}: the PNG below (a handwritten 7, base64), "
        "sent as its raw bytes after the JSON header (Triton's binary tensor extension, as Try it sends a file)\n"
        f"png='{encoded}'\n"
        f"header='{header}'\n"
        f"{{ printf '%s' \"$header\"; printf '{length}'; printf '%s' \"$png\" | base64 -d; }} |\n"
        f"curl -sS -X POST {infer_url(base_url, deployment, model)} \\\n"
        '  -H "Authorization: Bearer $MODELPORT_TOKEN" \\\n'
        '  -H "Content-Type: application/octet-stream" \\\n'
        '  -H "Inference-Header-Content-Length: ${#header}" \\\n'
        "  --data-binary @-"
    )


def python_snippet(base_url: str, deployment: str, model: str, signature: dict[str, Any],
                   data: dict[str, list[Any]] | None = None, files: dict[str, bytes] | None = None) -> str:
    """`data`: values for some inputs (the held-out example of a sample model, as Try it and curl send it), so
    that every snippet of the page sends the same request and prints the same answer; other inputs send zeros.
    `files`: a file's bytes for some BYTES inputs (the sample PNG of a model that takes images), as base64."""
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
        if datatype == "BYTES" and (file := (files or {}).get(tensor["name"])) is not None:
            if "import base64" not in lines:
                lines.insert(0, "import base64")
            lines.append(f'# {tensor["name"]}: a file\'s bytes per element, here a PNG of a handwritten 7 (yours: '
                         'open("digit.png", "rb").read())')
            lines.append(f'image = base64.b64decode("{base64.b64encode(file).decode("ascii")}")')
            lines.append(f'tensor.set_data_from_numpy(np.array([image] * {math.prod(shape)}, dtype=np.object_)'
                         f'.reshape({shape}))')
        elif (datatype == "BYTES" and (texts := (data or {}).get(tensor["name"])) is not None
              and len(texts) == math.prod(shape) and all(isinstance(v, str) for v in texts)):
            # The version's example request (text per element), as Try it and curl send it: an empty element can
            # be what the model refuses.
            lines.append(f'# {tensor["name"]}: bytes per element, here the example request\'s text (a file\'s: '
                         'open("digit.png", "rb").read())')
            lines.append(f"tensor.set_data_from_numpy(np.array({[v.encode() for v in texts]!r}, dtype=np.object_)"
                         f".reshape({shape}))")
        elif datatype == "BYTES":
            lines.append(f'# {tensor["name"]}: bytes per element, e.g. a file\'s: open("digit.png", "rb").read()')
            lines.append(f'tensor.set_data_from_numpy(np.array([b""] * {math.prod(shape)}, dtype=np.object_)'
                         f'.reshape({shape}))')
        elif (values := (data or {}).get(tensor["name"])) is not None and len(values) == math.prod(shape):
            lines.append(f"tensor.set_data_from_numpy(np.array({_literal(values)},")
            indent = " " * len("tensor.set_data_from_numpy(np.array(")
            lines.append(f"{indent}dtype=np.{_numpy_attribute(datatype)}).reshape({shape}))")
        else:
            lines.append(f"tensor.set_data_from_numpy(np.zeros({shape}, dtype=np.{_numpy_attribute(datatype)}))")
        lines.append("inputs.append(tensor)")
    lines.append(f'result = client.infer("{model}", inputs, headers=headers)')
    for tensor in signature.get("outputs", []):
        lines.append(f'print(result.as_numpy("{tensor["name"]}"))')
    return "\n".join(lines)


def _literal(values: list[Any]) -> str:
    """A list as Python source, whole numbers without their ".0" (the sample's pixels read as pixels)."""
    return "[" + ", ".join(repr(int(v)) if isinstance(v, float) and v.is_integer() else repr(v) for v in values) + "]"


# The name Try it's "download it" link gives the sample PNG (web/views.py sample_digit): the same file either way.
SAMPLE_IMAGE_FILE = "digit-7.png"


def cli_snippet(deployment: str, model: str, base_url: str = "", files: dict[str, bytes] | None = None) -> str:
    """`files`: a file's bytes for a BYTES input (the sample PNG of a model that takes images): the snippet writes
    it to a file from base64, as the curl snippet carries it, and sends it with --file, so that it runs as copied;
    else the request is req.json (Download req.json), in which an image could only be empty or text."""
    if files:
        name, data = next(iter(files.items()))
        lines = [f"# modelport reads MODELPORT_URL and MODELPORT_TOKEN; {name}: a PNG file, here {SAMPLE_IMAGE_FILE} "
                 "(a handwritten 7, the one Try it offers: the echo below writes it), or yours"]
    else:
        lines = ["# modelport reads MODELPORT_URL and MODELPORT_TOKEN; req.json: the request body (Download req.json)"]
    # `make run` installs the command in the checkout's venv (the Makefile's venv target), not on the PATH: the
    # snippet says where it is, and how to get it elsewhere (README, "Use the CLI").
    lines.append("# the modelport command: `make run` (or `make venv`) installs it in Modelport's checkout as "
                 "`.venv/bin/modelport`; `source .venv/bin/activate` there puts it on the PATH (elsewhere: "
                 "`pip install <checkout>`)")
    if base_url:
        lines.append(f"export MODELPORT_URL={base_url}")
    if files:
        lines.append(f"echo '{base64.b64encode(data).decode('ascii')}' | base64 -d > {SAMPLE_IMAGE_FILE}")
        lines.append(f"modelport infer {deployment} {model} --file {name}={SAMPLE_IMAGE_FILE}")
    else:
        lines.append(f"modelport infer {deployment} {model} --input req.json")
    return "\n".join(lines)
