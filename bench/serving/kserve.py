"""The KServe v2 (Open Inference Protocol) request and response bodies, JSON and with Triton's binary tensor
extension, both ways: what a client sends and reads, and what the hand-rolled servers read and send. numpy and the
standard library only; tensors FP32, INT64 and BYTES (the three the workloads use).

Binary extension: the body is a JSON header followed by the raw tensors; the `Inference-Header-Content-Length`
header gives the JSON part's length, and each tensor's `parameters.binary_data_size` its raw length. A BYTES tensor
is raw as, per element, a 4-byte little-endian length and the bytes.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"
_DTYPES = {"FP32": np.float32, "INT64": np.int64, "BYTES": np.object_}


def datatype(array: np.ndarray) -> str:
    if array.dtype == np.float32:
        return "FP32"
    if array.dtype == np.int64:
        return "INT64"
    if array.dtype == np.object_ or array.dtype.kind in "SU":
        return "BYTES"
    raise ValueError(f"unsupported dtype {array.dtype}")


def to_raw(array: np.ndarray) -> bytes:
    if datatype(array) != "BYTES":
        return np.ascontiguousarray(array).tobytes()
    parts = []
    for item in array.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode()
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def from_raw(raw: bytes | memoryview, dtype: str, shape: list[int]) -> np.ndarray:
    if dtype != "BYTES":
        return np.frombuffer(raw, dtype=_DTYPES[dtype]).reshape(shape)
    items: list[bytes] = []
    offset = 0
    while offset < len(raw):
        (length,) = struct.unpack_from("<I", raw, offset)
        items.append(bytes(raw[offset + 4:offset + 4 + length]))
        offset += 4 + length
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array.reshape(shape)


def _from_json(data: list[Any], dtype: str, shape: list[int]) -> np.ndarray:
    if dtype == "BYTES":
        array = np.empty(len(data), dtype=np.object_)
        array[:] = [d.encode() if isinstance(d, str) else bytes(d) for d in data]
        return array.reshape(shape)
    return np.asarray(data, dtype=_DTYPES[dtype]).reshape(shape)


def _to_json(array: np.ndarray) -> list[Any]:
    if datatype(array) == "BYTES":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
    return array.reshape(-1).tolist()  # type: ignore[no-any-return]


def _tensors(header: dict[str, Any], key: str, binary: memoryview) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    offset = 0
    for spec in header.get(key, []):
        size = spec.get("parameters", {}).get("binary_data_size")
        if size is not None:
            tensors[spec["name"]] = from_raw(binary[offset:offset + size], spec["datatype"], spec["shape"])
            offset += size
        else:
            tensors[spec["name"]] = _from_json(spec["data"], spec["datatype"], spec["shape"])
    return tensors


def _split(body: bytes, header_length: str | int | None) -> tuple[dict[str, Any], memoryview]:
    if header_length is None or header_length == "":
        return json.loads(body), memoryview(b"")
    length = int(header_length)
    return json.loads(body[:length]), memoryview(body)[length:]


def _body(header: dict[str, Any], key: str,
          tensors: list[tuple[str, np.ndarray, bool]]) -> tuple[bytes, dict[str, str]]:
    specs, blobs = [], []
    for name, array, binary in tensors:
        spec: dict[str, Any] = {"name": name, "datatype": datatype(array), "shape": list(array.shape)}
        if binary:
            raw = to_raw(array)
            spec["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            spec["data"] = _to_json(array)
        specs.append(spec)
    encoded = json.dumps({**header, key: specs}).encode()
    if not blobs:
        return encoded, {"Content-Type": "application/json"}
    return encoded + b"".join(blobs), {HEADER_LENGTH: str(len(encoded)), "Content-Type": "application/octet-stream"}


# --- the client's side ---------------------------------------------------------------------------------------


def encode_request(inputs: dict[str, np.ndarray], outputs: list[str],
                   binary: bool = True) -> tuple[bytes, dict[str, str]]:
    """A request body and its headers: every input (binary or JSON) and the outputs to send back (the same)."""
    header = {"outputs": [{"name": o, "parameters": {"binary_data": binary}} for o in outputs]}
    return _body(header, "inputs", [(name, array, binary) for name, array in inputs.items()])


def decode_response(body: bytes, headers: Any) -> dict[str, np.ndarray]:
    header, binary = _split(body, headers.get(HEADER_LENGTH))
    if "error" in header:
        raise ValueError(header["error"])
    return _tensors(header, "outputs", binary)


# --- the server's side ---------------------------------------------------------------------------------------


def decode_request(body: bytes,
                   header_length: str | int | None) -> tuple[dict[str, np.ndarray], list[tuple[str, bool]]]:
    """The inputs, and the outputs asked for with whether each goes back binary (empty: all outputs, JSON)."""
    header, binary = _split(body, header_length)
    requested = [(o["name"], bool(o.get("parameters", {}).get("binary_data", False)))
                 for o in header.get("outputs", [])]
    return _tensors(header, "inputs", binary), requested


def encode_response(model: str, outputs: dict[str, np.ndarray],
                    requested: list[tuple[str, bool]]) -> tuple[bytes, dict[str, str]]:
    chosen = requested or [(name, False) for name in outputs]
    return _body({"model_name": model, "model_version": "1"}, "outputs",
                 [(name, outputs[name], binary) for name, binary in chosen])


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()
