"""Read what can be read from an uploaded artifact without running it.

ONNX models carry their own signature; it is read from the graph with `onnx.load(load_external_data=False)`, so
weights kept in external data files are never opened. Python models (zips for Triton's python backend) are
parsed with `ast`, never imported: the code is untrusted. TorchScript archives get a structural check only; their
signature has to be declared by the uploader.
"""

from __future__ import annotations

import ast
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto

from deployments import pyenvs
from models_registry import archives
from models_registry.signature import Signature, Tensor

# A model may state its own batch limit in its metadata (metadata_props, like other ONNX model metadata).
MAX_BATCH_SIZE_METADATA_KEY = "max_batch_size"

# Generous limits for listing an archive being inspected; the uploaded archive has already been through
# archives.check_archive with the configured limits by the time anyone inspects it.
_LISTING_LIMITS = archives.ArchiveLimits(max_entries=100_000, max_total_size=2**62, max_ratio=2**62)
_SOURCE_MAX_BYTES = 4 * 1024 * 1024

# ONNX element type -> KServe v2 datatype. Types missing here (complex, float8, int4...) Triton cannot serve.
ONNX_TO_KSERVE: dict[int, str] = {
    TensorProto.FLOAT: "FP32",
    TensorProto.UINT8: "UINT8",
    TensorProto.INT8: "INT8",
    TensorProto.UINT16: "UINT16",
    TensorProto.INT16: "INT16",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.STRING: "BYTES",
    TensorProto.BOOL: "BOOL",
    TensorProto.FLOAT16: "FP16",
    TensorProto.DOUBLE: "FP64",
    TensorProto.UINT32: "UINT32",
    TensorProto.UINT64: "UINT64",
    TensorProto.BFLOAT16: "BF16",
}

# A requirement line naming a package: a PEP 508 name, optional extras and version specifiers, maybe a marker.


class InspectionError(ValueError):
    """An artifact that is not what it claims to be; the message is shown to the uploader."""


@dataclass(frozen=True)
class OnnxInspection:
    signature: Signature
    has_batch_dim: bool
    # The largest batch the model itself says it takes (metadata "max_batch_size"); 0 when it says nothing or
    # cannot batch, and the caller picks its default. A dynamic dimension alone sets no upper bound.
    max_batch_size_hint: int
    # Reasons the model may not serve (checker errors, tensors Triton cannot describe, missing external data).
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PythonModelInfo:
    files: list[str]  # relative to `root`
    has_requirements: bool
    requirements: list[str]
    root: str = ""  # the folder holding model.py inside the archive, "" for the top level


@dataclass(frozen=True)
class TorchScriptInfo:
    root: str  # the archive's single top folder (torch.jit.save names it after the file)
    files: list[str]
    version: int | None  # the serialization format version in `<root>/version`


# --- ONNX ------------------------------------------------------------------------------------------------------


def _tensor_from_value_info(value: onnx.ValueInfoProto, problems: list[str]) -> Tensor | None:
    where = f"tensor {value.name!r}"
    if value.type.WhichOneof("value") != "tensor_type":
        kind = value.type.WhichOneof("value") or "no type"
        problems.append(f"{where} is a {kind.replace('_type', '')}, not a tensor: Triton serves tensors only")
        return None
    tensor_type = value.type.tensor_type
    datatype = ONNX_TO_KSERVE.get(tensor_type.elem_type)
    if datatype is None:
        type_name = TensorProto.DataType.Name(tensor_type.elem_type) if tensor_type.elem_type else "undefined"
        problems.append(f"{where} has element type {type_name}, which Triton cannot serve")
        return None
    if not tensor_type.HasField("shape"):
        problems.append(f"{where} has no shape (unknown rank): Triton needs the number of dimensions")
        return None
    # dim_param ("batch"), a missing value and values <= 0 (some exporters write 0 or -1) all mean "any size".
    dims = tuple(
        dim.dim_value if dim.WhichOneof("value") == "dim_value" and dim.dim_value > 0 else -1
        for dim in tensor_type.shape.dim
    )
    return Tensor(name=value.name, datatype=datatype, dims=dims)


def _all_tensors(graph: onnx.GraphProto) -> list[TensorProto]:
    """Initializers and tensor-valued attributes, subgraphs (If, Loop, Scan bodies) included."""
    found = list(graph.initializer)
    found.extend(sparse.values for sparse in graph.sparse_initializer)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                found.append(attr.t)
            found.extend(attr.tensors)
            if attr.HasField("g"):
                found.extend(_all_tensors(attr.g))
            for sub in attr.graphs:
                found.extend(_all_tensors(sub))
    return found


