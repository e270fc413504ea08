"""A revision's spec snapshot (JSON stored on the Revision) and its conversion to the renderer's RepositorySpec.

The snapshot names each served model version and carries every serving setting in effect, defaults filled in, so a
revision renders the same repository forever (it does not follow later changes of the model or of defaults).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from deployments.spec import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    RepositorySpec,
    ServedModel,
    defaults_for,
)
from models_registry.models import ModelVersion
from models_registry.signature import signature_from_json


def served_model_json(version: ModelVersion, settings: dict[str, Any]) -> dict[str, Any]:
    """The snapshot entry for `version` with the user's `settings`; anything not given gets the model's default."""
    signature = version.parsed_signature
    defaults = defaults_for(signature, version.max_batch_size)
    max_batch_size = settings.get("max_batch_size")
    if max_batch_size is None:
        max_batch_size = defaults.max_batch_size
    if "dynamic_batching" in settings:
        batching = settings["dynamic_batching"]
    elif version.format == "ensemble":
        batching = None  # Triton batches an ensemble's steps, each with its own settings, never the ensemble
    else:
        batching = _batching_json(defaults.dynamic_batching) if max_batch_size > 0 else None
    if batching is not None:
        batching = {
            "max_queue_delay_microseconds": int(batching.get("max_queue_delay_microseconds", 0)),
            "preferred_batch_size": [int(s) for s in batching.get("preferred_batch_size", [])],
            "preserve_ordering": bool(batching.get("preserve_ordering", False)),
        }
    group = settings.get("instance_group") or {}
    return {
        "name": version.model.name,
        "model": version.model.name,
        "version": version.number,
        "version_id": version.id,
        "format": version.format,
        "sha256": version.sha256,
        "signature": version.signature,
        "max_batch_size": int(max_batch_size),
        "dynamic_batching": batching,
        "instance_group": {
            "count": int(group.get("count", defaults.instance_group.count)),
            "kind": group.get("kind", defaults.instance_group.kind),
            "gpus": [int(g) for g in group.get("gpus", [])],
        },
        "response_cache": bool(settings.get("response_cache", False)),
        "warmup": settings.get("warmup"),
        "definition": version.definition,
    }


def _batching_json(batching: DynamicBatching | None) -> dict[str, Any] | None:
    if batching is None:
        return None
    return {
        "max_queue_delay_microseconds": batching.max_queue_delay_microseconds,
        "preferred_batch_size": list(batching.preferred_batch_size),
        "preserve_ordering": batching.preserve_ordering,
    }


def served_model(entry: dict[str, Any], artifact_path: Path | None) -> ServedModel:
    batching = entry.get("dynamic_batching")
    group = entry.get("instance_group") or {}
    steps = tuple(
        EnsembleStep(model=s["model"], version=int(s["version"]), input_map=dict(s["input_map"]), output_map=dict(s["output_map"]))
        for s in (entry.get("definition") or {}).get("steps", [])
    ) if entry["format"] == "ensemble" else ()
    return ServedModel(
        name=entry["name"],
        version=int(entry["version"]),
        format=entry["format"],
        signature=signature_from_json(entry.get("signature")),
        max_batch_size=int(entry.get("max_batch_size", 0)),
        dynamic_batching=DynamicBatching(
            max_queue_delay_microseconds=int(batching.get("max_queue_delay_microseconds", 0)),
            preferred_batch_size=tuple(int(s) for s in batching.get("preferred_batch_size", [])),
            preserve_ordering=bool(batching.get("preserve_ordering", False)),
        ) if batching is not None else None,
        instance_group=InstanceGroup(
            count=int(group.get("count", 1)), kind=group.get("kind", "cpu"), gpus=tuple(int(g) for g in group.get("gpus", []))
        ),
        response_cache=bool(entry.get("response_cache", False)),
        warmup=entry.get("warmup"),
        artifact_path=artifact_path,
        ensemble_steps=steps,
        signature_def=str((entry.get("definition") or {}).get("signature_def", ""))
        if entry["format"] == "tensorflow_savedmodel" else "",
    )


def repository_spec(spec: dict[str, Any], artifact_for: Callable[[dict[str, Any]], Path | None]) -> RepositorySpec:
    """`artifact_for(entry)` gives the local file of an entry's stored artifact (None for ensembles)."""
    return RepositorySpec(models=tuple(served_model(entry, artifact_for(entry)) for entry in spec["models"]))
