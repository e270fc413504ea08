"""Values the renderer's and the spec validation's tests build by hand (a fixture module, not a test file: nothing here
is collected)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from deployments.spec import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    ServedModel,
)
from modelport.core.definitions import PipelineDefinition
from modelport.core.signature import Signature, Tensor


def steps(items: Iterable[EnsembleStep]) -> PipelineDefinition:
    """A pipeline's definition with these steps (the pipeline's own signature is the renderer's concern nowhere)."""
    return PipelineDefinition(signature=Signature(), steps=tuple(items))


BATCHED = Signature(inputs=(Tensor("x", "FP32", (-1, 4)),), outputs=(Tensor("y", "FP32", (-1, 3)),))


def model(**changes: object) -> ServedModel:
    base = ServedModel(
        name="classifier",
        version=1,
        format="onnx",
        signature=BATCHED,
        max_batch_size=8,
        dynamic_batching=DynamicBatching(max_queue_delay_microseconds=1000, preferred_batch_size=(4, 8)),
        instance_group=InstanceGroup(count=2),
        artifact_path=Path("/artifacts/model.onnx"),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
