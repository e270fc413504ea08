"""ONNX: a protobuf ModelProto, served by onnxruntime on Kubernetes and by a python-backend wrapper locally.

Detection walks the top-level fields with the protobuf wire format (tag, then a varint or a length to skip), so only
a few bytes are read even from a 2 GB file; every field must be one ModelProto defines, with its wire type,
`ir_version` (1) and `graph` (7) must be there and the walk must end exactly at the end of the file. Random bytes and
other formats fail within the first few bytes. The full parse is `onnx_inspect.inspect_onnx`'s job.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from modelport.core import archives
from modelport.core.formats.base import (
    BACKENDS_DIR,
    BATCHING_MODULE,
    Format,
    Inspected,
    LocalServing,
    NativeBackend,
    register,
)
from modelport.core.signature import Signature

NAME = "onnx"
_MAX_TOP_LEVEL_FIELDS = 1_000_000
# ModelProto's top-level fields and their wire types (0 varint, 2 length-delimited), onnx.proto.
_MODEL_PROTO_FIELDS = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2, 26: 2}


def _read_varint(fh: BinaryIO, first: bytes | None = None) -> int | None:
    """A protobuf varint from a binary file, or None at a clean end of file / on a malformed varint."""
    result = 0
    for shift in range(0, 70, 7):
        byte = first if (first is not None and shift == 0) else fh.read(1)
        if not byte:
            return None
        value = byte[0]
        result |= (value & 0x7F) << shift
        if not value & 0x80:
            return result
    return None


@dataclass(frozen=True)
class _Walk:
    shaped: bool  # every top-level field one ModelProto defines, ending exactly at the end of the file
    fields: frozenset[int]
    cut_off_at: int | None = None  # the walk was well-formed until a field ran past the end of the file
    needed: int = 0  # the bytes that field needed from there


def _walk(path: Path) -> _Walk:
    """The top-level fields of a ModelProto-shaped file (see the module docstring), read field by field."""
    size = path.stat().st_size
    seen: set[int] = set()
    with open(path, "rb") as fh:
        for _ in range(_MAX_TOP_LEVEL_FIELDS):
            first = fh.read(1)
            if not first:
                return _Walk(shaped=True, fields=frozenset(seen))
            tag = _read_varint(fh, first)
            if tag is None:
                return _Walk(shaped=False, fields=frozenset(seen))
            field, wire_type = tag >> 3, tag & 0x7
            if _MODEL_PROTO_FIELDS.get(field) != wire_type:
                return _Walk(shaped=False, fields=frozenset(seen))
            value = _read_varint(fh)
            if value is None:
                at_end = fh.tell() >= size
                return _Walk(shaped=False, fields=frozenset(seen), cut_off_at=size if at_end and seen else None)
            if wire_type == 2:
                end = fh.tell() + value
                if end > size:
                    return _Walk(shaped=False, fields=frozenset(seen), cut_off_at=size, needed=end - size)
                fh.seek(end)
            elif field == 1 and not 1 <= value <= 100:
                return _Walk(shaped=False, fields=frozenset(seen))  # ir_version: 1 (2017) to 14 (2025) so far
            seen.add(field)
    return _Walk(shaped=False, fields=frozenset(seen))


def looks_like_onnx(path: Path) -> bool:
    """Whether the file is shaped like a serialized onnx.ModelProto (see the module docstring)."""
    walk = _walk(Path(path))
    return walk.shaped and {1, 7} <= walk.fields


def cut_off_onnx(path: Path) -> tuple[int, int] | None:
    """(its size, the bytes missing) for a file that is a ModelProto until it stops mid-field: an upload or a copy
    cut short. It must have begun with a valid `ir_version`, as every exporter writes first, so that random bytes
    whose first byte happens to be a tag are not called ONNX."""
    walk = _walk(Path(path))
    if walk.cut_off_at is None or 1 not in walk.fields:
        return None
    return walk.cut_off_at, walk.needed


def inspect(path: Path, declared: Signature | None, limits: archives.ArchiveLimits) -> Inspected:
    """The signature from the graph; a declared one must agree with it. Raises InspectionError."""
    from modelport.core.formats.onnx_inspect import InspectionError, inspect_onnx, validate_declared_signature

    result = inspect_onnx(path)
    if result.problems:
        raise InspectionError("onnx.checker found problems: " + "; ".join(result.problems))
    if declared is not None and not declared.is_empty:
        mismatches = validate_declared_signature(declared, result.signature)
        if mismatches:
            raise InspectionError("The declared signature does not match the model: " + "; ".join(mismatches))
    return Inspected(signature=result.signature, batchable=result.has_batch_dim,
                     max_batch_size_hint=result.max_batch_size_hint)


def write_artifact(artifact: Path, version_dir: Path, scratch: Path, limits: archives.ArchiveLimits) -> None:
    shutil.copyfile(artifact, version_dir / "model.onnx")


FORMAT = register(Format(
    name=NAME,
    label="ONNX",
    short_label="ONNX",
    plural="ONNX",
    description="an ONNX model",
    upload_as="the .onnx file",
    needs_signature=False,
    native=NativeBackend(backend="onnxruntime"),
    local=LocalServing(wrapper=BACKENDS_DIR / "onnx_python_model.py", modules=(BATCHING_MODULE,)),
    extensions=("onnx",),
    detect_order=20,  # after the TensorRT plan's tag check: a plan is never shaped like a ModelProto
    detect_file=looks_like_onnx,
    inspect=inspect,
    write_artifact=write_artifact,
))
