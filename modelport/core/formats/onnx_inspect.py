"""Read an ONNX model's signature without running it, and check a declared signature against an artifact's.

ONNX models carry their own signature; it is read from the graph with `onnx.load(load_external_data=False)`, so
weights kept in external data files are never opened. (Python models and TorchScript archives are inspected by their
format modules, modelport/core/formats/python.py and torchscript.py.)
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto

from modelport.core.datatypes import ONNX_TO_KSERVE_NAMES
from modelport.core.formats.base import InspectionError
from modelport.core.signature import Signature, Tensor, dims_compatible

__all__ = ["ONNX_TO_KSERVE", "InspectionError", "OnnxInspection", "inspect_onnx", "validate_declared_signature"]

# A model may state its own batch limit in its metadata (metadata_props, like other ONNX model metadata).
MAX_BATCH_SIZE_METADATA_KEY = "max_batch_size"

# ONNX element type -> KServe v2 datatype. Types missing here (complex, float8, int4...) Triton cannot serve.
ONNX_TO_KSERVE: dict[int, str] = {TensorProto.DataType.Value(name): kserve
                                  for name, kserve in ONNX_TO_KSERVE_NAMES.items()}

# The operator domains onnxruntime (Triton's ONNX backend, and the local runtime's) implements: the ONNX standard
# ("" is ai.onnx), its classic-ML operators, and onnxruntime's own contrib operators. A node of any other domain is
# a custom operator: onnx.checker cannot check it and passes it, and the model fails only when Triton loads it.
KNOWN_OP_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft"})
_MAX_DOMAINS_NAMED = 5
# The domain whose operators onnx.checker does not know: the ONNX standard's and ai.onnx.ml's it checks against its
# own schemas ("No Op registered for ..."), onnxruntime's contrib domain it passes whatever the operator is called.
ORT_CONTRIB_DOMAIN = "com.microsoft"
_MAX_OPS_NAMED = 5


@functools.cache
def onnxruntime_operators(domain: str) -> frozenset[str]:
    """The operators onnxruntime defines in `domain`: the schemas of its own registry (150 in com.microsoft in
    onnxruntime 1.32), the version the runtime env serves ONNX models with (requirements.txt pins both).
    Imported here only for a model that uses the domain: the import costs about 0.6 s once per process, reading
    the schemas 0.03 s. A defined operator may still lack a kernel for an execution provider (64 of them have none
    on the CPU), which only loading it on the deployment's hardware tells."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    return frozenset(schema.name for schema in ort_state.get_all_operator_schema() if schema.domain == domain)

@dataclass(frozen=True)
class OnnxInspection:
    signature: Signature
    has_batch_dim: bool
    # The largest batch the model itself says it takes (metadata "max_batch_size"); 0 when it says nothing or
    # cannot batch, and the caller picks its default. A dynamic dimension alone sets no upper bound.
    max_batch_size_hint: int
    # Reasons the model may not serve (checker errors, tensors Triton cannot describe, missing external data).
    problems: list[str] = field(default_factory=list)


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


def _nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Every node, those of subgraphs (If, Loop, Scan bodies) included."""
    found = list(graph.node)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                found.extend(_nodes(attr.g))
            for sub in attr.graphs:
                found.extend(_nodes(sub))
    return found


def _custom_domain_problems(model: onnx.ModelProto) -> list[str]:
    """Nodes whose operator domain onnxruntime does not implement, named by domain (the model's own functions
    count as implemented: a node calling one names the function's domain)."""
    local = {f.domain for f in model.functions}
    nodes = _nodes(model.graph) + [n for f in model.functions for n in f.node]
    unknown: dict[str, str] = {}
    for node in nodes:
        if node.domain not in KNOWN_OP_DOMAINS and node.domain not in local:
            unknown.setdefault(node.domain, node.op_type)
    if not unknown:
        return []
    shown = sorted(unknown.items())[:_MAX_DOMAINS_NAMED]
    named = ", ".join(f"{domain[:100]!r} (operator {op[:100]!r})" for domain, op in shown)
    more = f" and {len(unknown) - _MAX_DOMAINS_NAMED} more" if len(unknown) > _MAX_DOMAINS_NAMED else ""
    return [f"the model uses custom operators of the domain(s) {named}{more}, which onnxruntime does not implement "
            "and Triton would fail to load: export it with standard ONNX operators (or onnxruntime's com.microsoft "
            "ones)"]


def _unknown_contrib_op_problems(model: onnx.ModelProto) -> list[str]:
    """Nodes of onnxruntime's contrib domain naming an operator onnxruntime does not define (a made-up or misspelt
    com.microsoft op passes onnx.checker and fails only when Triton loads the model)."""
    local = {(f.domain, f.name) for f in model.functions}
    nodes = _nodes(model.graph) + [n for f in model.functions for n in f.node]
    used = {node.op_type for node in nodes
            if node.domain == ORT_CONTRIB_DOMAIN and (node.domain, node.op_type) not in local}
    if not used:
        return []
    unknown = sorted(used - onnxruntime_operators(ORT_CONTRIB_DOMAIN))
    if not unknown:
        return []
    named = ", ".join(repr(op[:100]) for op in unknown[:_MAX_OPS_NAMED])
    more = f" and {len(unknown) - _MAX_OPS_NAMED} more" if len(unknown) > _MAX_OPS_NAMED else ""
    return [f"the model uses operator(s) {named}{more} of the domain {ORT_CONTRIB_DOMAIN!r}, which onnxruntime does "
            "not define and Triton would fail to load: export it with standard ONNX operators or com.microsoft "
            "operators onnxruntime implements"]


def _names(graph: onnx.GraphProto) -> Iterator[str]:
    for value in (*graph.input, *graph.output, *graph.value_info):
        yield value.name
    for tensor in graph.initializer:
        yield tensor.name
    for node in graph.node:
        yield node.name
        yield from node.input
        yield from node.output
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _names(attr.g)
            for sub in attr.graphs:
                yield from _names(sub)


def _control_character_problems(model: onnx.ModelProto) -> list[str]:
    """Names with a character that is not printable (a newline, an escape, a line separator such as U+2028, which
    str.splitlines() breaks at): onnxruntime quotes tensor and node names in the
    warnings it prints into the server's log, which a pool shares between teams, where such a name could start a
    line that reads as the server's own about another team's model."""
    names = itertools.chain(_names(model.graph), (n for f in model.functions for node in f.node
                                                  for n in (node.name, *node.input, *node.output)))
    bad = next((name for name in names if not name.isprintable()), None)
    if bad is None:
        return []
    return [f"the name {bad[:100]!r} holds a character that is not printable "
            "(a newline, a tab, an escape, a line separator): rename the model's "
            "tensors and nodes with printable characters"]


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

    problems.extend(_custom_domain_problems(model))
    problems.extend(_unknown_contrib_op_problems(model))
    problems.extend(_control_character_problems(model))
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
            if not dims_compatible(tensor.dims, actual.dims):
                problems.append(
                    f"{kind} {tensor.name!r} is declared with dims {list(tensor.dims)} "
                    f"but the model has {list(actual.dims)}"
                )
        if kind == "input":
            for name in actual_by_name:
                if name not in declared_names:
                    problems.append(f"model input {name!r} is missing from the declared signature")
    return problems
