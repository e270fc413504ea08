"""What the gRPC gateway lets through to Triton's GRPCInferenceService, checked before a byte is forwarded: the
methods a team's program needs, and the parts of an inference request that Triton mishandles.

Plain functions over bytes, no Django and no grpc: the gRPC gateway's front door for untrusted messages. Refusals
are gateway.protocol's `Refusal` with an HTTP status (the same statuses, statistics and messages as the HTTP
gateway); `grpc_code()` turns the status into the gRPC status code users expect.

Messages are never decoded whole: an inference request is mostly tensor bytes, which protobuf's parser would copy.
`scan_infer_request()` walks the protobuf wire format over the received bytes instead, reading only the small
fields (the model, each input's name, datatype, shape and parameters, the lengths of the raw contents) and skipping
the rest by its length prefix. The walk is bounded by counts (inputs, parameters, fields), so a message of a
million tiny fields costs no more than a normal one before it is refused.

What Triton 2.51 does with bad gRPC input, measured against the real server (tests/test_grpc_gateway_e2e.py keeps
it true): a declared shape whose byte size overflows 64 bits (e.g. [2**62] of FP32 with no data) passes its size
check as 0 bytes and kills the model's python stub ("array is too big"); every later request to that model then
fails with "Stub process is not healthy" while the server still reports ready. Shapes are therefore bounded here
by GATEWAY_MAX_TENSOR_BYTES with Python's unbounded integers, as the HTTP gateway does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gateway.protocol import DATATYPE_SIZES, MAX_SHAPE_RANK, Refusal

SERVICE = "inference.GRPCInferenceService"
PREFIX = f"/{SERVICE}/"
STREAM_METHOD = PREFIX + "ModelStreamInfer"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"

# The methods a program needs, by kind (the HTTP gateway's endpoint kinds): each takes a small request naming a
# model in field 1, except the inference calls (scanned) and the server-wide ones (no model).
METHODS: dict[str, str] = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ServerMetadata": "server",
    "ModelReady": "ready",
    "ModelMetadata": "model",
    "ModelConfig": "config",
    "ModelStatistics": "stats",
    "ModelInfer": "infer",
    "ModelStreamInfer": "stream",
}
ALLOWED_SURFACE = ", ".join(METHODS)
# Requests other than inference carry a model name and a version: nothing legitimate comes near this size.
MAX_SMALL_REQUEST_BYTES = 64 * 1024
MAX_NAME_BYTES = 1024
MAX_INPUTS = 1024  # inputs, and requested outputs, per request
MAX_PARAMETERS = 64  # per input or output
MAX_VERSION_DIGITS = 18


@dataclass(frozen=True)
class Method:
    path: str  # "/inference.GRPCInferenceService/ModelInfer"
    name: str  # "ModelInfer"
    kind: str  # see METHODS


def classify(path: str) -> Method:
    """The allowed method `path` names, or a 403 (PERMISSION_DENIED) for the rest of Triton's service (its
    repository, shared-memory, trace and logging methods, and any it adds later), a 501 (UNIMPLEMENTED) for
    another service."""
    if not path.startswith(PREFIX):
        raise Refusal(501, f"{path[:200]} is not served here: the gateway serves {SERVICE} (KServe v2) only.")
    name = path[len(PREFIX):]
    kind = METHODS.get(name)
    if kind is None:
        raise Refusal(403, f"{SERVICE}/{name[:100]} is not available through the gateway, which serves the KServe "
                           f"v2 inference protocol only: {ALLOWED_SURFACE}.")
    return Method(path, name, kind)


# --- gRPC status codes ----------------------------------------------------------------------------------------

# The HTTP gateway's statuses as the gRPC codes a gRPC user expects (grpc.StatusCode names; this module does not
# import grpc). 413 and 429 are both limits; 502 (Triton unreachable) is worth a retry like 503.
_CODES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
          413: "RESOURCE_EXHAUSTED", 415: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
          501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
# And back, for the statistics of answers Triton gave (the usual mapping, e.g. grpc-gateway's).
_STATUSES = {"OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400, "DEADLINE_EXCEEDED": 504,
             "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "PERMISSION_DENIED": 403, "UNAUTHENTICATED": 401,
             "RESOURCE_EXHAUSTED": 429, "FAILED_PRECONDITION": 400, "ABORTED": 409, "OUT_OF_RANGE": 400,
             "UNIMPLEMENTED": 501, "INTERNAL": 500, "UNAVAILABLE": 503, "DATA_LOSS": 500}


def grpc_code(status: int) -> str:
    return _CODES.get(status, "INTERNAL")


def http_status(code_name: str) -> int:
    return _STATUSES.get(code_name, 500)


# Triton answers a mistake inside a stream with an error message only (no code). These phrases begin its messages
# for the client's mistakes (measured on 2.51), so that the statistics count them as 400s, not as server errors.
_CLIENT_MISTAKES = ("unexpected ", "expected ", "input byte size mismatch", "unknown model", "missing required",
                    "contents field must not be specified", "request for unknown model", "unable to find",
                    "inference input ", "inference request ")


def stream_error_status(message: str) -> int:
    text = message
    if text.startswith("[request id:"):
        text = text.partition("] ")[2]
    return 400 if text.lower().startswith(_CLIENT_MISTAKES) else 500


# --- The protobuf wire format --------------------------------------------------------------------------------------

VARINT, I64, LEN, I32 = 0, 1, 2, 5


class Malformed(Exception):
    pass


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            break
    raise Malformed("a varint runs past its message or over 10 bytes")


def _fields(buf: bytes, pos: int, end: int, limit: int) -> list[tuple[int, int, int, int]]:
    """The fields of the message in buf[pos:end]: (number, wire type, start, end) where a VARINT's value is
    `start` itself, and the others are the byte range of their payload. More than `limit` fields is refused."""
    out: list[tuple[int, int, int, int]] = []
    while pos < end:
        if len(out) >= limit:
            raise Refusal(400, f"The request has more than {limit} fields in one message; a Triton inference "
                               "request needs far fewer.")
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise Malformed("field number 0")
        if wire == VARINT:
            value, pos = _varint(buf, pos, end)
            out.append((number, wire, value, pos))
            continue
        if wire == LEN:
            size, pos = _varint(buf, pos, end)
            stop = pos + size
        elif wire == I64:
            stop = pos + 8
        elif wire == I32:
            stop = pos + 4
        else:  # groups (3, 4): a proto2 relic no KServe client sends
            raise Malformed(f"wire type {wire}")
        if stop > end:
            raise Malformed("a field runs past the end of its message")
        out.append((number, wire, pos, stop))
        pos = stop
    return out


def _string(buf: bytes, start: int, stop: int, what: str) -> str:
    if stop - start > MAX_NAME_BYTES:
        raise Refusal(400, f"The {what} is {stop - start} bytes long; the limit is {MAX_NAME_BYTES}.")
    try:
        return buf[start:stop].decode("utf-8")
    except UnicodeDecodeError:
        raise Refusal(400, f"The {what} is not valid UTF-8.") from None


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# --- Requests ---------------------------------------------------------------------------------------------------


def model_name(data: bytes) -> tuple[str, str]:
    """The model (field 1) and version (field 2) a small request (ModelReady, ModelMetadata, ModelConfig,
    ModelStatistics) names."""
    if len(data) > MAX_SMALL_REQUEST_BYTES:
        raise Refusal(400, f"The request message is {len(data)} bytes; this method takes a model name and version "
                           f"only (at most {MAX_SMALL_REQUEST_BYTES} bytes).")
    name = version = ""
    try:
        for number, wire, start, stop in _fields(data, 0, len(data), 64):
            if number == 1 and wire == LEN:
                name = _string(data, start, stop, "model name")
            elif number == 2 and wire == LEN:
                version = _string(data, start, stop, "model version")
    except Malformed as exc:
        raise _malformed(exc) from None
    _check_version(version)
    return name, version


@dataclass
class InputSummary:
    name: str = ""
    datatype: str = ""
    shape: list[int] = field(default_factory=list)
    has_contents: bool = False


@dataclass
class InferSummary:
    """The small fields of a ModelInferRequest."""

    model: str = ""
    version: str = ""
    id: str = ""
    inputs: list[InputSummary] = field(default_factory=list)
    raw_sizes: list[int] = field(default_factory=list)  # the lengths of raw_input_contents, in order
    outputs: list[str] = field(default_factory=list)  # the outputs asked for (none: all of them)


def scan_infer_request(data: bytes, max_tensor_bytes: int) -> InferSummary:
    """read_infer_request() and check_infer_request() in one."""
    summary = read_infer_request(data)
    check_infer_request(summary, max_tensor_bytes)
    return summary


def read_infer_request(data: bytes) -> InferSummary:
    """The small fields of a ModelInferRequest, read without copying its tensors (400 when it is not one)."""
    summary = InferSummary()
    end = len(data)
    try:
        top = _fields(data, 0, end, 3 * MAX_INPUTS + 64)
        for number, wire, start, stop in top:
            if wire != LEN:
                continue  # not a field of ModelInferRequest as Triton knows it; protobuf skips it too
            if number == 1:
                summary.model = _string(data, start, stop, "model name")
            elif number == 2:
                summary.version = _string(data, start, stop, "model version")
            elif number == 3:
                summary.id = _string(data, start, stop, "request id")
            elif number == 5:
                if len(summary.inputs) >= MAX_INPUTS:
                    raise Refusal(400, f"The request has more than {MAX_INPUTS} inputs.")
                summary.inputs.append(_scan_input(data, start, stop))
            elif number == 6:
                summary.outputs.append(_scan_output(data, start, stop))
            elif number == 7:
                summary.raw_sizes.append(stop - start)
    except Malformed as exc:
        raise _malformed(exc) from None
    return summary


def _malformed(exc: Malformed) -> Refusal:
    return Refusal(400, f"The request is not a valid protobuf message of its method's type ({exc}).")


def _scan_input(data: bytes, start: int, stop: int) -> InputSummary:
    tensor = InputSummary()
    parameters = 0
    for number, wire, begin, end in _fields(data, start, stop, MAX_SHAPE_RANK + MAX_PARAMETERS + 16):
        if number == 1 and wire == LEN:
            tensor.name = _string(data, begin, end, "input name")
        elif number == 2 and wire == LEN:
            tensor.datatype = _string(data, begin, end, "input datatype")
        elif number == 3 and wire == VARINT:
            tensor.shape.append(_int64(begin))
        elif number == 3 and wire == LEN:  # packed, as every current encoder writes repeated int64
            pos = begin
            while pos < end:
                if len(tensor.shape) > MAX_SHAPE_RANK:
                    break  # refused below with the shape's rank
                value, pos = _varint(data, pos, end)
                tensor.shape.append(_int64(value))
        elif number == 4 and wire == LEN:
            parameters += 1
            if parameters > MAX_PARAMETERS:
                raise Refusal(400, f"Input {tensor.name[:100]!r} has more than {MAX_PARAMETERS} parameters.")
            _check_parameter(data, begin, end, f"input {tensor.name[:100]!r}")
        elif number == 5 and wire == LEN:
            tensor.has_contents = True  # its element count is Triton's to check, once the shape is bounded
    return tensor


def _scan_output(data: bytes, start: int, stop: int) -> str:
    name = ""
    parameters = 0
    for number, wire, begin, end in _fields(data, start, stop, MAX_PARAMETERS + 8):
        if number == 1 and wire == LEN:
            name = _string(data, begin, end, "output name")
        elif number == 2 and wire == LEN:
            parameters += 1
            if parameters > MAX_PARAMETERS:
                raise Refusal(400, f"Output {name[:100]!r} has more than {MAX_PARAMETERS} parameters.")
            _check_parameter(data, begin, end, f"output {name[:100]!r}")
    return name


def answer_outputs(data: bytes) -> list[str] | None:
    """The output names of Triton's ModelInferResponse (field 5, each named in its field 1), None when the bytes
    are not one. Triton's answer is trusted for its framing, not for what the model put in it."""
    names: list[str] = []
    try:
        for number, wire, start, stop in _fields(data, 0, len(data), 1 << 20):
            if number == 5 and wire == LEN:
                names.extend(data[b:e].decode("utf-8", "replace")
                             for n, w, b, e in _fields(data, start, stop, 1 << 16) if n == 1 and w == LEN)
    except (Malformed, Refusal):
        return None
    return names


