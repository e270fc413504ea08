"""The JSON fast path: an inference request's JSON checked without a Python object per number, and its FP32 and
integer tensors handed to Triton in the binary tensor extension instead of as text.

Why: a KServe v2 JSON request of the CNN sample is 253 KB of numbers. `json.loads` built 12,288 floats to count them
(2.41 ms of the gateway's CPU per request) and Triton then parsed the same text again (1.31 ms). Here pysimdjson
parses the body into its own tape (about 0.25 ms), the request's small parts (names, shapes, parameters) become
Python values for gateway/protocol.py's checks, and each input's 'data' stays on the tape: its leaves are counted
by walking the lists (never the numbers), and an FP32 tensor is copied out as one buffer of doubles.
Measured in bench/json_path.py and docs/benchmarks.md ("The JSON fast path").

What Triton answers stays what it would answer to the JSON (tests/test_json_answer_identity.py compares them on a
real Triton), but for data of a number datatype holding a string, null, a boolean or an object, which Triton refuses
with a 500 naming neither the input nor what it found: that is the gateway's 400 saying both (_check_numbers). Only
the 'data' of FP32 inputs whose every leaf is a JSON number is moved, and only when no number lies
near a float32 rounding boundary (_fp32); of integer inputs, only data of integers within the type's range, which
Triton reads exactly. Triton reads a JSON number into a double with rapidjson's normal-precision algorithm, which
is not correctly rounded (simdjson is): the doubles differ in their last bits, so FP64 tensors stay
JSON, and a float32 cast of the two agrees except next to a midpoint between two floats. Everything else in the
request (ids, parameters, outputs, other inputs) is sent as parsed, and the answer (JSON unless the request asks for
binary outputs, as before) is passed on untouched. What simdjson
refuses but Python's json module reads (NaN, integers over 64 bits, a byte-order mark) takes the old path, with its
messages and the body forwarded as sent, so that Triton judges it as before.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

import numpy as np
import simdjson

from gateway import protocol
from gateway.contract import requested_outputs
from gateway.fastpath.depth import json_too_deep
from gateway.protocol import Refusal, UnparsedData

# The datatypes whose JSON numbers are sent as binary (little-endian in the binary extension). FP64 stays JSON: it
# would carry simdjson's correctly rounded doubles where Triton's parser is off by a few units in the last place
# (0.99999999999999994 is 1.0 to Triton). The integer types go as binary only when every leaf is a JSON integer within
# the type's range (what Triton reads exactly); anything else is left to Triton's own checks, in the JSON it was sent.
# Why the integers too: a shared pool's Triton parses JSON into a DOM of about 16 bytes per number for every team of
# the pool (issue 30), and JSON that reaches a pool is capped (GATEWAY_MAX_POOL_JSON_BYTES).
TRANSCODED: dict[str, np.dtype[Any]] = {"FP32": np.dtype("<f4"), "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"),
                                        "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"), "UINT8": np.dtype("<u1"),
                                        "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"),
                                        "UINT64": np.dtype("<u8")}
# How far (in units in the last place of the double) Triton's reading of a number may be from the correctly rounded
# one. rapidjson's normal precision keeps 17 significant digits of a fraction, accumulates integer digits past 19
# one multiply-add at a time (half a unit each, 309 digits at most before a double overflows), then scales by a
# power of ten in one or two steps: a few hundred units at the very worst; 1024 leaves room. A float32 value
# written out (json.dumps of a float32 array) is half a float32 step, 2**28 units, from any boundary; of doubles
# anywhere, one in 2**18 is this near one (FLT_MAX + 2**103, where rounding goes to inf, is one of them).
NEAR_ULPS = 1024.0
_FLT_MIN_NORMAL = 2.0**-126
_NEAR_SHIFT = np.uint64(NEAR_ULPS + 2**28)
_LOW_29_BITS = np.uint64(2**29 - 1)
_NEAR_SPAN = np.uint64(2 * NEAR_ULPS)
_MAGNITUDE_BITS = np.uint64(2**63 - 1)
_ONE = np.uint64(1)
_FLT_MIN_NORMAL_BITS = np.array(_FLT_MIN_NORMAL).view(np.uint64)[()]
_FLT_MAX_BITS = np.array(float(np.finfo(np.float32).max)).view(np.uint64)[()]
_BOM = b"\xef\xbb\xbf"
# Bodies up to this size are parsed by a parser kept per thread (_parse): the event loop's, since larger JSON is
# parsed in worker threads (gateway/app.py's THREAD_PARSE_BYTES). It keeps buffers for the largest of them.
REUSED_PARSER_BYTES = 1024 * 1024
_REUSE_REFUSED = "re-use a parser"  # pysimdjson's RuntimeError while objects of the last document are alive
_reusable = threading.local()
# The transcoded request's JSON header, compact; made once (json.dumps with separators makes an encoder per call).
_HEADER_ENCODER = json.JSONEncoder(separators=(",", ":"))


@dataclass(frozen=True)
class Checked:
    """A JSON request that passed the checks: `body` is what to forward instead of it (the binary tensor extension,
    its JSON header `header_length` bytes long), or None to forward it as sent."""

    body: bytes | None = None
    header_length: int = 0
    outputs: tuple[str, ...] | None = None  # the outputs the request asks for (None: all of them)


def check_json(data: bytes, binary_length: int | None, max_depth: int, max_tensor_bytes: int,
               transcode: bool) -> Checked:
    """Check the JSON part of an inference request (gateway/protocol.py's checks and messages); `binary_length`
    is the length of the binary part after it (None: a JSON-only request, which may be transcoded)."""
    if json_too_deep(data, max_depth):
        raise Refusal(400, f"The request JSON nests deeper than {max_depth} levels (or its brackets do not match).")
    try:
        document = None if data.startswith(_BOM) else _parse(data)
    except (ValueError, RuntimeError):  # not strict JSON, or numbers simdjson does not hold: Python's json decides
        document = None
    if document is None:
        request = protocol.parse_json_header(data, max_depth)
        _refuse_duplicate_keys_in(data)
        protocol.check_infer_request(request, binary_length, max_tensor_bytes)
        _check_numbers(request, ())
        return Checked(outputs=requested_outputs(request))
    request = _request(document)
    protocol.check_infer_request(request, binary_length, max_tensor_bytes)
    outputs = requested_outputs(request)
    if not transcode or binary_length is not None:
        _check_numbers(request, ())
        return Checked(outputs=outputs)
    _check_numbers(request, TRANSCODED)  # the transcoded datatypes are checked as they are converted (_binary)
    return _transcoded(request, outputs)


def _check_numbers(request: dict[str, Any], skipped: Container[str]) -> None:
    """Refuse an input of a number datatype whose 'data' holds anything but numbers, with a message naming the
    input, its datatype and what is there (protocol.check_numbers), rather than Triton's "attempt to access JSON
    non-number as double". Data on simdjson's tape is tested by as_buffer, in C; only where it fails are the
    leaves walked."""
    for tensor in request["inputs"]:
        datatype = tensor["datatype"]
        data = tensor.get("data")
        if datatype not in protocol.NUMBER_DATATYPES or datatype in skipped or data is None:
            continue
        if isinstance(data, UnparsedData):
            if data.count:
                try:
                    data.array.as_buffer(of_type="d")
                except (TypeError, ValueError):
                    _refuse_non_numbers(tensor)
        else:
            protocol.check_numbers(tensor["name"], datatype, data, _ARRAYS)


_ARRAYS = (list, simdjson.Array)


def _refuse_non_numbers(tensor: dict[str, Any]) -> None:
    """The 400 of protocol.check_numbers for a tensor whose data simdjson would not read as numbers; nothing when
    every leaf is a number after all (an integer past 64 bits: Triton's to judge)."""
    data = tensor["data"]
    protocol.check_numbers(tensor["name"], tensor["datatype"], data.array if isinstance(data, UnparsedData) else data,
                           _ARRAYS)


# The JSON headers of binary requests whose passed checks are kept (HeaderChecks): how long, and how many.
CACHED_HEADER_BYTES = 4096
CACHED_HEADERS = 256


class HeaderChecks:
    """The checks passed by binary requests' JSON headers, kept by the header's exact bytes and the length of the
    binary part after it. A client sends the same header with every request to a model (its names, shapes and
    sizes), and checking it again cost about 15 µs of the gateway's 150 µs of CPU per binary request
    (docs/benchmarks.md). check_json is a function of those bytes, that length and the gateway's fixed limits
    alone. Only passes are kept (a refusal is checked, and worded, anew each time), at most CACHED_HEADERS of
    them, the oldest going first: made-up headers can only push real ones out, at the cost of one check each."""

    def __init__(self, max_depth: int, max_tensor_bytes: int, max_entries: int = CACHED_HEADERS) -> None:
        self.max_depth = max_depth
        self.max_tensor_bytes = max_tensor_bytes
        self.max_entries = max_entries
        self.passed: dict[tuple[bytes, int], Checked] = {}

    def check(self, data: bytes, binary_length: int) -> Checked:
        if len(data) > CACHED_HEADER_BYTES:
            return check_json(data, binary_length, self.max_depth, self.max_tensor_bytes, False)
        key = (data, binary_length)
        found = self.passed.get(key)
        if found is not None:
            return found
        checked = check_json(data, binary_length, self.max_depth, self.max_tensor_bytes, False)
        if len(self.passed) >= self.max_entries:
            del self.passed[next(iter(self.passed))]
        self.passed[key] = checked
        return checked


def _parse(data: bytes) -> Any:
    """simdjson's document of `data`, parsed by this thread's reusable parser when the body is small: a new
    parser allocates its buffers for every document (0.334 ms per parse of the CNN sample's request against 0.259
    ms reused, docs/benchmarks.md "The whole JSON request in the gateway"). A parser holds one document at a time,
    and refuses to parse another while objects of the last one are alive (a Refusal's traceback may keep some past
    check_json): then this request gets a new one. Large bodies get a parser of their own, which goes with them,
    so that no parser keeps a large buffer."""
    if len(data) > REUSED_PARSER_BYTES:
        return simdjson.Parser().parse(data)
    parser = getattr(_reusable, "parser", None)
    if parser is not None:
        try:
            return parser.parse(data)
        except RuntimeError as exc:
            if _REUSE_REFUSED not in str(exc):
                raise
    _reusable.parser = simdjson.Parser()
    return _reusable.parser.parse(data)


# --- From simdjson's tape to what the checks read -----------------------------------------------------------------


def _request(document: Any) -> Any:
    if not isinstance(document, simdjson.Object):
        return _plain(document)
    request: dict[str, Any] = {}
    for key in _keys(document):
        value = document[key]
        if key == "inputs" and isinstance(value, simdjson.Array):
            request[key] = [_input(tensor) for tensor in value]
        else:
            request[key] = _plain(value)
    return request


def _input(tensor: Any) -> Any:
    if not isinstance(tensor, simdjson.Object):
        return _plain(tensor)
    out: dict[str, Any] = {}
    for key in _keys(tensor):
        value = tensor[key]
        if key == "data" and isinstance(value, simdjson.Array):
            count = _count(value)
            # Unevenly nested data is rare and refused: the checks get the lists, to quote them as before.
            out[key] = UnparsedData(count, value) if count is not None else value.as_list()
        else:
            out[key] = _plain(value)
    return out


def _keys(obj: Any) -> list[str]:
    """The object's keys, refusing one given twice: Python's json keeps the last, Triton's parser reads the first,
    so a shape checked here would not be the shape Triton allocates."""
    keys: list[str] = list(obj.keys())
    if len(set(keys)) != len(keys):
        seen: set[str] = set()
        for key in keys:
            if key in seen:
                raise _duplicate(key)
            seen.add(key)
    return keys


def _duplicate(key: str) -> Refusal:
    return Refusal(400, f"The request JSON gives the key {key[:100]!r} twice in one object; send each key once.")


def _refuse_duplicate_keys_in(data: bytes) -> None:
    """The same rule for a request only Python's json reads (the old path, no hot one)."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                raise _duplicate(key)
            seen[key] = value
        return seen

    json.loads(data, object_pairs_hook=pairs)


def _plain(value: Any) -> Any:
    """A tape value as Python values, refusing a key given twice in any object in it: as_dict() keeps the last,
    Triton reads the first (an output's 'parameters', an input's binary_data_size). Only the request's small parts
    come here; an input's 'data' stays on the tape (_input)."""
    if not isinstance(value, (simdjson.Object, simdjson.Array)):
        return value
    plain = value.as_dict() if isinstance(value, simdjson.Object) else value.as_list()
    _refuse_shrunk_objects(value, plain)
    return plain


_CONTAINERS = frozenset((dict, list))  # the types as_dict() and as_list() make of objects and arrays


def _refuse_shrunk_objects(tape: Any, plain: dict[str, Any] | list[Any]) -> None:
    """Refuse where a dict converted from the tape has fewer keys than its tape object (a key given twice). Cheap
    on purpose: the conversion stays in C, and only the containers are walked, beside their Python values, so a
    long list of numbers costs one isinstance per item and is never read from the tape again."""
    if isinstance(plain, dict):
        if len(plain) != len(tape):
            _keys(tape)  # raises, naming the key
        pairs: Any = ((tape[key], item) for key, item in plain.items() if isinstance(item, (dict, list)))
    else:
        if _CONTAINERS.isdisjoint(map(type, plain)):  # in C: no Python step per number
            return
        pairs = ((node, item) for node, item in zip(tape, plain, strict=True) if isinstance(item, (dict, list)))
    for node, item in pairs:
        _refuse_shrunk_objects(node, item)


# simdjson keeps an array's length in 24 bits of its tape: len() of a longer one says 16,777,215.
_SATURATED_LENGTH = 2**24 - 1


def _length(array: Any) -> int:
    """len() of a tape array, counted item by item where the tape's count saturates (a JSON body of 32 MB and more,
    over the default GATEWAY_MAX_JSON_BYTES), so that no message names a wrong count and no check passes on one."""
    size = len(array)
    if size < _SATURATED_LENGTH:
        return size
    return sum(1 for _ in array)


def _count(array: Any) -> int | None:
    """The leaf count of a tape array, by the rule of protocol's _count_elements (lists of lists all nested alike,
    judged by each list's first item), touching the lists and never the leaves."""
    size = _length(array)
    if not size or not isinstance(array[0], simdjson.Array):
        return size
    total = 0
    for item in array:
        if not isinstance(item, simdjson.Array):
            return None
        count = _count(item)
        if count is None:
            return None
        total += count
    return total


# --- The binary tensor extension ----------------------------------------------------------------------------------


def _transcoded(request: dict[str, Any], outputs: tuple[str, ...] | None) -> Checked:
    """The request with each FP32 input whose leaves are all numbers, none near a rounding boundary, sent as binary
    data; Checked(outputs=outputs) when none is (the JSON is then forwarded as sent)."""
    inputs: list[dict[str, Any]] = []
    tensors: list[bytes] = []
    for tensor in request["inputs"]:
        raw = _binary(tensor)
        if raw is None:
            inputs.append({k: v.array.as_list() if isinstance(v, UnparsedData) else v for k, v in tensor.items()})
            continue
        tensors.append(raw)
        parameters = {**tensor.get("parameters", {}), "binary_data_size": len(raw)}
        inputs.append({**{k: v for k, v in tensor.items() if k != "data"}, "parameters": parameters})
    if not tensors:
        return Checked(outputs=outputs)
    header = _HEADER_ENCODER.encode({**request, "inputs": inputs}).encode()
    return Checked(b"".join([header, *tensors]), len(header), outputs)


def _binary(tensor: dict[str, Any]) -> bytes | None:
    data = tensor.get("data")
    datatype = tensor.get("datatype")
    dtype = TRANSCODED.get(datatype) if isinstance(datatype, str) else None
    # Parameters that are not an object (null) are Triton's to judge, in the JSON it was sent.
    if dtype is None or not isinstance(data, UnparsedData) or not data.count:
        return None
    if not isinstance(tensor.get("parameters", {}), dict):
        return None
    if dtype.kind != "f":
        return _integers(tensor, data, dtype)
    try:
        buffer = data.array.as_buffer(of_type="d")  # every leaf a number, or TypeError
    except (TypeError, ValueError):
        _refuse_non_numbers(tensor)
        return None
    doubles = np.frombuffer(buffer, dtype=np.float64)
    if doubles.size != data.count:
        # Nested unevenly ([1, [2, 3]], [1, []]): the count judges by first items and as_buffer flattens them all,
        # so the two disagree; Triton judges such data in the JSON it was sent.
        return None
    return _fp32(doubles)


def _integers(tensor: dict[str, Any], data: UnparsedData, dtype: np.dtype[Any]) -> bytes | None:
    """The data as `dtype`, or None unless every leaf is a JSON integer within its range (simdjson refuses a
    fraction, an exponent, a boolean or a string with TypeError, an integer past 64 bits with ValueError). A leaf
    that is no number at all is refused (_refuse_non_numbers); fractions and integers out of range Triton judges."""
    unsigned = dtype.kind == "u"
    try:
        buffer = data.array.as_buffer(of_type="u" if unsigned else "i")
    except (TypeError, ValueError):
        _refuse_non_numbers(tensor)
        return None
    values = np.frombuffer(buffer, dtype=np.uint64 if unsigned else np.int64)
    if values.size != data.count:  # nested unevenly, as for floats (_binary)
        return None
    limits = np.iinfo(dtype)
    if dtype.itemsize < 8 and (values.min() < limits.min or values.max() > limits.max):
        return None  # out of range: Triton's to judge
    return values.astype(dtype).tobytes()


def _fp32(doubles: np.ndarray[Any, np.dtype[np.float64]]) -> bytes | None:
    """The doubles cast to float32 as Triton casts them (round to nearest even; 1e300 is inf), or None when one of
    them is within NEAR_ULPS of a boundary between two float32 values, where Triton's less exact reading of the
    text could round the other way."""
    # Where float32 values are normal, their grid is the double's with 29 fewer mantissa bits: a boundary is a
    # double whose low 29 bits are 2**28. Three integer operations per number, not a float32 neighbour each, in one
    # work array (each temporary of a 12,288-number tensor is another 96 KB to write and read).
    # Each question is a min() or max() of the work array (one pass that reads it) rather than a comparison and
    # any() (a pass writing a boolean temporary and another reading it): 6 passes over the tensor instead of 9.
    bits = doubles.view(np.uint64)
    work = np.add(bits, _NEAR_SHIFT)
    np.bitwise_and(work, _LOW_29_BITS, out=work)
    if work.min() <= _NEAR_SPAN:
        return None
    # The magnitudes' bits, ordered as the magnitudes are (sign bit cleared).
    np.bitwise_and(bits, _MAGNITUDE_BITS, out=work)
    largest = work.max()
    # Below float32's normal range the grid is fixed (2**-149); these few are measured one by one. 0 is not one:
    # minus one, its magnitude wraps to the largest unsigned value. With no 0 and nothing that small (the
    # smallest magnitude is normal), neither step is needed.
    if work.min() < _FLT_MIN_NORMAL_BITS and np.subtract(work, _ONE, out=work).min() < _FLT_MIN_NORMAL_BITS - _ONE:
        tiny = (np.abs(doubles) < _FLT_MIN_NORMAL) & (doubles != 0)
        if _near_boundary(doubles[tiny]).any():
            return None
    if largest < _FLT_MAX_BITS:  # nothing to overflow to inf, nothing for numpy to warn about
        return doubles.astype(np.float32).tobytes()
    with np.errstate(over="ignore"):
        return doubles.astype(np.float32).tobytes()


def _near_boundary(doubles: np.ndarray[Any, np.dtype[np.float64]]) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Whether each double lies within NEAR_ULPS of the midpoint between the float32 values around it."""
    floats = doubles.astype(np.float32)
    toward = np.where(doubles > floats, np.float32(np.inf), np.float32(-np.inf))
    boundary = (floats.astype(np.float64) + np.nextafter(floats, toward).astype(np.float64)) / 2  # exact
    near: np.ndarray[Any, np.dtype[np.bool_]] = (doubles != floats) & (
        np.abs(doubles - boundary) <= NEAR_ULPS * np.spacing(np.abs(doubles)))
    return near
