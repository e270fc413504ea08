"""Python models for Triton's python backend: `model.py` defining `class TritonPythonModel`, at the top of an
archive or in its one folder, with an optional requirements.txt. Served by the python backend on both targets.
The code is untrusted: inspection parses it with `ast` and never imports it (models_registry.onnx_inspect)."""

from __future__ import annotations

import lzma
import re
import zipfile
import zlib
from pathlib import Path

from models_registry import archives
from models_registry.formats.base import (
    ArchiveListing,
    Format,
    Inspected,
    LayoutError,
    NativeBackend,
    extract,
    register,
)
from models_registry.signature import Signature

NAME = "python"
_MODEL_PY_MAX_BYTES = 4 * 1024 * 1024
_TRITON_PYTHON_CLASS = re.compile(rb"^class\s+TritonPythonModel\b", re.MULTILINE)


def detect_archive(listing: ArchiveListing) -> bool:
    model_py = archives.marker_path(listing.files, "model.py")
    if model_py is None:
        return False
    try:
        source = archives.read_entry(listing.path, model_py, _MODEL_PY_MAX_BYTES)
    except (zipfile.BadZipFile, archives.ArchiveError, EOFError, zlib.error, lzma.LZMAError, OSError, KeyError):
        source = b""
    return bool(_TRITON_PYTHON_CLASS.search(source))


def inspect(path: Path, declared: Signature | None, limits: archives.ArchiveLimits) -> Inspected:
    from models_registry.onnx_inspect import inspect_python_archive

    info = inspect_python_archive(path, limits)
    signature = declared or Signature()
    return Inspected(signature=signature, batchable=signature.has_batch_dim,
                     definition={"requirements": info.requirements})


def write_artifact(artifact: Path, version_dir: Path, scratch: Path, limits: archives.ArchiveLimits) -> None:
    extract(artifact, scratch, limits)
    root = archives.extracted_root(scratch, "model.py")
    if root is None:
        raise LayoutError("the archive must hold model.py at its top level (or in its only directory)")
    for child in sorted(root.iterdir()):
        child.rename(version_dir / child.name)


FORMAT = register(Format(
    name=NAME,
    label="Python (Triton python backend)",
    short_label="Python",
    plural="Python models",
    description="a Triton python model",
    needs_signature=True,
    native=NativeBackend(backend="python"),
    detect_order=20,
    detect_archive=detect_archive,
    inspect=inspect,
    write_artifact=write_artifact,
))