def _check_parameter(data: bytes, start: int, stop: int, label: str) -> None:
    """A map entry (key = 1, value = 2): shared memory is refused, as over HTTP."""
    for number, wire, begin, end in _fields(data, start, stop, 8):
        if number == 1 and wire == LEN:
            key = _string(data, begin, end, f"parameter name of {label}")
            if key.startswith("shared_memory"):
                raise Refusal(400, f"{label.capitalize()} uses shared memory, which the gateway does not offer: "
                                   "send the data in the request.")


def _check_version(version: str) -> None:
    if version and not (version.isascii() and version.isdigit() and len(version) <= MAX_VERSION_DIGITS):
        raise Refusal(400, f"The model version must be a version number (or empty for the latest), got "
                           f"{version[:40]!r}.")


def check_infer_request(summary: InferSummary, max_tensor_bytes: int) -> None:
    """Refuse what Triton would mishandle or what breaks the gateway's limits: a shape over `max_tensor_bytes`
    (413), a negative or over-long shape, an unknown datatype, raw contents that do not match the inputs (400)."""
    if not summary.model:
        raise Refusal(400, "Name the model: the request's model_name is empty.")
    _check_version(summary.version)
    if not summary.inputs:
        raise Refusal(400, "The request has no inputs: send each input tensor with its name, datatype, shape and "
                           "data (raw_input_contents or contents).")
    raw = summary.raw_sizes
    if raw and len(raw) != len(summary.inputs):
        raise Refusal(400, f"The request has {len(summary.inputs)} inputs but {len(raw)} raw_input_contents: send "
                           "raw contents for every input, in the same order, or for none.")
    for index, tensor in enumerate(summary.inputs):
        label = f"input {tensor.name[:100]!r}"
        if not tensor.name:
            raise Refusal(400, f"inputs[{index}] needs a name.")
        if tensor.datatype not in DATATYPE_SIZES:
            raise Refusal(400, f"The datatype of {label} must be one of {', '.join(DATATYPE_SIZES)}, got "
                               f"{tensor.datatype[:40]!r}.")
        shape = tensor.shape
        if len(shape) > MAX_SHAPE_RANK or any(dim < 0 for dim in shape):
            raise Refusal(400, f"The shape of {label} must be whole numbers >= 0 (at most {MAX_SHAPE_RANK} of "
                               f"them), got {_shape_text(shape)}.")
        elements = math.prod(shape)
        need = elements * DATATYPE_SIZES[tensor.datatype]
        if need > max_tensor_bytes:
            raise Refusal(413, f"The shape {_shape_text(shape)} of {tensor.datatype} of {label} is {need} bytes"
                               f"{' at least' if tensor.datatype == 'BYTES' else ''}; the limit is "
                               f"{max_tensor_bytes} bytes.")
        if raw:
            if tensor.has_contents:
                raise Refusal(400, f"{label.capitalize()} has both contents and raw_input_contents; send one.")
            size = raw[index]
            if tensor.datatype == "BYTES":
                if size < need:
                    raise Refusal(400, f"The raw contents of {label} are {size} bytes, too small for {elements} "
                                       "BYTES elements (each takes 4 bytes of length and its bytes).")
            elif size != need:
                raise Refusal(400, f"The raw contents of {label} are {size} bytes, but its shape "
                                   f"{_shape_text(shape)} of {tensor.datatype} takes {need} bytes.")


