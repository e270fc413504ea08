"""Render a Triton model repository from a `RepositorySpec`.

Each config.pbtxt is built as Triton's own protobuf message (`ModelConfig`) and printed with protobuf's text
format, so a wrong field name or type fails here rather than when Triton loads the model. Rendering is
deterministic: the same spec and artifacts give a byte-identical tree (tests compare `repository_digest`).

Layout: `<model>/config.pbtxt` and `<model>/<version>/` holding `model.onnx`, `model.pt`, `model.savedmodel/`,
`model.plan`, `model.py` (+ helper files), `model.tnnproto` + `model.tnnmodel`, or nothing (ensembles).
On the local target ONNX, TorchScript and SavedModels are served by generated python-backend models: the
wrapper from modelport/core/backends/ as `model.py` beside the artifact, with the modules it imports; on a cluster
too when the repository is a pool's (`python_models`), so that each model runs in processes of its own, which the
pool confines to its memory limit (deployments/runtimes/kubernetes/pool_stub.py), never inside Triton's. Which backend
serves a format on each target, and how its artifact is laid out, is the format's own module's to say
(modelport/core/formats/); this module builds the config and the tree around it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from deployments.spec import (
    RepositorySpec,
    ServedModel,
    Target,
    Warmup,
    validate_repository,
)
from modelport.core import archives, formats
from modelport.core.archives import ArchiveLimits
from modelport.core.signature import Tensor

# The SignatureDef a SavedModel serves: read by Triton's TensorFlow backend and by the local wrapper alike.
TF_SIGNATURE_DEF = "TF_SIGNATURE_DEF"

# Artifacts were checked against the configured limits at upload (models_registry.validation.archive_limits());
# these are the settings' defaults, a backstop for callers that pass none.
DEFAULT_ARCHIVE_LIMITS = archives.DEFAULT_LIMITS


class RenderError(ValueError):
    """The spec or an artifact cannot be rendered; `errors` maps fields to messages like the validators do."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{key}: {' '.join(messages)}" for key, messages in sorted(errors.items())))


# Triton's onnxruntime backend maps optimization.graph.level 2 to ORT_DISABLE_ALL (its -1 is ORT_ENABLE_BASIC,
# which still folds constants, and any other value ORT_ENABLE_ALL): onnxruntime_backend's src/onnxruntime.cc.
ORT_GRAPH_LEVEL_DISABLE_ALL = 2


def python_wrapped(m: ServedModel, target: Target, python_models: bool = False) -> bool:
    """Whether `m` is served by its format's generated python-backend model: always on the local target, and on a
    cluster with `python_models` (a pool's Triton) when it runs on the CPU (the generated models run onnxruntime,
    torch and TensorFlow on the CPU only; a GPU model keeps its native backend, docs/security.md says so)."""
    if formats.get(m.format).local.wrapper is None:
        return False
    return target == "local" or (python_models and m.instance_group.kind != "gpu")