def _external_data_problems(model: onnx.ModelProto, model_dir: Path) -> list[str]:
    """Check (never read) the external data files the model points at, relative to the model's folder."""
    locations: dict[str, int] = {}
    for tensor in _all_tensors(model.graph):
        if tensor.data_location == TensorProto.EXTERNAL:
            location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
            locations[location] = locations.get(location, 0) + 1
    problems = []
    for location, count in sorted(locations.items()):
        needed = f"needed by {count} tensor(s)"
        pure = PurePosixPath(location)
        if not location or pure.is_absolute() or ".." in pure.parts or "\\" in location:
            problems.append(f"external data location {location!r} ({needed}) is not a file next to the model")
        elif not (model_dir / location).is_file():
            problems.append(
                f"external data file {location!r} ({needed}) is missing: upload a self-contained .onnx file "
                "(onnx.save(model, path, save_as_external_data=False)) for models under 2 GB"
            )
    return problems


def inspect_onnx(path: Path | str) -> OnnxInspection:
    """Signature, batching and problems of an ONNX model file; InspectionError when it is not an ONNX model."""
    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise InspectionError(f"the file is not a valid ONNX model: it could not be parsed ({exc})") from None
    # An empty or foreign file can parse as a protobuf with no fields at all.
    if not model.ir_version or not model.HasField("graph"):
        raise InspectionError("the file is not a valid ONNX model: it has no ir_version or no graph")

    problems: list[str] = []
    initializers = {t.name for t in model.graph.initializer} | {s.values.name for s in model.graph.sparse_initializer}
    inputs = [
        tensor
        for value in model.graph.input
        if value.name not in initializers
        if (tensor := _tensor_from_value_info(value, problems)) is not None
    ]
    outputs = [
        tensor for value in model.graph.output if (tensor := _tensor_from_value_info(value, problems)) is not None
    ]
    if not inputs and not problems:
        problems.append("the model has no inputs")
    if not outputs and not problems:
        problems.append("the model has no outputs")

    external_problems = _external_data_problems(model, path.parent)
    problems.extend(external_problems)
    try:
        # By path, not by the loaded proto: given a proto the checker looks for external data relative to the
        # process's working directory, and it would check a serialized copy (one more copy of a big model in
        # memory). It only stats external data files, it never reads them.
        onnx.checker.check_model(str(path), full_check=False)
    except (onnx.checker.ValidationError, ValueError, RuntimeError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        # The checker's complaints about external data ("Data of TensorProto ... should be stored in ...") are
        # already reported above, in words an uploader can act on.
        if not (external_problems and message.startswith("Data of TensorProto")):
            problems.append(f"ONNX checker: {message}")

    signature = Signature(inputs=tuple(inputs), outputs=tuple(outputs))
    has_batch_dim = signature.has_batch_dim
    return OnnxInspection(
        signature=signature,
        has_batch_dim=has_batch_dim,
        max_batch_size_hint=_stated_max_batch_size(model) if has_batch_dim else 0,
        problems=problems,
    )


def _stated_max_batch_size(model: onnx.ModelProto) -> int:
    for prop in model.metadata_props:
        if prop.key == MAX_BATCH_SIZE_METADATA_KEY and prop.value.strip().isdigit():
            return int(prop.value.strip())
    return 0


def _dims_compatible(declared: tuple[int, ...], actual: tuple[int, ...]) -> bool:
    return len(declared) == len(actual) and all(
        d == a or a == -1 or d == -1 for d, a in zip(declared, actual, strict=True)
    )


def validate_declared_signature(declared: Signature, artifact_signature: Signature) -> list[str]:
    """Where a declared signature contradicts the one read from the artifact; [] when it fits.

    Inputs must match one for one (the backend feeds every model input). Declared outputs may be a subset of the
    model's (Triton serves only those in the config). A dimension that is dynamic on either side matches any size,
    so a declaration may pin a dynamic dimension to a fixed one.
    """
    problems: list[str] = []
    for kind, declared_tensors, actual_tensors in (
        ("input", declared.inputs, artifact_signature.inputs),
        ("output", declared.outputs, artifact_signature.outputs),
    ):
        actual_by_name = {t.name: t for t in actual_tensors}
        declared_names = {t.name for t in declared_tensors}
        for tensor in declared_tensors:
            actual = actual_by_name.get(tensor.name)
            if actual is None:
                known = ", ".join(repr(n) for n in actual_by_name) or "none"
                problems.append(f"declared {kind} {tensor.name!r} is not in the model (its {kind}s: {known})")
                continue
            if tensor.datatype != actual.datatype:
                problems.append(
                    f"{kind} {tensor.name!r} is declared {tensor.datatype} but the model has {actual.datatype}"
                )
            if not _dims_compatible(tensor.dims, actual.dims):
                problems.append(
                    f"{kind} {tensor.name!r} is declared with dims {list(tensor.dims)} "
                    f"but the model has {list(actual.dims)}"
                )
        if kind == "input":
            for name in actual_by_name:
                if name not in declared_names:
                    problems.append(f"model input {name!r} is missing from the declared signature")
    return problems


# --- Python models ---------------------------------------------------------------------------------------------


def _read_entry(path: Path, name: str, limit: int) -> bytes:
    """An archive entry's bytes, refusing (not truncating) one bigger than `limit`."""
    try:
        data = archives.read_entry(path, name, limit + 1)
    except archives.ArchiveError as exc:
        raise InspectionError(str(exc)) from None
    if len(data) > limit:
        raise InspectionError(f"{name} is larger than {limit} bytes")
    return data


def _archive_names(path: Path, limits: archives.ArchiveLimits | None) -> list[str]:
    try:
        names = archives.list_names(path, limits or _LISTING_LIMITS)
    except archives.ArchiveError as exc:
        raise InspectionError(str(exc)) from None
    # Finder adds these to every zip it makes; they are not part of the model.
    return [n for n in names if not n.startswith("__MACOSX/") and n.rsplit("/", 1)[-1] != ".DS_Store"]


def _model_root(names: list[str], marker: str) -> str | None:
    if marker in names:
        return ""
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) == 1 and all("/" in n for n in names):
        top = tops.pop()
        if f"{top}/{marker}" in names:
            return top
    return None