def _shape_text(shape: list[int]) -> str:
    text = "[" + ", ".join(str(d) for d in shape[:MAX_SHAPE_RANK + 1]) + "]"
    return text if len(text) <= 80 else text[:77] + "..."


# --- Responses --------------------------------------------------------------------------------------------------


def stream_error(data: bytes) -> str:
    """The error_message (field 1) of a ModelStreamInferResponse, "" when it carries an answer. Only the top
    level is walked; the answer (field 2) is skipped by its length."""
    try:
        for number, wire, start, stop in _fields(data, 0, len(data), 16):
            if number == 1 and wire == LEN:
                return data[start:stop].decode("utf-8", "replace")
    except (Malformed, Refusal):
        return "the gateway could not read Triton's stream response"
    return ""


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | LEN) + _encode_varint(len(payload)) + payload


FINAL_PARAMETER = "triton_final_response"
# InferParameter{bool_param: true}, the value of Triton's final flag on a decoupled model's last response.
_BOOL_TRUE = b"\x08\x01"


def stream_final(data: bytes) -> bool | None:
    """The `triton_final_response` parameter of a ModelStreamInferResponse's answer: Triton 2.51 sets it on every
    response to a decoupled model's request (false on each piece, true on the last), and on no other. None when
    absent (or when the bytes are not Triton's message shape)."""
    try:
        for number, wire, start, stop in _fields(data, 0, len(data), 16):
            if number != 2 or wire != LEN:
                continue
            for n, w, b, e in _fields(data, start, stop, 1 << 20):
                if n != 4 or w != LEN:
                    continue
                entry = _fields(data, b, e, 8)
                key = next((data[kb:ke] for kn, kw, kb, ke in entry if kn == 1 and kw == LEN), b"")
                if key == FINAL_PARAMETER.encode():
                    value = next((data[vb:ve] for vn, vw, vb, ve in entry if vn == 2 and vw == LEN), b"")
                    return value == _BOOL_TRUE
    except (Malformed, Refusal):
        return None
    return None


