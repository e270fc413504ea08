"""Which model format a file is, judged from its content.

The uploader also declares a format and a file name; neither proves anything, so the portal detects the format
from the bytes and refuses a declaration that contradicts them (`check_declared_format`).

What is looked at, per format:
- ONNX: a protobuf ModelProto. The top-level fields are walked with the protobuf wire format (tag, then a varint or
  a length to skip), so only a few bytes are read even from a 2 GB file; every field must be one ModelProto
  defines, with its wire type, `ir_version` (1) and `graph` (7) must be there and the walk must end exactly at the
  end of the file. Random bytes and other formats fail within the first few bytes. The full parse is
  `onnx_inspect.inspect_onnx`'s job.
- TensorRT plan: an undocumented serialized engine. Engines start with the tag "ptrt" or "ftrt"; some exporters
  (Ultralytics) put a little-endian uint32 length and a JSON metadata blob in front of it. This follows what the
  Netron viewer checks (source/tensorrt.js); it is a heuristic and kept explicit here.
- Archives (zip, tar, tar.gz) are recognised by their entry names (and model.py's text):
  TorchScript: a zip with `<top>/data.pkl` and `<top>/constants.pkl` or `<top>/code/` (torch.jit.save's layout;
  a plain torch.save checkpoint has data.pkl but neither of the others, and is not servable by Triton).
  python: `model.py` at the top or under one folder, defining `class TritonPythonModel`.
  TensorFlow SavedModel: `saved_model.pb` or `saved_model.pbtxt` at the top or under one folder.
  TNN: exactly one `.tnnproto` and one `.tnnmodel`.
"""

from __future__ import annotations

import lzma
import re
import struct
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO

from models_registry import archives

# The values of models_registry.models.Format, repeated here so this module needs no Django (a test keeps the
# two in step).
ONNX = "onnx"
TORCHSCRIPT = "torchscript"
SAVEDMODEL = "tensorflow_savedmodel"
TENSORRT = "tensorrt_plan"
PYTHON = "python"
TNN = "tnn"
ENSEMBLE = "ensemble"

# Finishes "declared format 'x' but the file looks like ...".
DESCRIPTIONS: dict[str, str] = {
    ONNX: "an ONNX model",
    TORCHSCRIPT: "a TorchScript archive",
    SAVEDMODEL: "a TensorFlow SavedModel",
    TENSORRT: "a TensorRT plan",
    PYTHON: "a Triton python model",
    TNN: "a TNN model",
    ENSEMBLE: "a pipeline",
}

# Formats whose artifact carries no signature the portal can read: the uploader declares it.
FORMATS_NEEDING_SIGNATURE: frozenset[str] = frozenset({TORCHSCRIPT, TENSORRT, PYTHON, TNN})

_MODEL_PY_MAX_BYTES = 4 * 1024 * 1024
_ONNX_MAX_TOP_LEVEL_FIELDS = 1_000_000
_TRT_TAGS = (b"ptrt", b"ftrt")
_TRITON_PYTHON_CLASS = re.compile(rb"^class\s+TritonPythonModel\b", re.MULTILINE)
# ModelProto's top-level fields and their wire types (0 varint, 2 length-delimited), onnx.proto.
_MODEL_PROTO_FIELDS = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2, 26: 2}


class FormatError(ValueError):
    """A declared format that the file contradicts; the message is shown to the uploader."""


def formats_needing_signature() -> frozenset[str]:
    return FORMATS_NEEDING_SIGNATURE


def describe(fmt: str | None) -> str:
    return DESCRIPTIONS.get(fmt or "", "a file of no supported model format")


def detect_format(path: Path, filename: str = "", *, limits: archives.ArchiveLimits | None = None) -> str | None:
    """The format of the file at `path` from its content, or None when it is none of the supported formats.

    Raises archives.ArchiveError for an archive that is refused outright (a link, a path climbing out, a corrupt
    directory, more than `limits.max_entries` entries): its message says more than "not a model" would.
    Archives are listed, never extracted; pass the real limits to also refuse bombs here.

    `filename` is accepted for callers that have one but deliberately not used: the uploader chooses it, so it
    proves nothing, and content that fits no format is not made to fit by its name.
    """
    path = Path(path)
    if not path.is_file():
        return None
    kind = archives.archive_kind(path)
    if kind is not None:
        return _detect_archive_format(path, kind, limits or archives.LISTING_LIMITS)
    if looks_like_tensorrt_plan(path):
        return TENSORRT
    if looks_like_onnx(path):
        return ONNX
    return None


