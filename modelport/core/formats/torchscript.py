"""TorchScript: a torch.jit.save zip, served by libtorch on Kubernetes and by a python-backend wrapper locally
(with PyTorch in the runtime env).

Recognised by its layout: `<top>/data.pkl` and `<top>/constants.pkl` or `<top>/code/` (a plain torch.save
checkpoint has data.pkl but neither of the others, and is not servable by Triton). The signature is declared by
the uploader and checked by a trial run in the runtime env (modelport.core.trial_run).
"""

from __future__ import annotations

import shutil
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from modelport.core import archives
from modelport.core.definitions import TorchScriptDefinition
from modelport.core.formats.base import (
    BACKENDS_DIR,
    BATCHING_MODULE,
    ArchiveListing,
    Format,
    Inspected,
    InspectionError,
    LocalServing,
    NativeBackend,
    archive_names,
    read_archive_entry,
    register,
)
from modelport.core.signature import Signature

NAME = "torchscript"


def is_torchscript_layout(names: list[str]) -> bool:
    top = archives.single_top_folder(names)
    if top is None:
        return False
    has_code = any(n.startswith(f"{top}/code/") or n == f"{top}/code" for n in names)
    return f"{top}/data.pkl" in names and (f"{top}/constants.pkl" in names or has_code)


def detect_archive(listing: ArchiveListing) -> bool:
    return listing.kind == "zip" and is_torchscript_layout(listing.entries)


@dataclass(frozen=True)
class TorchScriptInfo:
    root: str  # the archive's single top folder (torch.jit.save names it after the file)
    files: list[str]
    version: int | None  # the serialization format version in `<root>/version`


def inspect_torchscript_archive(path: Path | str, limits: archives.ArchiveLimits | None = None) -> TorchScriptInfo:
    """A structural check of a torch.jit.save zip: its records, read without unpickling anything."""
    path = Path(path)
    if archives.archive_kind(path) != "zip":
        raise InspectionError("a TorchScript model is a zip archive written by torch.jit.save; this file is not a zip")
    names = archive_names(path, limits)
    root = archives.single_top_folder(names)
    if root is None:
        raise InspectionError("a TorchScript archive keeps all its records in one top folder; this zip does not")
    if f"{root}/data.pkl" not in names:
        raise InspectionError(f"the archive has no {root}/data.pkl record: it was not written by torch.jit.save")
    has_code = any(n.startswith(f"{root}/code/") for n in names)
    if not has_code and f"{root}/constants.pkl" not in names:
        raise InspectionError(
            "the archive has data.pkl but no code/ or constants.pkl: it looks like a torch.save() checkpoint, "
            "not TorchScript; export the model with torch.jit.script or torch.jit.trace and save that"
        )
    try:
        head = _read_head(path, f"{root}/data.pkl")
        version: int | None = None
        for record in (f"{root}/version", f"{root}/.data/version"):
            if record in names:
                text = read_archive_entry(path, record, 64).decode("ascii", "replace").strip()
                version = int(text) if text.isdigit() else None
                break
    except (zipfile.BadZipFile, EOFError, zlib.error, OSError, KeyError) as exc:
        raise InspectionError(f"the archive could not be read ({exc})") from None
    # Pickle protocol 2+ starts with the PROTO opcode; torch writes protocol 2.
    if head[:1] != b"\x80":
        raise InspectionError(f"{root}/data.pkl is not a pickle: the archive is damaged")
    return TorchScriptInfo(root=root, files=sorted(n[len(root) + 1 :] for n in names), version=version)


def _read_head(path: Path, name: str) -> bytes:
    with zipfile.ZipFile(path) as zf:
        stored = {archives.normalize_entry_name(i.filename): i for i in zf.infolist()}[name]
        with zf.open(stored) as fh:
            return fh.read(2)


def inspect(path: Path, declared: Signature | None, limits: archives.ArchiveLimits) -> Inspected:
    """A structural check of the zip; the trial run against the declared signature is the caller's to do."""
    inspect_torchscript_archive(path, limits)
    signature = declared or Signature()
    return Inspected(signature=signature, batchable=signature.has_batch_dim, needs_trial_run=True)


def local_signature_problem(signature: Signature) -> str | None:
    # numpy has no bfloat16 and torch no strings: the python backend cannot hand these to the module.
    odd = [t.name for t in signature.inputs + signature.outputs if t.datatype in ("BYTES", "BF16")]
    if odd:
        return (f"the local runtime serves TorchScript with numeric tensors only, and {', '.join(odd)} is BYTES or "
                "BF16; deploy to Kubernetes")
    return None


def write_artifact(artifact: Path, version_dir: Path, scratch: Path, limits: archives.ArchiveLimits) -> None:
    shutil.copyfile(artifact, version_dir / "model.pt")


FORMAT = register(Format(
    name=NAME,
    label="PyTorch TorchScript",
    short_label="TorchScript",
    plural="TorchScript",
    description="a TorchScript archive",
    upload_as="the .pt file that torch.jit.save writes, not torch.save's",
    needs_signature=True,
    native=NativeBackend(platform="pytorch_libtorch"),
    local=LocalServing(
        wrapper=BACKENDS_DIR / "torchscript_python_model.py",
        modules=(BATCHING_MODULE, BACKENDS_DIR / "torchscript_io.py"),
        noun="TorchScript models",
        signature_problem=local_signature_problem,
    ),
    extensions=("pt", "pth", "torchscript"),
    detect_order=10,  # a TorchScript zip may hold anything under code/, even a model.py
    detect_archive=detect_archive,
    inspect=inspect,
    write_artifact=write_artifact,
    read_definition=TorchScriptDefinition.from_json,
))