def _parse_requirements(text: str) -> list[str]:
    # Options (-r, --index-url, -e) and URLs would let the uploader choose what pip fetches and from where, or read
    # local files: only plain PEP 508 requirements are accepted (the same front door deploys go through).
    try:
        return pyenvs.parse_requirements_txt(text)
    except pyenvs.RequirementError as exc:
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
    names = _archive_names(path, limits)
    root = _model_root(names, "model.py")
    if root is None:
        raise InspectionError("the archive has no model.py at its top level or inside its single top folder")
    prefix = f"{root}/" if root else ""
    model_py = f"{prefix}model.py"
    try:
        source = _read_entry(path, model_py, _SOURCE_MAX_BYTES)
        _check_model_py(source, model_py)
        requirements: list[str] = []
        has_requirements = f"{prefix}requirements.txt" in names
        if has_requirements:
            raw = _read_entry(path, f"{prefix}requirements.txt", _SOURCE_MAX_BYTES)
            try:
                text = raw.decode("utf-8-sig")
            except UnicodeDecodeError:
                raise InspectionError("requirements.txt is not UTF-8 text") from None
            requirements = _parse_requirements(text)
    except (zipfile.BadZipFile, EOFError, zlib.error, OSError, KeyError) as exc:
        raise InspectionError(f"the archive could not be read ({exc})") from None
    files = sorted(n[len(prefix) :] for n in names)
    return PythonModelInfo(files=files, has_requirements=has_requirements, requirements=requirements, root=root)


# --- TorchScript -----------------------------------------------------------------------------------------------


def inspect_torchscript_archive(path: Path | str, limits: archives.ArchiveLimits | None = None) -> TorchScriptInfo:
    """A structural check of a torch.jit.save zip: its records, read without unpickling anything."""
    path = Path(path)
    if archives.archive_kind(path) != "zip":
        raise InspectionError("a TorchScript model is a zip archive written by torch.jit.save; this file is not a zip")
    names = _archive_names(path, limits)
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) != 1 or not all("/" in n for n in names):
        raise InspectionError("a TorchScript archive keeps all its records in one top folder; this zip does not")
    root = tops.pop()
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
                text = _read_entry(path, record, 64).decode("ascii", "replace").strip()
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