def check_declared_format(declared: str, detected: str | None) -> None:
    """FormatError unless the detected format agrees with the declared one ("" declares nothing)."""
    if declared == ENSEMBLE:
        raise FormatError("a pipeline is defined by its steps, not uploaded as a file")
    if not declared:
        if detected is None:
            supported = ", ".join(DESCRIPTIONS[f] for f in (ONNX, TORCHSCRIPT, SAVEDMODEL, TENSORRT, PYTHON, TNN))
            raise FormatError(f"the file's format could not be recognised: upload {supported}")
        return
    if declared not in DESCRIPTIONS:
        raise FormatError(f"unknown format {declared!r}")
    if detected == declared:
        return
    if detected is None:
        raise FormatError(f"declared format {declared!r} but the file does not look like {describe(declared)}")
    raise FormatError(f"declared format {declared!r} but the file looks like {describe(detected)}")


# --- ONNX ------------------------------------------------------------------------------------------------------


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


def looks_like_onnx(path: Path) -> bool:
    """Whether the file is shaped like a serialized onnx.ModelProto (see the module docstring)."""
    path = Path(path)
    size = path.stat().st_size
    seen: set[int] = set()
    with open(path, "rb") as fh:
        for _ in range(_ONNX_MAX_TOP_LEVEL_FIELDS):
            first = fh.read(1)
            if not first:
                break
            tag = _read_varint(fh, first)
            if tag is None:
                return False
            field, wire_type = tag >> 3, tag & 0x7
            if _MODEL_PROTO_FIELDS.get(field) != wire_type:
                return False
            value = _read_varint(fh)
            if value is None:
                return False
            if wire_type == 2:
                end = fh.tell() + value
                if end > size:
                    return False
                fh.seek(end)
            elif field == 1 and not 1 <= value <= 100:
                return False  # ir_version: 1 (2017) to 14 (2025) so far
            seen.add(field)
        else:
            return False
    return {1, 7} <= seen


# --- TensorRT --------------------------------------------------------------------------------------------------


def looks_like_tensorrt_plan(path: Path) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(4096)
    if len(head) < 24:
        return False
    if head[:4] in _TRT_TAGS:
        return True
    # A length-prefixed JSON metadata blob in front of the engine (Ultralytics' export).
    meta_len = struct.unpack("<I", head[:4])[0]
    start = 4 + meta_len
    return head[4:5] == b"{" and start + 4 <= len(head) and head[start : start + 4] in _TRT_TAGS


# --- Archives --------------------------------------------------------------------------------------------------


def _detect_archive_format(path: Path, kind: str, limits: archives.ArchiveLimits) -> str | None:
    entries = archives.check_archive(path, limits)
    names = archives.model_names([entry.name for entry in entries if not entry.is_dir])
    all_names = archives.model_names([entry.name for entry in entries])

    if kind == "zip" and _is_torchscript_layout(all_names):
        return TORCHSCRIPT
    model_py = archives.marker_path(names, "model.py")
    if model_py is not None:
        try:
            source = archives.read_entry(path, model_py, _MODEL_PY_MAX_BYTES)
        except (zipfile.BadZipFile, archives.ArchiveError, EOFError, zlib.error, lzma.LZMAError, OSError, KeyError):
            source = b""
        if _TRITON_PYTHON_CLASS.search(source):
            return PYTHON
    if archives.marker_path(names, "saved_model.pb") or archives.marker_path(names, "saved_model.pbtxt"):
        return SAVEDMODEL
    protos = [n for n in names if n.endswith(".tnnproto")]
    weights = [n for n in names if n.endswith(".tnnmodel")]
    if len(protos) == 1 and len(weights) == 1:
        return TNN
    return None


def _is_torchscript_layout(names: list[str]) -> bool:
    top = archives.single_top_folder(names)
    if top is None:
        return False
    has_code = any(n.startswith(f"{top}/code/") or n == f"{top}/code" for n in names)
    return f"{top}/data.pkl" in names and (f"{top}/constants.pkl" in names or has_code)
