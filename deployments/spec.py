"""What a deployment serves, independent of Django: the input of the Triton repository renderer.

A `RepositorySpec` holds one `ServedModel` per Triton model. `validate_served_model()` checks one model against a
target runtime ("local": the tritonserver from nvidia-pytriton on this machine; "kubernetes": the official Triton
image) and returns errors per field, so a form or serializer can show each message beside its field.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from deployments.model_entry import DynamicBatching as DynamicBatching  # the renderer's callers find them here too
from deployments.model_entry import EnsembleStep as EnsembleStep
from deployments.model_entry import InstanceGroup as InstanceGroup
from deployments.model_entry import InstanceKind as InstanceKind
from deployments.model_entry import ModelEntry
from deployments.model_entry import Warmup as Warmup
from modelport.core import formats
from modelport.core.frameworks import missing_framework_message
from modelport.core.signature import Signature

Target = Literal["local", "kubernetes"]

TARGETS: tuple[str, ...] = ("local", "kubernetes")
# What each format is and how each target serves it: modelport.core.formats.
FORMATS: tuple[str, ...] = tuple(formats.REGISTRY)

# Limits a user may choose. Triton itself accepts more; these keep one deployment from starving the host.
MAX_QUEUE_DELAY_MICROSECONDS = 10_000_000
MIN_INSTANCE_COUNT = 1
MAX_INSTANCE_COUNT = 16
# Used when inspection of the artifact found no limit of its own (a TensorRT plan's profile may give one).
DEFAULT_MAX_BATCH_SIZE = formats.DEFAULT_MAX_BATCH_SIZE

# Triton uses the model name as a directory name and in URLs (/v2/models/<name>). No ".": validate_repository()
# keys errors "<model name>.<field>", which callers split at the first ".".
_MODEL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")  # fullmatch: "$" lets a trailing newline through

WARMUP_KEYS = frozenset({"batch_size", "count", "data"})
WARMUP_DATA = ("zero", "random")
MAX_WARMUP_COUNT = 100


@dataclass(frozen=True)
class ServedModel(ModelEntry):
    """A revision's entry as the renderer takes it: the one model value, and what rendering adds to it."""

    # The stored artifact as a local file; the renderer copies or extracts it. None only for ensembles.
    artifact_path: Path | None = None

    @classmethod
    def of(cls, entry: ModelEntry, artifact_path: Path | None) -> ServedModel:
        return cls(**{f.name: getattr(entry, f.name) for f in fields(ModelEntry)}, artifact_path=artifact_path)


@dataclass(frozen=True)
class RepositorySpec:
    models: tuple[ServedModel, ...]


@dataclass(frozen=True)
class ServingDefaults:
    max_batch_size: int
    dynamic_batching: DynamicBatching | None
    instance_group: InstanceGroup


def defaults_for(signature: Signature, detected_max_batch_size: int | None) -> ServingDefaults:
    """Starting values for the deploy form, from the signature and what inspection found in the artifact."""
    if not signature.has_batch_dim:
        # Without a dynamic first dimension on every tensor Triton cannot stack requests.
        return ServingDefaults(max_batch_size=0, dynamic_batching=None, instance_group=InstanceGroup())
    max_batch = detected_max_batch_size if detected_max_batch_size and detected_max_batch_size > 0 else None
    # A queue delay of 0 adds no latency to a lone request; under load Triton still batches whatever queued
    # while the instances were busy.
    return ServingDefaults(
        max_batch_size=max_batch or DEFAULT_MAX_BATCH_SIZE,
        dynamic_batching=DynamicBatching(max_queue_delay_microseconds=0),
        instance_group=InstanceGroup(),
    )


