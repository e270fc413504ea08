"""TensorRT plan: an undocumented serialized engine, served natively on Kubernetes (GPU), never locally.

Engines start with the tag "ptrt" or "ftrt"; some exporters (Ultralytics) put a little-endian uint32 length and a
JSON metadata blob in front of it. This follows what the Netron viewer checks (source/tensorrt.js); it is a
heuristic and kept explicit here. A plan carries no signature the portal reads: the uploader declares it.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

from modelport.core import archives
from modelport.core.formats.base import Format, LocalServing, NativeBackend, register
from modelport.core.formats.declared import inspect_declared

NAME = "tensorrt_plan"
_TAGS = (b"ptrt", b"ftrt")
_LOCAL_NOTE = "the local Triton from nvidia-pytriton has only the python backend"


def looks_like_tensorrt_plan(path: Path) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(4096)
    if len(head) < 24:
        return False
    if head[:4] in _TAGS:
        return True
    # A length-prefixed JSON metadata blob in front of the engine (Ultralytics' export).
    meta_len = struct.unpack("<I", head[:4])[0]
    start = 4 + meta_len
    return head[4:5] == b"{" and start + 4 <= len(head) and head[start : start + 4] in _TAGS


def write_artifact(artifact: Path, version_dir: Path, scratch: Path, limits: archives.ArchiveLimits) -> None:
    shutil.copyfile(artifact, version_dir / "model.plan")


FORMAT = register(Format(
    name=NAME,
    label="TensorRT plan",
    short_label="TensorRT plan",
    plural="TensorRT plans",
    description="a TensorRT plan",
    upload_as="the .plan or .engine file",
    needs_signature=True,
    native=NativeBackend(platform="tensorrt_plan"),
    local=LocalServing(refused=f"TensorRT plans cannot be served locally: {_LOCAL_NOTE} and no GPU; "
                               "deploy to Kubernetes"),
    extensions=("plan", "engine"),
    detect_order=10,
    detect_file=looks_like_tensorrt_plan,
    inspect=inspect_declared,
    write_artifact=write_artifact,
))