def stream_error_response(message: str, model: str = "", request_id: str = "", final: bool = False) -> bytes:
    """A ModelStreamInferResponse carrying an error for one request of a stream, as Triton writes its own:
    error_message, and infer_response naming the model and the request id so that the client can match it.
    `final`: the answer also carries `triton_final_response: true`, as Triton's error that ends a decoupled model's
    request does (a client that waits for the final flag then knows the request is over)."""
    inner = b""
    if model:
        inner += _len_field(1, model.encode())
    if request_id:
        inner += _len_field(3, request_id.encode())
    if final:
        inner += _len_field(4, _len_field(1, FINAL_PARAMETER.encode()) + _len_field(2, _BOOL_TRUE))
    out = _len_field(1, message.encode())
    if inner:
        out += _len_field(2, inner)
    return out


HEALTH_SERVING = b"\x08\x01"  # grpc.health.v1.HealthCheckResponse{status: SERVING}


# --- Rewriting fields (a shared deployment's names, gateway/pool_names.py) -------------------------------------------

def rewrite_fields(data: bytes, rewrites: Mapping[int, Callable[[bytes], bytes | None]], limit: int = 1 << 20) -> bytes:
    """`data` with the payload of each top-level LEN field whose number is in `rewrites` replaced (or the field
    dropped, when its rewrite gives None); every other field is copied as it came, in its place. One copy of the
    message: its tensors are moved, never decoded. A message that is not valid protobuf is a 400."""
    out = bytearray()
    copied = 0  # data[:copied] is in `out` already
    field_start = 0
    try:
        for number, wire, start, end in _fields(data, 0, len(data), limit):
            rewrite = rewrites.get(number) if wire == LEN else None
            if rewrite is not None:
                out += data[copied:field_start]
                payload = rewrite(data[start:end])
                if payload is not None:
                    out += _len_field(number, payload)
                copied = end
            field_start = end  # every field's tuple ends with the offset where it ends
    except Malformed as exc:
        raise _malformed(exc) from None
    if copied == 0:
        return data
    out += data[copied:]
    return bytes(out)