def build_model_config(m: ServedModel, target: Target, *, tnn_backend_name: str = "tnn",
                       fold_constants: bool = True, python_models: bool = False) -> mc.ModelConfig:
    """Triton's ModelConfig message for `m` on `target` (assumes `m` passed validation).

    `fold_constants=False` (a shared Triton): an ONNX model served by the onnxruntime backend is built with no
    graph optimization, as the local wrapper builds its sessions without ConstantFolding, since a ~300-byte graph
    (ConstantOfShape [6000, 6000] -> MatMul) otherwise computes for tens of seconds at load, holding the shared
    server's loads (and its CPU) for every other deployment in it. onnxruntime offers no way from Triton's config
    to disable one optimizer, so all are: the uploader's own dedicated Triton keeps the default (its load time is
    its own)."""
    config = mc.ModelConfig(name=m.name, max_batch_size=m.max_batch_size)
    fmt = formats.get(m.format)
    if fmt.native.custom:
        config.backend = tnn_backend_name
    elif python_wrapped(m, target, python_models):
        # The local tritonserver has only the python backend, and a pool's models run in processes of their own:
        # a generated python model runs the file.
        config.backend = "python"
    else:
        if fmt.native.platform:
            config.platform = fmt.native.platform
        if fmt.native.backend:
            config.backend = fmt.native.backend
        if not fold_constants and fmt.native.backend == "onnxruntime":
            config.optimization.graph.level = ORT_GRAPH_LEVEL_DISABLE_ALL
    # Serve exactly the version this spec names, even if another version directory is ever left behind.
    config.version_policy.specific.versions.append(m.version)

    batched = m.max_batch_size > 0
    for tensor in m.signature.inputs:
        entry = config.input.add(name=tensor.name, data_type=_data_type(tensor))
        _set_dims(entry, tensor, batched)
        if tensor.optional:
            entry.optional = True  # a request may leave it out (the python model reads None for it)
    for tensor in m.signature.outputs:
        entry = config.output.add(name=tensor.name, data_type=_data_type(tensor))
        _set_dims(entry, tensor, batched)

    if m.format == formats.ENSEMBLE:
        for step in m.ensemble_steps:
            config.ensemble_scheduling.step.add(
                model_name=step.model,
                model_version=step.version,
                input_map=dict(step.input_map),
                output_map=dict(step.output_map),
            )
    else:
        group = config.instance_group.add(
            count=m.instance_group.count,
            kind=mc.ModelInstanceGroup.KIND_GPU if m.instance_group.kind == "gpu" else mc.ModelInstanceGroup.KIND_CPU,
        )
        group.gpus.extend(m.instance_group.gpus)

    if m.dynamic_batching is not None:
        db = m.dynamic_batching
        config.dynamic_batching.max_queue_delay_microseconds = db.max_queue_delay_microseconds
        config.dynamic_batching.preferred_batch_size.extend(db.preferred_batch_size)
        config.dynamic_batching.preserve_ordering = db.preserve_ordering

    if m.response_cache:
        config.response_cache.enable = True
    if m.decoupled:
        # Any number of responses per request, each sent as the model makes it (issue 33).
        config.model_transaction_policy.decoupled = True

    if m.warmup is not None:
        _add_warmup(config, m)
    if m.format == formats.SAVEDMODEL and m.signature_def:
        config.parameters[TF_SIGNATURE_DEF].string_value = m.signature_def
    return config


def render_config(m: ServedModel, target: Target, *, tnn_backend_name: str = "tnn",
                  fold_constants: bool = True, python_models: bool = False) -> str:
    """config.pbtxt text for `m` (`fold_constants`, `python_models`: see build_model_config, python_wrapped)."""
    text: str = text_format.MessageToString(build_model_config(m, target, tnn_backend_name=tnn_backend_name,
                                                                fold_constants=fold_constants,
                                                                python_models=python_models))
    return text


