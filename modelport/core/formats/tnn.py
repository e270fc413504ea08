"""TNN: exactly one `.tnnproto` and one `.tnnmodel` in an archive, served on Kubernetes by a custom backend built
into the operator's Triton image (named by KUBERNETES_TNN_BACKEND_NAME); the local runtime cannot serve it."""

from __future__ import annotations

from pathlib import Path

from modelport.core import archives
from modelport.core.formats.base import (
    ArchiveListing,
    Format,
    LayoutError,
    LocalServing,
    NativeBackend,
    extract,
    register,
)
from modelport.core.formats.declared import inspect_declared

NAME = "tnn"
_LOCAL_NOTE = "the local Triton from nvidia-pytriton has only the python backend"


def detect_archive(listing: ArchiveListing) -> bool:
    protos = [n for n in listing.files if n.endswith(".tnnproto")]
    weights = [n for n in listing.files if n.endswith(".tnnmodel")]
    return len(protos) == 1 and len(weights) == 1


def write_artifact(artifact: Path, version_dir: Path, scratch: Path, limits: archives.ArchiveLimits) -> None:
    extract(artifact, scratch, limits)
    protos = sorted(p for p in scratch.rglob("*.tnnproto") if p.is_file())
    weights = sorted(p for p in scratch.rglob("*.tnnmodel") if p.is_file())
    if len(protos) != 1 or len(weights) != 1:
        raise LayoutError(
            f"the archive must hold one .tnnproto and one .tnnmodel, found {len(protos)} and {len(weights)}"
        )
    # Fixed names, so the TNN backend finds the pair without extra parameters.
    protos[0].rename(version_dir / "model.tnnproto")
    weights[0].rename(version_dir / "model.tnnmodel")


FORMAT = register(Format(
    name=NAME,
    label="TNN (custom backend)",
    short_label="TNN",
    plural="TNN models",
    description="a TNN model",
    upload_as="its .tnnproto and .tnnmodel files in a .zip or .tar.gz",
    needs_signature=True,
    native=NativeBackend(custom=True),
    local=LocalServing(refused=f"TNN models cannot be served locally: {_LOCAL_NOTE}, not the TNN backend; "
                               "deploy to Kubernetes"),
    detect_order=40,
    detect_archive=detect_archive,
    inspect=inspect_declared,
    write_artifact=write_artifact,
))
