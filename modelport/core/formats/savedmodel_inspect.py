"""The signature of a TensorFlow SavedModel, read from saved_model.pb without TensorFlow and without running it.

saved_model.pb is a protobuf `SavedModel` message (tensorflow/core/protobuf/saved_model.proto and meta_graph.proto).
Only the fields needed here are declared below, by their numbers in TensorFlow's schema, in a private descriptor
pool: protobuf skips every other field (the graph, the functions, the saver), so the portal reads the signatures of
any SavedModel without importing TensorFlow, in the worker that inspects uploads, and the bytes are only parsed,
never executed. The file is read whole, up to SAVED_MODEL_PB_MAX_BYTES (weights live in variables/, so the graph
file is small unless constants were folded into it).

What is served is one SignatureDef of the MetaGraph tagged exactly {"serve"} (what tf.saved_model.save and Keras'
export write, and what Triton's TensorFlow backend loads): "serving_default" when there is one, else the only
signature. Its input and output keys are the tensor names, as for Triton's TensorFlow backend and the local wrapper
(modelport/core/backends/savedmodel_python_model.py).
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf.message import DecodeError, Message

from modelport.core import archives
from modelport.core.datatypes import TF_TO_KSERVE
from modelport.core.definitions import SavedModelDefinition
from modelport.core.errors import ArtifactRejected
from modelport.core.formats.base import InspectionError, archive_names, read_archive_entry
from modelport.core.formats.onnx_inspect import validate_declared_signature
from modelport.core.signature import Signature, SignatureError, parse_signature

SAVED_MODEL_PB_MAX_BYTES = 256 * 1024 * 1024
SERVE_TAG = "serve"
DEFAULT_SIGNATURE = "serving_default"
# Bounds on what a hostile file can make the portal store and show.
MAX_TENSORS = 1024
MAX_RANK = 32
MAX_KEY_CHARS = 256

# tensorflow/core/framework/types.proto DataType -> KServe v2 datatype (TF_TO_KSERVE, from modelport.core.datatypes);
# the others Triton cannot serve.
_TF_DATATYPES = [
    "DT_INVALID", "DT_FLOAT", "DT_DOUBLE", "DT_INT32", "DT_UINT8", "DT_INT16", "DT_INT8", "DT_STRING",
    "DT_COMPLEX64", "DT_INT64", "DT_BOOL", "DT_QINT8", "DT_QUINT8", "DT_QINT32", "DT_BFLOAT16", "DT_QINT16",
    "DT_QUINT16", "DT_UINT16", "DT_COMPLEX128", "DT_HALF", "DT_RESOURCE", "DT_VARIANT", "DT_UINT32", "DT_UINT64",
    "DT_FLOAT8_E5M2", "DT_FLOAT8_E4M3FN", "DT_FLOAT8_E4M3FNUZ", "DT_FLOAT8_E4M3B11FNUZ", "DT_FLOAT8_E5M2FNUZ",
    "DT_INT4", "DT_UINT4", "DT_INT2", "DT_UINT2", "DT_FLOAT4_E2M1FN",
]  # fmt: skip

_F = descriptor_pb2.FieldDescriptorProto


def _field(message: descriptor_pb2.DescriptorProto, name: str, number: int, kind: int, *,
           type_name: str = "", repeated: bool = False) -> None:
    field = message.field.add(name=name, number=number, type=kind,
                              label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if type_name:
        field.type_name = type_name


def _map(message: descriptor_pb2.DescriptorProto, name: str, number: int, value_type: str) -> None:
    entry = message.nested_type.add(name="".join(p.capitalize() for p in name.split("_")) + "Entry")
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING)
    _field(entry, "value", 2, _F.TYPE_MESSAGE, type_name=value_type)
    _field(message, name, number, _F.TYPE_MESSAGE, type_name=f".{_PACKAGE}.{message.name}.{entry.name}", repeated=True)


_PACKAGE = "modelport.savedmodel_subset"


def _message_classes() -> dict[str, type[Message]]:
    """The subset of TensorFlow's SavedModel schema read here (proto2: presence of the oneof members is visible)."""
    p = f".{_PACKAGE}."
    f = descriptor_pb2.FileDescriptorProto(name="modelport_savedmodel_subset.proto", package=_PACKAGE, syntax="proto2")
    data_type = f.enum_type.add(name="DataType")
    for number, name in enumerate(_TF_DATATYPES):
        data_type.value.add(name=name, number=number)
    dim = f.message_type.add(name="Dim")
    _field(dim, "size", 1, _F.TYPE_INT64)
    _field(dim, "name", 2, _F.TYPE_STRING)
    shape = f.message_type.add(name="TensorShapeProto")
    _field(shape, "dim", 2, _F.TYPE_MESSAGE, type_name=f"{p}Dim", repeated=True)
    _field(shape, "unknown_rank", 3, _F.TYPE_BOOL)
    info = f.message_type.add(name="TensorInfo")
    _field(info, "name", 1, _F.TYPE_STRING)
    _field(info, "dtype", 2, _F.TYPE_ENUM, type_name=f"{p}DataType")
    _field(info, "tensor_shape", 3, _F.TYPE_MESSAGE, type_name=f"{p}TensorShapeProto")
    _field(info, "coo_sparse", 4, _F.TYPE_BYTES)  # messages in TensorFlow's schema; only their presence matters
    _field(info, "composite_tensor", 5, _F.TYPE_BYTES)
    signature = f.message_type.add(name="SignatureDef")
    _map(signature, "inputs", 1, f"{p}TensorInfo")
    _map(signature, "outputs", 2, f"{p}TensorInfo")
    _field(signature, "method_name", 3, _F.TYPE_STRING)
    meta_info = f.message_type.add(name="MetaInfoDef")
    _field(meta_info, "tags", 4, _F.TYPE_STRING, repeated=True)
    _field(meta_info, "tensorflow_version", 5, _F.TYPE_STRING)
    meta_graph = f.message_type.add(name="MetaGraphDef")
    _field(meta_graph, "meta_info_def", 1, _F.TYPE_MESSAGE, type_name=f"{p}MetaInfoDef")
    _map(meta_graph, "signature_def", 5, f"{p}SignatureDef")
    saved_model = f.message_type.add(name="SavedModel")
    _field(saved_model, "saved_model_schema_version", 1, _F.TYPE_INT64)
    _field(saved_model, "meta_graphs", 2, _F.TYPE_MESSAGE, type_name=f"{p}MetaGraphDef", repeated=True)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
            for name in ("SavedModel", "MetaGraphDef", "SignatureDef", "TensorInfo")}


