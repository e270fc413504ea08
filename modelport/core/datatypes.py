"""The one table of tensor datatypes: every name a datatype goes by, and what one element takes.

The portal stores and shows KServe v2 names ("FP32"); Triton's config wants its own ("TYPE_FP32"); ONNX and
TensorFlow graphs carry theirs ("FLOAT", "DT_FLOAT"); code that builds arrays wants numpy's. Every module that
translates between them (signature parsing, inspection, the trial run, the gateway's size checks, the web forms)
reads this table, so a datatype is added or corrected in one place. Plain Python, no Django: the gateway uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["float", "int", "uint", "bool", "bytes"]


@dataclass(frozen=True)
class Datatype:
    kserve: str  # KServe v2 / Triton protocol name: what the portal stores
    triton: str  # Triton's model config DataType name
    numpy: str | None  # numpy dtype name; None where numpy has none (bfloat16)
    # Bytes per element on the wire; BYTES elements vary (each a 4-byte length and its bytes), 4 is their least.
    size: int
    kind: Kind
    onnx: str  # onnx.TensorProto.DataType name
    tensorflow: str  # tensorflow/core/framework/types.proto DataType name


# KServe v2's order (the protocol's table), which messages listing the accepted names follow.
DATATYPES: tuple[Datatype, ...] = (
    Datatype("BOOL", "TYPE_BOOL", "bool", 1, "bool", "BOOL", "DT_BOOL"),
    Datatype("UINT8", "TYPE_UINT8", "uint8", 1, "uint", "UINT8", "DT_UINT8"),
    Datatype("UINT16", "TYPE_UINT16", "uint16", 2, "uint", "UINT16", "DT_UINT16"),
    Datatype("UINT32", "TYPE_UINT32", "uint32", 4, "uint", "UINT32", "DT_UINT32"),
    Datatype("UINT64", "TYPE_UINT64", "uint64", 8, "uint", "UINT64", "DT_UINT64"),
    Datatype("INT8", "TYPE_INT8", "int8", 1, "int", "INT8", "DT_INT8"),
    Datatype("INT16", "TYPE_INT16", "int16", 2, "int", "INT16", "DT_INT16"),
    Datatype("INT32", "TYPE_INT32", "int32", 4, "int", "INT32", "DT_INT32"),
    Datatype("INT64", "TYPE_INT64", "int64", 8, "int", "INT64", "DT_INT64"),
    Datatype("FP16", "TYPE_FP16", "float16", 2, "float", "FLOAT16", "DT_HALF"),
    Datatype("FP32", "TYPE_FP32", "float32", 4, "float", "FLOAT", "DT_FLOAT"),
    Datatype("FP64", "TYPE_FP64", "float64", 8, "float", "DOUBLE", "DT_DOUBLE"),
    Datatype("BF16", "TYPE_BF16", None, 2, "float", "BFLOAT16", "DT_BFLOAT16"),
    Datatype("BYTES", "TYPE_STRING", "object", 4, "bytes", "STRING", "DT_STRING"),
)

BY_KSERVE: dict[str, Datatype] = {d.kserve: d for d in DATATYPES}

KSERVE_TO_TRITON: dict[str, str] = {d.kserve: d.triton for d in DATATYPES}
TRITON_TO_KSERVE: dict[str, str] = {d.triton: d.kserve for d in DATATYPES}
# For code that builds arrays from a signature; datatypes numpy cannot hold are absent.
KSERVE_TO_NUMPY: dict[str, str] = {d.kserve: d.numpy for d in DATATYPES if d.numpy is not None}
SIZES: dict[str, int] = {d.kserve: d.size for d in DATATYPES}
FLOAT_TYPES: frozenset[str] = frozenset(d.kserve for d in DATATYPES if d.kind == "float")
ONNX_TO_KSERVE_NAMES: dict[str, str] = {d.onnx: d.kserve for d in DATATYPES}
TF_TO_KSERVE: dict[str, str] = {d.tensorflow: d.kserve for d in DATATYPES}

_KIND_ORDER: tuple[Kind, ...] = ("float", "int", "uint", "bool", "bytes")
# The order a form offers them in: FP32 first (the usual one, and the default choice), then by kind.
FORM_ORDER: tuple[str, ...] = tuple(
    d.kserve for d in sorted(DATATYPES, key=lambda d: (_KIND_ORDER.index(d.kind), d.kserve != "FP32"))
)
