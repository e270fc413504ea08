"""TorchScript: a torch.jit.save zip, served by libtorch on Kubernetes and by a python-backend wrapper locally
(with PyTorch in the runtime env).

Recognised by its layout: `<top>/data.pkl` and `<top>/constants.pkl` or `<top>/code/` (a plain torch.save
checkpoint has data.pkl but neither of the others, and is not servable by Triton). The signature is declared by
the uploader and checked by a trial run in the runtime env (models_registry.trial_run).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from models_registry import archives
from models_registry.formats.base import (
    BACKENDS_DIR,
    BATCHING_MODULE,
    ArchiveListing,
    Format,
    Inspected,
    LocalServing,
    NativeBackend,
    register,
)
from models_registry.signature import Signature

NAME = "torchscript"


def is_torchscript_layout(names: list[str]) -> bool:
    top = archives.single_top_folder(names)
    if top is None:
        return False
    has_code = any(n.startswith(f"{top}/code/") or n == f"{top}/code" for n in names)
    return f"{top}/data.pkl" in names and (f"{top}/constants.pkl" in names or has_code)


def detect_archive(listing: ArchiveListing) -> bool:
    return listing.kind == "zip" and is_torchscript_layout(listing.entries)


def inspect(path: Path, declared: Signature | None, limits: archives.ArchiveLimits) -> Inspected:
    """A structural check of the zip, then the trial run against the declared signature."""
    from models_registry.onnx_inspect import inspect_torchscript_archive
    from models_registry.trial_run import torchscript_findings

    inspect_torchscript_archive(path, limits)
    signature = declared or Signature()
    return Inspected(signature=signature, batchable=signature.has_batch_dim,
                     definition=torchscript_findings(path, signature))


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
))