_CLASSES = _message_classes()
SavedModelProto = _CLASSES["SavedModel"]


@dataclass(frozen=True)
class SavedModelInspection:
    signature: Signature
    signature_def: str  # the key of the SignatureDef served
    signature_defs: list[str]  # every servable key of the "serve" MetaGraph
    tensorflow_version: str  # the version that wrote it, "" when it does not say

    @property
    def definition(self) -> SavedModelDefinition:
        """What is stored as the version's `definition`, for the renderer (TF_SIGNATURE_DEF)."""
        return SavedModelDefinition(signature_def=self.signature_def, signature_defs=tuple(self.signature_defs))


def parse_saved_model(data: bytes, *, text: bool = False) -> Any:
    message = SavedModelProto()
    try:
        if text:
            text_format.Parse(data.decode("utf-8"), message, allow_unknown_field=True, allow_unknown_extension=True)
        else:
            message.ParseFromString(data)
    except (DecodeError, text_format.ParseError, UnicodeDecodeError, RecursionError) as exc:
        raise InspectionError(f"saved_model.pb{'txt' if text else ''} is not a SavedModel: {exc}") from None
    return message


def _tensor(key: str, info: Any, where: str) -> dict[str, Any]:
    if info.HasField("coo_sparse") or info.HasField("composite_tensor"):
        raise InspectionError(f"{where} '{key}' is a sparse or composite tensor: Triton serves dense tensors only")
    if not info.HasField("dtype"):
        raise InspectionError(f"{where} '{key}' has a datatype this portal does not know")
    dtype = _TF_DATATYPES[info.dtype]
    if dtype not in TF_TO_KSERVE:
        raise InspectionError(f"{where} '{key}' is {dtype}, which Triton cannot serve")
    shape = info.tensor_shape
    if not info.HasField("tensor_shape") or shape.unknown_rank:
        raise InspectionError(f"{where} '{key}' has an unknown rank: export it with a shape (None for any size)")
    if len(shape.dim) > MAX_RANK:
        raise InspectionError(f"{where} '{key}' has {len(shape.dim)} dimensions, more than {MAX_RANK}")
    dims = []
    for dim in shape.dim:
        if dim.size == 0 or dim.size < -1:
            raise InspectionError(f"{where} '{key}' has a dimension of size {dim.size}")
        dims.append(int(dim.size))
    return {"name": key, "datatype": TF_TO_KSERVE[dtype], "dims": dims}


