"""What the gateway lets through to Triton, checked before a byte is forwarded: the request target, the KServe v2
endpoints a team's program needs, and the parts of an inference request that Triton mishandles.

Plain functions over bytes and parsed JSON, no Django: the gateway's front door for untrusted paths and bodies.
Every refusal is a `Refusal` with the status and a message that says what to fix.

What Triton 2.51 does with bad input, measured against the real server (tests/test_gateway_e2e.py keeps it true):
- it answers many client mistakes with 500 ("Unable to parse 'shape': ...", "failed to parse the request JSON
  buffer", null or array bodies, wrong JSON types): `client_error()` turns those into 400, keeping its message;
- a declared shape such as [2**40, 64] makes it allocate the tensor before looking at the data, and the server
  aborts on std::bad_alloc; a body of 300,000 '[' overflows its parser's stack: both kill the deployment for
  everyone, so `check_infer_request()` refuses them first;
- an empty body or `Inference-Header-Content-Length: 0` is a "raw binary" request whose only input Triton calls
  `raw_input`, a name the user never chose: messages naming it are reworded.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.fastpath.depth import json_too_deep
from modelport.core import datatypes

# Bytes per element; BYTES elements are variable (each one a 4-byte length and its bytes in binary form).
DATATYPE_SIZES: dict[str, int] = datatypes.SIZES
ALLOWED_SURFACE = ("GET /v2, /v2/health/live, /v2/health/ready, /v2/models/stats and /v2/models/{model}"
                   "[/versions/{n}][/ready|/config|/stats]; POST /v2/models/{model}[/versions/{n}]/infer, "
                   "/generate and /generate_stream")
# Triton's generate extension: a JSON object of input names to values, answered with one JSON object (`generate`) or
# as Server-Sent Events, one per response a decoupled model sends (`generate_stream`; issue 33).
GENERATE_KINDS = frozenset({"generate", "generate_stream"})
MAX_SHAPE_RANK = 64


class Refusal(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in a parser process (gateway/bodies.py) and pickled back: by its fields, not by Exception's args.
        return type(self), (self.status, self.message, self.headers)


# --- The request target ------------------------------------------------------------------------------------------


# Spaces, control characters, DEL and non-ASCII bytes never belong in a request target: percent-encoded they are
# passed on as they are, raw they could end the request line and start another one.
UNSAFE_TARGET_BYTE = re.compile(rb"[\x00-\x20\x7f-\xff]")
_UNSAFE_DECODED = re.compile(r"[\x00-\x20\x7f]")
# Triton 2.51's HTTP server drops the connection, answering nothing, when a request target reaches 8,190 bytes
# (measured): longer ones are refused here, with room to spare, rather than answered 502.
MAX_TARGET_BYTES = 8000


def check_target(raw_path: bytes, decoded_path: str, query_string: bytes) -> None:
    """400 unless the raw path and query are plain, and the decoded path holds no space or control character
    either (no deployment, model or version name does; `%0D%0A` in a path is an attack, not a name)."""
    if (UNSAFE_TARGET_BYTE.search(raw_path) or UNSAFE_TARGET_BYTE.search(query_string)
            or _UNSAFE_DECODED.search(decoded_path)):
        raise Refusal(400, "The request path or query contains a space or a control character; "
                           "percent-encode it, or fix the model name.")
    size = len(raw_path) + len(query_string)
    if size > MAX_TARGET_BYTES:
        raise Refusal(414, f"The request path and query are {size} bytes; at most {MAX_TARGET_BYTES} are passed on.")


@dataclass(frozen=True)
class Endpoint:
    kind: str  # "server", "health", "model", "ready", "config", "stats", "infer", "generate", "generate_stream"
    model: str  # the model named in the path, "" for server-wide endpoints
    method: str  # the one method it takes (HEAD is served as GET)


_NAME = re.compile(r"[^/]+")


def classify(method: str, rest: str) -> Endpoint:
    """The KServe v2 endpoint `rest` (the raw path after /serve/NAME, e.g. "/v2/models/m/infer") names, or a 403
    for anything else under /v2 (Triton's repository, logging, trace and shared-memory APIs), a 405 for the wrong
    method. Model names are matched raw, as Triton does (it does not percent-decode them)."""
    parts = rest.split("/")[1:]
    endpoint = _match(parts)
    if endpoint is None:
        raise Refusal(403, f"{rest[:200]} is not available through the gateway, which serves the KServe v2 "
                           f"inference protocol only: {ALLOWED_SURFACE}.")
    if method != endpoint.method and not (method == "HEAD" and endpoint.method == "GET"):
        allow = "GET, HEAD" if endpoint.method == "GET" else endpoint.method
        raise Refusal(405, f"{rest[:200]} takes {allow}, not {method}.", {"Allow": allow})
    return endpoint


def _match(parts: list[str]) -> Endpoint | None:
    if not parts or parts[0] != "v2":
        return None
    n = len(parts)
    if n == 1:
        return Endpoint("server", "", "GET")
    if parts[1] == "health":
        return Endpoint("health", "", "GET") if n == 3 and parts[2] in ("live", "ready") else None
    if parts[1] != "models" or n < 3 or not _is_name(parts[2]):
        return None
    model = parts[2]
    if n == 3:
        return Endpoint("stats", "", "GET") if model == "stats" else Endpoint("model", model, "GET")
    tail = parts[3:]
    if tail[0] == "versions":
        if len(tail) < 2 or not tail[1].isdigit() or not tail[1].isascii() or len(tail[1]) > 18:
            return None
        tail = tail[2:]
    if not tail:
        return Endpoint("model", model, "GET")
    if len(tail) == 1 and tail[0] in ("ready", "config", "stats"):
        return Endpoint(tail[0], model, "GET")
    if len(tail) == 1 and tail[0] in ("infer", "generate", "generate_stream"):
        return Endpoint(tail[0], model, "POST")
    return None


def _is_name(segment: str) -> bool:
    return bool(segment) and segment not in (".", "..") and "\\" not in segment


# --- Inference request bodies -----------------------------------------------------------------------------------

# The depth check (json_too_deep) is the JSON fast path's, in gateway/fastpath/depth.py.


def parse_json_header(data: bytes, max_depth: int) -> Any:
    if json_too_deep(data, max_depth):
        raise Refusal(400, f"The request JSON nests deeper than {max_depth} levels (or its brackets do not match).")
    try:
        # Read as UTF-8 (a byte-order mark allowed), as json.loads reads bytes but without its guess of UTF-16 or
        # UTF-32: the depth check reads bytes as UTF-8 does, and in UTF-16 a character such as U+0122 is the bytes
        # 22 01, a quote to it, so brackets after it looked like a string's and a 500-deep body passed (an
        # attacker's reading of issue 23). Such a body now fails here, on its NUL bytes, as JSON Triton could not read.
        return json.loads(data.decode("utf-8-sig", "surrogatepass"))
    except (ValueError, RecursionError) as exc:
        raise Refusal(400, f"The request body is not valid JSON: {exc}.") from None


def check_generate_request(data: bytes, max_depth: int) -> None:
    """A generate request is a JSON object (input names to values, "parameters"): Triton reads it into its own
    DOM, so its depth is bounded as an inference request's is (its size was bounded as it was read)."""
    if not data:
        raise Refusal(400, "The request body is empty: send a JSON object of the model's input names to their values, "
                           'e.g. {"text_input": "hello"}.')
    if not isinstance(parse_json_header(data, max_depth), dict):
        raise Refusal(400, "A generate request must be a JSON object of the model's input names to their values, "
                           'e.g. {"text_input": "hello"}.')


def check_infer_request(header: Any, binary_length: int | None, max_tensor_bytes: int) -> None:
    """Refuse what would crash Triton or what it would answer with a 500: `header` is the parsed JSON part,
    `binary_length` the length of the binary part that follows it (None: a JSON-only request).

    Each input's element count times its datatype's size must fit `max_tensor_bytes`, and match the data sent:
    the binary_data_size of a binary input, the element count of JSON data; binary sizes add up to the binary
    part. Anything Triton itself reports as a 400 (an unknown input, the wrong datatype for the model, a shape the
    model does not take) is left to it."""
    if not isinstance(header, dict):
        raise Refusal(400, "The request body must be a JSON object with an 'inputs' list "
                           "(a KServe v2 inference request), not " + _json_kind(header) + ".")
    _check_optional(header, "id", str, "a string")
    _check_parameters(header.get("parameters"), "the request")
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise Refusal(400, "'inputs' must be a non-empty list of tensors, each with 'name', 'shape', 'datatype' "
                           "and 'data' (or a binary_data_size parameter).")
    binary_total = 0
    for index, tensor in enumerate(inputs):
        binary_total += _check_input(index, tensor, binary_length is not None, max_tensor_bytes)
    if binary_length is not None and binary_total != binary_length:
        raise Refusal(400, f"The inputs' binary_data_size parameters add up to {binary_total} bytes, but "
                           f"{binary_length} bytes of binary data follow the JSON header.")
    outputs = header.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise Refusal(400, "'outputs' must be a list of objects with a 'name'.")
        for index, tensor in enumerate(outputs):
            if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
                raise Refusal(400, f"outputs[{index}] must be an object with a string 'name'.")
            if "\0" in tensor["name"]:
                raise _nul_in_name("outputs", index, tensor["name"])
            parameters = tensor.get("parameters")
            if parameters is not None:
                label = f"output {tensor['name'][:100]!r}"
                _check_parameters(parameters, label)
                _refuse_shared_memory(parameters, label)


def _check_input(index: int, tensor: Any, binary: bool, max_tensor_bytes: int) -> int:
    """The input's binary byte count (0 for JSON data), after checking it. (Messages are built only on the way
    out: this runs for every input of every request.)"""
    if not isinstance(tensor, dict):
        raise Refusal(400, f"inputs[{index}] must be an object with 'name', 'shape', 'datatype' and 'data'.")
    name = tensor.get("name")
    if not isinstance(name, str):
        raise Refusal(400, f"inputs[{index}] needs a string 'name'.")
    if "\0" in name:
        raise _nul_in_name("inputs", index, name)
    shape = tensor.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_SHAPE_RANK:
        raise _bad_shape(name, shape)
    for dim in shape:
        if type(dim) is not int or dim < 0 or dim >= 2**63:
            raise _bad_shape(name, shape)
    datatype = tensor.get("datatype")
    if datatype not in DATATYPE_SIZES:
        raise Refusal(400, f"The 'datatype' of {_input(name)} must be one of {', '.join(DATATYPE_SIZES)}, "
                           f"got {_excerpt(datatype)}.")
    parameters = tensor.get("parameters")
    if parameters is not None:
        _check_parameters(parameters, _input(name))
        _refuse_shared_memory(parameters, _input(name))
    elements = math.prod(shape)
    need = elements * DATATYPE_SIZES[datatype]
    if need > max_tensor_bytes:
        raise Refusal(413, f"The shape {shape} of {datatype} of {_input(name)} is {need} bytes"
                           f"{' at least' if datatype == 'BYTES' else ''}; the limit is {max_tensor_bytes} bytes.")
    binary_size = parameters.get("binary_data_size") if parameters is not None else None
    has_data = "data" in tensor
    if binary_size is not None:
        if has_data:
            raise Refusal(400, f"{_input(name).capitalize()} has both 'data' and a binary_data_size parameter; "
                               "send one.")
        if type(binary_size) is not int or binary_size < 0:
            raise Refusal(400, f"The binary_data_size of {_input(name)} must be a whole number of bytes >= 0, "
                               f"got {_excerpt(binary_size)}.")
        if not binary:
            raise Refusal(400, f"{_input(name).capitalize()} has a binary_data_size, but the request has no "
                               "Inference-Header-Content-Length header saying where its binary data starts.")
        if datatype == "BYTES":
            if binary_size < need:
                raise Refusal(400, f"The binary_data_size of {_input(name)} is {binary_size} bytes, too small for "
                                   f"{elements} BYTES elements (each takes 4 bytes of length and its bytes).")
        elif binary_size != need:
            raise Refusal(400, f"The binary_data_size of {_input(name)} is {binary_size} bytes, but its shape "
                               f"{shape} of {datatype} takes {need} bytes.")
        return binary_size
    if not has_data:
        raise Refusal(400, f"{_input(name).capitalize()} needs 'data' (or, with binary data, a binary_data_size "
                           "parameter).")
    count = _count_elements(tensor["data"])
    if count is None:
        raise Refusal(400, f"The 'data' of {_input(name)} must be a list (flat, or nested evenly), got "
                           f"{_excerpt(tensor['data'])}.")
    if count != elements:
        raise Refusal(400, f"The 'data' of {_input(name)} has {count} elements, but its shape {shape} needs "
                           f"{elements}.")
    return 0


def _nul_in_name(kind: str, index: int, name: str) -> Refusal:
    # Triton reads a name up to its first NUL: {"name": "x\u0000anything"} would be answered as the tensor "x".
    return Refusal(400, f"The name of {kind}[{index}], {name[:100]!r}, holds a NUL character (\\u0000); tensor "
                        "names cannot: send the name as the model declares it.")


def _input(name: str) -> str:
    return f"input {name[:100]!r}"


def _bad_shape(name: str, shape: Any) -> Refusal:
    return Refusal(400, f"The 'shape' of {_input(name)} must be a list of whole numbers >= 0 (at most "
                        f"{MAX_SHAPE_RANK} of them), got {_excerpt(shape)}.")


@dataclass(frozen=True)
class UnparsedData:
    """An input's 'data' that the JSON parser left on its tape (gateway/fastpath/json_body.py): its leaf count, by
    the rule of _count_elements, and the parser's array."""

    count: int
    array: Any


def _count_elements(data: Any) -> int | None:
    """Leaf count of a list, or of lists of lists all nested alike; None for anything else. Walks the lists,
    never the leaves (a flat list costs one len())."""
    if isinstance(data, UnparsedData):
        return data.count
    if not isinstance(data, list):
        return None
    if not data or not isinstance(data[0], list):
        return len(data)
    total = 0
    for item in data:
        count = _count_elements(item)
        if count is None:
            return None
        total += count
    return total


# The datatypes whose JSON 'data' Triton reads as numbers, and refuses anything else in ("Unable to parse 'data':
# attempt to access JSON non-number as double", naming neither the input nor what it found). BYTES takes strings and
# BOOL booleans: those Triton judges.
NUMBER_DATATYPES = frozenset(DATATYPE_SIZES) - {"BYTES", "BOOL"}
_NUMBERS = (int, float)  # exactly: a bool is an int to isinstance, and no number to Triton


def check_numbers(name: str, datatype: str, data: Any, arrays: tuple[type, ...] = (list,)) -> None:
    """A 400 naming the first leaf of `data` (lists of lists, or the `arrays` types) that is not a JSON number, for
    an input of a NUMBER_DATATYPES datatype. Walks every leaf: callers run it on the error path, where a faster test
    (simdjson's as_buffer) has failed, or on data that Python's json module built already."""
    # Depth first, in order (an iterator per list open), so that the leaf named is the first one in row-major order.
    stack: list[tuple[Any, tuple[int, ...]]] = [(iter(enumerate(data)), ())]
    while stack:
        items, place = stack[-1]
        for index, item in items:
            if type(item) in _NUMBERS:
                continue
            if isinstance(item, arrays):
                nested: Any = item  # a list, or one of the parser's arrays
                stack.append((iter(enumerate(nested)), (*place, index)))
                break
            raise _not_a_number(name, datatype, (*place, index), item)
        else:
            stack.pop()


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def _not_a_number(name: str, datatype: str, place: tuple[int, ...], item: Any) -> Refusal:
    where = "data" + "".join(f"[{i}]" for i in place)
    if isinstance(item, str):
        found = f"the string {_excerpt(item)}"
        if len(item) <= 60 and _JSON_NUMBER.fullmatch(item.strip()):
            found += f" (send {item.strip()} as a number, without quotes)"
    elif item is None or isinstance(item, bool):
        found = json.dumps(item)
    elif isinstance(item, (int, float)):  # a subclass of one (none JSON makes)
        found = repr(item)
    else:
        found = "an object"
    return Refusal(400, f"Input {name[:100]!r} is {datatype}: its 'data' must be JSON numbers, but {where} is "
                        f"{found}.")


def _check_optional(obj: Mapping[str, Any], key: str, kind: type, text: str) -> None:
    if key in obj and not isinstance(obj[key], kind):
        raise Refusal(400, f"'{key}' must be {text}, got {_excerpt(obj[key])}.")


def _check_parameters(parameters: Any, label: str) -> None:
    if parameters is None:
        return
    if not isinstance(parameters, dict):
        raise Refusal(400, f"The 'parameters' of {label} must be an object, got {_excerpt(parameters)}.")
    for key, value in parameters.items():
        if not isinstance(value, (str, bool, int, float)):
            raise Refusal(400, f"Parameter {key[:100]!r} of {label} must be a string, number or boolean, "
                               f"got {_excerpt(value)}.")


def _refuse_shared_memory(parameters: Any, label: str) -> None:
    if isinstance(parameters, dict):
        for key in parameters:
            if key.startswith("shared_memory"):
                raise Refusal(400, f"{label.capitalize()} uses shared memory, which the gateway does not offer: "
                                   "send the data in the request.")


def _json_kind(value: Any) -> str:
    return {type(None): "null", list: "an array", str: "a string", bool: "a boolean"}.get(type(value), "a number")


def _excerpt(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- Triton's answers -------------------------------------------------------------------------------------------

# Triton 2.51's messages for requests it could not parse, which it answers with HTTP 500.
_PARSE_FAILURES = ("Unable to parse '", "Unable to set '", "failed to parse the request JSON buffer",
                   "failed to get request params")
_RAW_INPUT = re.compile(r"input 'raw_input'")


def client_error(status: int, body: bytes) -> tuple[int, bytes] | None:
    """A better (status, body) for one of Triton's error answers to an inference request, or None to pass it on
    as it is: parse failures are the client's mistake (400, Triton's message kept), and the internal name of a
    raw binary input is replaced by what the user sent."""
    try:
        payload = json.loads(body)
        message = payload["error"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(message, str):
        return None
    changed = False
    if status == 500 and message.startswith(_PARSE_FAILURES):
        status, changed = 400, True
    if "'raw_input'" in message:
        message = _RAW_INPUT.sub("the raw binary request body (Inference-Header-Content-Length: 0)", message)
        message = message.replace("'raw_input'", "the raw binary request body")
        changed = True
    if not changed:
        return None
    return status, json.dumps({"error": message}).encode()
