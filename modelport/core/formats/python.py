"""Python models for Triton's python backend: `model.py` defining `class TritonPythonModel`, at the top of an
archive or in its one folder, with an optional requirements.txt. Served by the python backend on both targets.
The code is untrusted: inspection parses it with `ast` and never imports it (`inspect_python_archive`)."""

from __future__ import annotations

import ast
import lzma
import re
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from modelport.core import archives
from modelport.core import requirements as requirement_lines
from modelport.core.definitions import PythonDefinition
from modelport.core.formats.base import (
    ArchiveListing,
    Format,
    Inspected,
    InspectionError,
    LayoutError,
    NativeBackend,
    archive_names,
    extract,
    read_archive_entry,
    register,
)
from modelport.core.signature import Signature

NAME = "python"
# model.py and requirements.txt: read whole, at most this much.
_SOURCE_MAX_BYTES = 4 * 1024 * 1024
_TRITON_PYTHON_CLASS = re.compile(rb"^class\s+TritonPythonModel\b", re.MULTILINE)


def detect_archive(listing: ArchiveListing) -> bool:
    model_py = archives.marker_path(listing.files, "model.py")
    if model_py is None:
        return False
    try:
        source = archives.read_entry(listing.path, model_py, _SOURCE_MAX_BYTES)
    except (zipfile.BadZipFile, archives.ArchiveError, EOFError, zlib.error, lzma.LZMAError, OSError, KeyError):
        source = b""
    return bool(_TRITON_PYTHON_CLASS.search(source))


@dataclass(frozen=True)
class PythonModelInfo:
    files: list[str]  # relative to `root`
    has_requirements: bool
    requirements: list[str]
    root: str = ""  # the folder holding model.py inside the archive, "" for the top level


def _parse_requirements(text: str) -> list[str]:
    # Options (-r, --index-url, -e) and URLs would let the uploader choose what pip fetches and from where, or read
    # local files: only plain PEP 508 requirements are accepted (the same front door deploys go through).
    try:
        return requirement_lines.parse_requirements_txt(text)
    except requirement_lines.RequirementError as exc:
        raise InspectionError(str(exc)) from None


def _check_model_py(source: bytes, shown_name: str) -> None:
    try:
        tree = ast.parse(source, filename=shown_name)
    except SyntaxError as exc:
        raise InspectionError(f"{shown_name} has a syntax error at line {exc.lineno}: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise InspectionError(f"{shown_name} cannot be parsed as Python ({type(exc).__name__})") from None
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TritonPythonModel"]
    if not classes:
        raise InspectionError(
            f"{shown_name} does not define class TritonPythonModel at module level, which Triton's python backend needs"
        )
    model_class = classes[-1]
    methods = {n.name for n in model_class.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    # execute() may come from a base class defined elsewhere; only a class with no bases must define it itself.
    if "execute" not in methods and not model_class.bases:
        raise InspectionError(f"class TritonPythonModel in {shown_name} has no execute() method")


def inspect_python_archive(path: Path | str, limits: archives.ArchiveLimits | None = None) -> PythonModelInfo:
    """Files and requirements of a python-backend model archive; InspectionError when model.py is unusable."""
    path = Path(path)
    names = archive_names(path, limits)
    root = archives.model_root(names, "model.py")
    if root is None:
        raise InspectionError("the archive has no model.py at its top level or inside its single top folder")
    prefix = f"{root}/" if root else ""
    model_py = f"{prefix}model.py"
    try:
        source = read_archive_entry(path, model_py, _SOURCE_MAX_BYTES)
        _check_model_py(source, model_py)
        requirements: list[str] = []
        has_requirements = f"{prefix}requirements.txt" in names
        if has_requirements:
            raw = read_archive_entry(path, f"{prefix}requirements.txt", _SOURCE_MAX_BYTES)
            try:
                text = raw.decode("utf-8-sig")
            except UnicodeDecodeError:
                raise InspectionError("requirements.txt is not UTF-8 text") from None
            requirements = _parse_requirements(text)
    except (zipfile.BadZipFile, EOFError, zlib.error, OSError, KeyError) as exc:
        raise InspectionError(f"the archive could not be read ({exc})") from None
    files = sorted(n[len(prefix) :] for n in names)
    return PythonModelInfo(files=files, has_requirements=has_requirements, requirements=requirements, root=root)


def inspect(path: Path, declared: Signature | None, limits: archives.ArchiveLimits) -> Inspected:
    info = inspect_python_archive(path, limits)
    signature = declared or Signature()
    # One sandboxed call on inputs made from the signature, by the inspection task (models_registry/python_trial.py):
    # a model answering under other names than declared is refused there, not served as 200s with no outputs. Not
    # for a model with requirements, whose environment is built only when it is deployed.
    return Inspected(signature=signature, batchable=signature.has_batch_dim,
                     definition=PythonDefinition(requirements=tuple(info.requirements)),
                     needs_trial_run=not info.has_requirements)


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
    upload_as="model.py defining TritonPythonModel, with an optional requirements.txt, in a .zip or .tar.gz",
    needs_signature=True,
    native=NativeBackend(backend="python"),
    detect_order=20,
    detect_archive=detect_archive,
    inspect=inspect,
    write_artifact=write_artifact,
    read_definition=PythonDefinition.from_json,
))