def read_signature(saved_model: Any) -> SavedModelInspection:
    """The served signature of a parsed SavedModel; InspectionError with what to fix otherwise."""
    graphs = [g for g in saved_model.meta_graphs if set(g.meta_info_def.tags) == {SERVE_TAG}]
    if not graphs:
        tag_sets = sorted(sorted(g.meta_info_def.tags) for g in saved_model.meta_graphs)
        raise InspectionError(
            f"the SavedModel has no MetaGraph tagged only {SERVE_TAG!r} (it has {tag_sets}): export it with "
            "tf.saved_model.save or Keras' model.export()"
        )
    graph = graphs[0]
    # Keys starting "__" (such as "__saved_model_init_op") are TensorFlow's own, not functions to serve.
    keys = sorted(k for k in graph.signature_def if not k.startswith("__"))
    if DEFAULT_SIGNATURE in keys:
        key = DEFAULT_SIGNATURE
    elif len(keys) == 1:
        key = keys[0]
    elif not keys:
        raise InspectionError("the SavedModel has no signature to serve: save it with signatures=... ")
    else:
        shown = ", ".join(repr(k[:MAX_KEY_CHARS]) for k in keys[:20])
        raise InspectionError(
            f"the SavedModel has several signatures ({shown}) and none is {DEFAULT_SIGNATURE!r}: "
            f"export the one to serve as {DEFAULT_SIGNATURE!r}"
        )
    signature_def = graph.signature_def[key]
    if len(signature_def.inputs) + len(signature_def.outputs) > MAX_TENSORS:
        raise InspectionError(f"signature {key!r} has more than {MAX_TENSORS} inputs and outputs")
    if any(len(k) > MAX_KEY_CHARS for k in list(signature_def.inputs) + list(signature_def.outputs)):
        raise InspectionError(f"signature {key!r} has a tensor name longer than {MAX_KEY_CHARS} characters")
    raw = {
        "inputs": [_tensor(k, signature_def.inputs[k], "input") for k in sorted(signature_def.inputs)],
        "outputs": [_tensor(k, signature_def.outputs[k], "output") for k in sorted(signature_def.outputs)],
    }
    try:
        signature = parse_signature(raw)
    except SignatureError as exc:
        raise InspectionError(f"signature {key!r} cannot be served: {exc}") from None
    return SavedModelInspection(
        signature=signature,
        signature_def=key,
        signature_defs=[k[:MAX_KEY_CHARS] for k in keys[:100]],
        tensorflow_version=graph.meta_info_def.tensorflow_version[:40],
    )


def inspect_savedmodel_archive(path: Path | str, limits: archives.ArchiveLimits | None = None) -> SavedModelInspection:
    """The served signature of the SavedModel in an uploaded archive (zip or tar of the SavedModel directory)."""
    path = Path(path)
    names = archive_names(path, limits)
    binary_root = archives.model_root(names, "saved_model.pb")
    text_root = archives.model_root(names, "saved_model.pbtxt") if binary_root is None else None
    if binary_root is None and text_root is None:
        raise InspectionError(
            "the archive has no saved_model.pb at its top level or inside its single top folder: zip the "
            "SavedModel directory itself"
        )
    root = binary_root if binary_root is not None else text_root
    name = ("saved_model.pb" if binary_root is not None else "saved_model.pbtxt")
    member = f"{root}/{name}" if root else name
    try:
        data = read_archive_entry(path, member, SAVED_MODEL_PB_MAX_BYTES)
    except (zipfile.BadZipFile, EOFError, zlib.error, OSError, KeyError) as exc:
        raise InspectionError(f"the archive could not be read ({exc})") from None
    return read_signature(parse_saved_model(data, text=binary_root is None))


def savedmodel_findings(path: Path, declared: Signature | None,
                        limits: archives.ArchiveLimits) -> tuple[Signature, SavedModelDefinition]:
    """For inspection: the signature read from the upload (a declared one must agree with it) and the version's
    definition; ArtifactRejected with what to fix otherwise. `limits`: the operator's archive limits."""
    try:
        found = inspect_savedmodel_archive(path, limits)
    except InspectionError as exc:
        raise ArtifactRejected(str(exc)) from None
    if declared is not None and not declared.is_empty:
        mismatches = validate_declared_signature(declared, found.signature)
        if mismatches:
            raise ArtifactRejected("The declared signature does not match the model: " + "; ".join(mismatches))
    return found.signature, found.definition
