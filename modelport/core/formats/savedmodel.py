"""TensorFlow SavedModel: `saved_model.pb` (or `.pbtxt`) at the top of an archive or in its one folder; served by
the TensorFlow backend on Kubernetes and by a python-backend wrapper locally (with TensorFlow in the runtime env).
Inspection reads the signature from saved_model.pb without TensorFlow (modelport.core.formats.savedmodel_inspect)."""

from __future__ import annotations

from pathlib import Path

from modelport.core import archives
from modelport.core.definitions import SavedModelDefinition
from modelport.core.formats.base import (
    BACKENDS_DIR,
    BATCHING_MODULE,
    ArchiveListing,
    Format,
    Inspected,
    LayoutError,
    LocalServing,
    NativeBackend,
    extract,
    register,
)
from modelport.core.signature import Signature

NAME = "tensorflow_savedmodel"
_SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")


def detect_archive(listing: ArchiveListing) -> bool:
    return any(archives.marker_path(listing.files, marker) for marker in _SAVED_MODEL_FILES)


def inspect(path: Path, declared: Signature | None, limits: archives.ArchiveLimits) -> Inspected:
    from modelport.core.formats.savedmodel_inspect import savedmodel_findings

    signature, definition = savedmodel_findings(path, declared, limits)
    return Inspected(signature=signature, batchable=signature.has_batch_dim, definition=definition)


def write_artifact(artifact: Path, version_dir: Path, scratch: Path, limits: archives.ArchiveLimits) -> None:
    extract(artifact, scratch, limits)
    roots = sorted({p.parent for p in scratch.rglob("saved_model.pb*") if p.name in _SAVED_MODEL_FILES})
    if len(roots) != 1:
        raise LayoutError(f"the archive must hold one SavedModel directory (saved_model.pb), found {len(roots)}")
    roots[0].rename(version_dir / "model.savedmodel")


FORMAT = register(Format(
    name=NAME,
    label="TensorFlow SavedModel",
    short_label="TensorFlow SavedModel",
    plural="TensorFlow SavedModels",
    description="a TensorFlow SavedModel",
    upload_as="its folder, saved_model.pb and variables/, in a .zip or .tar.gz",
    needs_signature=False,
    native=NativeBackend(platform="tensorflow_savedmodel"),
    local=LocalServing(wrapper=BACKENDS_DIR / "savedmodel_python_model.py", modules=(BATCHING_MODULE,),
                       noun="TensorFlow SavedModels"),
    detect_order=30,  # after python: a python model may ship a SavedModel it loads itself
    detect_archive=detect_archive,
    inspect=inspect,
    write_artifact=write_artifact,
    read_definition=SavedModelDefinition.from_json,
))
