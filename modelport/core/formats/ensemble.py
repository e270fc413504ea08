"""Pipelines: Triton ensembles, defined by their steps (models_registry.pipelines), never uploaded as a file. The
ensemble's version directory stays empty; both targets serve it with Triton's ensemble scheduler."""

from __future__ import annotations

from modelport.core.definitions import PipelineDefinition
from modelport.core.formats.base import Format, NativeBackend, register

NAME = "ensemble"

FORMAT = register(Format(
    name=NAME,
    label="Pipeline (Triton ensemble)",
    short_label="pipeline",
    plural="pipelines",
    description="a pipeline",
    upload_as="",
    needs_signature=False,
    native=NativeBackend(platform="ensemble"),
    read_definition=PipelineDefinition.from_json,
))