def render_repository(
    spec: RepositorySpec,
    target: Target,
    out_dir: Path,
    *,
    tnn_backend_name: str = "tnn",
    local_frameworks: Collection[str] = frozenset(),
    archive_limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS,
    fold_constants: bool = True,
    python_models: bool = False,
) -> None:
    """Write the repository for `spec` to `out_dir`, replacing what was there (`fold_constants`: see
    build_model_config; False for a Triton shared by several deployments; `python_models`: python_wrapped, True
    for a cluster pool's).

    The tree is built in a sibling directory and swapped in at the end, so a server pointed at `out_dir` never
    sees half a repository. Raises RenderError for an invalid spec or an unusable artifact.
    """
    errors = validate_repository(spec, target, local_frameworks=local_frameworks)
    if python_models and target != "local":
        for m in spec.models:
            check = formats.get(m.format).local.signature_problem
            if python_wrapped(m, target, python_models) and check is not None and (problem := check(m.signature)):
                errors.setdefault(f"{m.name}.signature", []).append(
                    f"in a shared pool, where each model runs in processes of its own: {problem}")
    if errors:
        raise RenderError(errors)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    try:
        for m in sorted(spec.models, key=lambda model: model.name):
            model_dir = staging / m.name
            version_dir = model_dir / str(m.version)
            version_dir.mkdir(parents=True)
            (model_dir / "config.pbtxt").write_text(
                render_config(m, target, tnn_backend_name=tnn_backend_name, fold_constants=fold_constants,
                              python_models=python_models),
                encoding="utf-8",
            )
            _write_artifact(m, target, version_dir, scratch=staging / f".extract-{m.name}", limits=archive_limits,
                            python_models=python_models)
        _swap_in(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def repository_digest(root: Path) -> str:
    """sha256 over every file's relative path and content, in sorted order (directories count by path)."""
    digest = hashlib.sha256()
    for path in sorted(Path(root).rglob("*"), key=lambda p: p.relative_to(root).as_posix()):
        relative = path.relative_to(root).as_posix()
        if path.is_dir():
            digest.update(b"D\0" + relative.encode() + b"\0")
        else:
            digest.update(b"F\0" + relative.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _data_type(tensor: Tensor) -> int:
    value: int = mc.DataType.Value(tensor.triton_type)
    return value


def served_dims(dims: tuple[int, ...] | list[int], batched: bool) -> list[int]:
    """The shape clients see for a tensor of the signature, in Triton's metadata and in its answers: the batch
    dimension first when the model batches, and a tensor shaped [batch] alone as [batch, 1] (_set_dims declares it
    [1] with a reshape, and Triton shows and answers the declared dims). The deployment page shows this."""
    if not batched:
        return list(dims)
    return [-1, *(list(dims[1:]) or [1])]


def _set_dims(entry: mc.ModelInput | mc.ModelOutput, tensor: Tensor, batched: bool) -> None:
    dims = list(tensor.dims[1:] if batched else tensor.dims)
    if batched and not dims:
        # A tensor shaped [batch] alone: Triton wants non-empty dims, so declare [1] and let reshape drop it.
        entry.dims.append(1)
        entry.reshape.SetInParent()
    else:
        entry.dims.extend(dims)


def _add_warmup(config: mc.ModelConfig, m: ServedModel) -> None:
    warmup = m.warmup or Warmup()
    kind = warmup.data
    sample = config.model_warmup.add(name=f"{kind}_data", batch_size=warmup.batch_size, count=warmup.count)
    for entry in config.input:
        # Warmup needs concrete shapes: a dynamic dimension gets size 1.
        data = mc.ModelWarmup.Input(data_type=entry.data_type, dims=[d if d > 0 else 1 for d in entry.dims])
        # Triton generates no random strings: BYTES inputs always get zero data.
        if kind == "random" and entry.data_type != mc.TYPE_STRING:
            data.random_data = True
        else:
            data.zero_data = True
        sample.inputs[entry.name].CopyFrom(data)


def _write_artifact(m: ServedModel, target: Target, version_dir: Path, *, scratch: Path, limits: ArchiveLimits,
                    python_models: bool = False) -> None:
    fmt = formats.get(m.format)  # validate_served_model refuses unknown formats
    if fmt.write_artifact is None:
        return  # Triton needs the version directory, empty for an ensemble.
    assert m.artifact_path is not None  # validated
    if python_wrapped(m, target, python_models):
        assert fmt.local.wrapper is not None
        shutil.copyfile(fmt.local.wrapper, version_dir / "model.py")
        for module in fmt.local.modules:
            shutil.copyfile(module, version_dir / module.name)
    try:
        fmt.write_artifact(Path(m.artifact_path), version_dir, scratch, limits)
    except formats.LayoutError as exc:
        raise _artifact_error(m, str(exc)) from None
    shutil.rmtree(scratch, ignore_errors=True)


def _artifact_error(m: ServedModel, message: str) -> RenderError:
    return RenderError({f"{m.name}.artifact_path": [message]})


def _swap_in(staging: Path, out_dir: Path) -> None:
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        out_dir.rename(old)
        staging.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(out_dir)
    # mkdtemp makes the directory 0700; a server running as another user must be able to read the repository.
    out_dir.chmod(0o755)
