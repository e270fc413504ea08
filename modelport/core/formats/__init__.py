"""The model formats the portal knows: one module per format, each registering a `Format` (base.py) that says how
to recognise it, inspect it and lay it out for each target, and this module's checks on an upload.

The uploader also declares a format and a file name; neither proves anything, so the portal detects the format
from the bytes and refuses a declaration that contradicts them (`check_declared_format`). What each format looks
at is in its module's docstring: onnx.py, tensorrt.py (single files); torchscript.py, python.py, savedmodel.py,
tnn.py (archives, recognised by their entry names without extracting them); ensemble.py (pipelines, never a file).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from modelport.core import archives
from modelport.core.definitions import Definition, DefinitionError

# Importing the format modules registers them (base.register).
from modelport.core.formats import ensemble, onnx, python, savedmodel, tensorrt, tnn, torchscript
from modelport.core.formats.base import DEFAULT_MAX_BATCH_SIZE, REGISTERED, ArchiveListing, Format, LayoutError

# The order formats are listed in to people (forms, messages), as in models_registry.models.Format.
REGISTRY: dict[str, Format] = {
    module.FORMAT.name: module.FORMAT for module in (onnx, torchscript, savedmodel, tensorrt, python, tnn, ensemble)
}
if REGISTRY != REGISTERED:
    raise ImportError(f"formats registered but not listed: {sorted(set(REGISTERED) - set(REGISTRY))}")

ONNX = onnx.NAME
TORCHSCRIPT = torchscript.NAME
SAVEDMODEL = savedmodel.NAME
TENSORRT = tensorrt.NAME
PYTHON = python.NAME
TNN = tnn.NAME
ENSEMBLE = ensemble.NAME

# Finishes "declared format 'x' but the file looks like ...".
DESCRIPTIONS: dict[str, str] = {fmt.name: fmt.description for fmt in REGISTRY.values()}

# Formats whose artifact carries no signature the portal can read: the uploader declares it.
FORMATS_NEEDING_SIGNATURE: frozenset[str] = frozenset(fmt.name for fmt in REGISTRY.values() if fmt.needs_signature)

_FILE_DETECTORS = sorted((f for f in REGISTRY.values() if f.detect_file), key=lambda f: f.detect_order)
_ARCHIVE_DETECTORS = sorted((f for f in REGISTRY.values() if f.detect_archive), key=lambda f: f.detect_order)

looks_like_onnx = onnx.looks_like_onnx
looks_like_tensorrt_plan = tensorrt.looks_like_tensorrt_plan

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE", "DESCRIPTIONS", "ENSEMBLE", "FORMATS_NEEDING_SIGNATURE", "ONNX", "PYTHON", "REGISTRY",
    "SAVEDMODEL", "TENSORRT",
    "TNN", "TORCHSCRIPT", "Format", "FormatError", "LayoutError", "check_declared_format", "describe",
    "definition_from_json", "detect_format", "get", "looks_like_onnx", "looks_like_tensorrt_plan", "what_to_upload",
]


class FormatError(ValueError):
    """A declared format that the file contradicts; the message is shown to the uploader."""


def formats_needing_signature() -> frozenset[str]:
    return FORMATS_NEEDING_SIGNATURE


def get(name: str) -> Format:
    """The registered format called `name`; KeyError for an unknown one (validate names before asking)."""
    return REGISTRY[name]


def definition_from_json(fmt: str, data: Any) -> Definition | None:
    """A stored definition of a version of format `fmt`, read into the format's typed one; None when there is none
    (or the format has none). DefinitionError for what cannot be read."""
    read = REGISTRY[fmt].read_definition if fmt in REGISTRY else None
    if data is None or read is None:
        return None
    if not isinstance(data, Mapping):
        raise DefinitionError(f"a {fmt} definition is a JSON object, not {type(data).__name__}")
    return read(data)


def describe(fmt: str | None) -> str:
    return DESCRIPTIONS.get(fmt or "", "a file of no supported model format")


def what_to_upload(fmt: str | None = None) -> str:
    """What to upload, in words a person reads: the files and their names for one format, or for every uploadable
    one ("an ONNX model (the .onnx file); a TorchScript archive (...); ..."). Never the stored names (`onnx`,
    `tensorflow_savedmodel`): an uploader who sent a file the portal does not recognise is told what to send."""
    if fmt is not None and fmt in REGISTRY and REGISTRY[fmt].upload_as:
        return f"{REGISTRY[fmt].description}: {REGISTRY[fmt].upload_as}"
    return "; ".join(f"{f.description} ({f.upload_as})" for f in REGISTRY.values() if f.uploadable)


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
    for fmt in _FILE_DETECTORS:
        assert fmt.detect_file is not None
        if fmt.detect_file(path):
            return fmt.name
    return None


def check_declared_format(declared: str, detected: str | None) -> None:
    """FormatError unless the detected format agrees with the declared one ("" declares nothing)."""
    if declared == ENSEMBLE:
        raise FormatError("a pipeline is defined by its steps, not uploaded as a file")
    if not declared:
        if detected is None:
            raise FormatError(f"the file's format could not be recognised: upload one of: {what_to_upload()}")
        return
    if declared not in DESCRIPTIONS:
        raise FormatError(f"unknown format {declared!r}")
    if detected == declared:
        return
    if detected is None:
        raise FormatError(f"declared format {declared!r} but the file does not look like {describe(declared)}: "
                          f"upload {what_to_upload(declared)}")
    # The stored name is what the uploader sends as the format: the one to send instead is named by it.
    raise FormatError(f"declared format {declared!r} but the file looks like {describe(detected)}: declare "
                      f"{detected!r} for it, or leave the format out (it is detected from the file)")


# --- Archives --------------------------------------------------------------------------------------------------


def _detect_archive_format(path: Path, kind: str, limits: archives.ArchiveLimits) -> str | None:
    entries = archives.check_archive(path, limits)
    listing = ArchiveListing(
        path=path,
        kind=kind,
        files=archives.model_names([entry.name for entry in entries if not entry.is_dir]),
        entries=archives.model_names([entry.name for entry in entries]),
    )
    for fmt in _ARCHIVE_DETECTORS:
        assert fmt.detect_archive is not None
        if fmt.detect_archive(listing):
            return fmt.name
    return None