def local_format_error(fmt: str, *, local_frameworks: Collection[str] = frozenset()) -> str | None:
    """Why the local runtime cannot serve `fmt` given the frameworks of its runtime env, or None when it can."""
    local = formats.get(fmt).local if fmt in formats.REGISTRY else None
    if local is not None and local.refused:
        return local.refused
    missing = missing_framework_message(fmt, frozenset(local_frameworks))
    if missing is not None:
        # TorchScript and SavedModels run locally through generated python-backend models (modelport/core/backends/),
        # which need the framework in the runtime env (modelport.core.frameworks).
        return f"{local.noun if local is not None and local.noun else fmt} cannot be served locally: {missing}"
    return None


def validate_served_model(
    m: ServedModel, target: str, *, local_frameworks: Collection[str] = frozenset()
) -> dict[str, list[str]]:
    """Field-level errors (empty when `m` can be served on `target`)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}: use one of {TARGETS}")
    errors: dict[str, list[str]] = {}

    def add(key: str, message: str) -> None:
        errors.setdefault(key, []).append(message)

    if not _MODEL_NAME_RE.fullmatch(m.name):
        add(
            "name",
            "use 1-128 letters, digits, '_' or '-', starting with a letter or digit "
            "(Triton uses the name as a directory and in URLs)",
        )
    if m.version < 1:
        add("version", "the version must be 1 or more")

    if m.format not in FORMATS:
        add("format", f"unknown format {m.format!r}: use one of {', '.join(FORMATS)}")
    elif target == "local":
        reason = local_format_error(m.format, local_frameworks=local_frameworks)
        if reason:
            add("format", reason)
        elif (check := formats.get(m.format).local.signature_problem) is not None and (problem := check(m.signature)):
            add("signature", problem)

    if m.format == formats.ENSEMBLE:
        if not m.ensemble_steps:
            add("ensemble_steps", "an ensemble needs at least one step")
        for i, step in enumerate(m.ensemble_steps):
            if step.model == m.name:
                add(f"ensemble_steps[{i}].model", "an ensemble cannot call itself")
            if step.version < 1 and step.version != -1:
                add(f"ensemble_steps[{i}].version", "use a version of 1 or more, or -1 for the latest")
            if not step.input_map or not step.output_map:
                add(f"ensemble_steps[{i}]", "each step needs an input_map and an output_map")
        if m.dynamic_batching is not None:
            add("dynamic_batching", "an ensemble has no dynamic batching of its own: set it on its step models")
        # Triton runs an ensemble's steps in the steps' own instances; the renderer writes no instance group for
        # the ensemble, so a count or kind given for it would be accepted and silently not applied.
        if m.instance_group.count != 1:
            add("instance_group.count", "an ensemble runs no instances of its own (Triton runs each step in the "
                                        "step model's instances): leave it at 1 and set instances on its step models")
        if m.instance_group.kind != "cpu" or m.instance_group.gpus:
            add("instance_group.kind", "an ensemble runs no instances of its own: set the instance kind and GPUs "
                                       "on its step models")
    elif m.artifact_path is None:
        add("artifact_path", "the model has no stored artifact")

    if m.signature.is_empty:
        add("signature", "the signature needs at least one input and one output")

    _validate_batching(m, add)
    _validate_instances(m, target, add)
    if m.warmup is not None:
        _validate_warmup(m, add)
    return errors


def _validate_batching(m: ServedModel, add: Any) -> None:
    if m.max_batch_size < 0:
        add("max_batch_size", "max_batch_size cannot be negative")
    elif m.max_batch_size > 0 and not m.signature.has_batch_dim:
        add(
            "max_batch_size",
            "max_batch_size must be 0: batching needs a dynamic first dimension (-1) on every input and output",
        )
    db = m.dynamic_batching
    if db is None:
        return
    if m.max_batch_size <= 0 and m.format != formats.ENSEMBLE:
        add("dynamic_batching", "dynamic batching needs max_batch_size greater than 0")
    delay = db.max_queue_delay_microseconds
    if not 0 <= delay <= MAX_QUEUE_DELAY_MICROSECONDS:
        add(
            "dynamic_batching.max_queue_delay_microseconds",
            f"the queue delay must be between 0 and {MAX_QUEUE_DELAY_MICROSECONDS:,} µs (10 s), got {delay}",
        )
    for size in db.preferred_batch_size:
        if size <= 0:
            add("dynamic_batching.preferred_batch_size", f"preferred batch sizes must be greater than 0, got {size}")
        elif size > m.max_batch_size:
            add(
                "dynamic_batching.preferred_batch_size",
                f"preferred batch size {size} is larger than max_batch_size {m.max_batch_size}",
            )
    if len(set(db.preferred_batch_size)) != len(db.preferred_batch_size):
        add("dynamic_batching.preferred_batch_size", "preferred batch sizes must not repeat")


def _validate_instances(m: ServedModel, target: str, add: Any) -> None:
    group = m.instance_group
    if not MIN_INSTANCE_COUNT <= group.count <= MAX_INSTANCE_COUNT:
        add(
            "instance_group.count",
            f"the instance count must be between {MIN_INSTANCE_COUNT} and {MAX_INSTANCE_COUNT}, got {group.count}",
        )
    if group.kind not in ("cpu", "gpu"):
        add("instance_group.kind", f"unknown instance kind {group.kind!r}: use 'cpu' or 'gpu'")
    elif group.kind == "gpu" and target == "local":
        add("instance_group.kind", "the local runtime has no GPU: use kind 'cpu'")
    if group.gpus:
        if group.kind != "gpu":
            add("instance_group.gpus", "GPU ids can only be given with kind 'gpu'")
        if any(g < 0 for g in group.gpus):
            add("instance_group.gpus", "GPU ids cannot be negative")
        if len(set(group.gpus)) != len(group.gpus):
            add("instance_group.gpus", "GPU ids must not repeat")


def _validate_warmup(m: ServedModel, add: Any) -> None:
    warmup = m.warmup or Warmup()
    if warmup.batch_size < 1:
        add("warmup.batch_size", "the warmup batch size must be an integer of 1 or more")
    elif warmup.batch_size > max(1, m.max_batch_size):
        add("warmup.batch_size", f"the warmup batch size must not exceed max_batch_size {max(1, m.max_batch_size)}")
    if not 1 <= warmup.count <= MAX_WARMUP_COUNT:
        add("warmup.count", f"the warmup count must be an integer between 1 and {MAX_WARMUP_COUNT}")
    if warmup.data not in WARMUP_DATA:
        add("warmup.data", f"warmup data must be one of {WARMUP_DATA}")


def validate_repository(
    spec: RepositorySpec, target: str, *, local_frameworks: Collection[str] = frozenset()
) -> dict[str, list[str]]:
    """Errors of every model, keyed "<model name>.<field>", plus those across models under "models"."""
    errors: dict[str, list[str]] = {}
    names = [m.name for m in spec.models]
    for name in sorted({n for n in names if names.count(n) > 1}):
        errors.setdefault("models", []).append(f"model name {name!r} is used more than once")
    by_name = {m.name: m for m in spec.models}
    for m in spec.models:
        for key, messages in validate_served_model(m, target, local_frameworks=local_frameworks).items():
            errors.setdefault(f"{m.name}.{key}", []).extend(messages)
        for i, step in enumerate(m.ensemble_steps):
            step_model = by_name.get(step.model)
            if step_model is None:
                errors.setdefault(f"{m.name}.ensemble_steps[{i}].model", []).append(
                    f"step model {step.model!r} is not part of this repository"
                )
            elif step.version != -1 and step.version != step_model.version:
                errors.setdefault(f"{m.name}.ensemble_steps[{i}].version", []).append(
                    f"the repository serves {step.model!r} version {step_model.version}, not {step.version}"
                )
            elif step_model.max_batch_size < m.max_batch_size:
                # Triton refuses such an ensemble: it would hand the step batches larger than it accepts.
                errors.setdefault(f"{m.name}.max_batch_size", []).append(
                    f"an ensemble's max_batch_size ({m.max_batch_size}) cannot exceed that of its step model "
                    f"{step.model!r} ({step_model.max_batch_size})"
                )
    return errors
