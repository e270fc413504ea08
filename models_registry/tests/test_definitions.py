"""Each format's definition is read once into its typed value (modelport/core/definitions.py): every shape the portal
ever stored loads and is written back as it was, rows that lack a key load with its default, and what is no
definition is refused with the part named, never a KeyError or a 500."""

from __future__ import annotations

from typing import Any

import pytest

from deployments.model_entry import ModelEntry, SpecError
from modelport.core import formats
from modelport.core.definitions import (
    DefinitionError,
    PipelineDefinition,
    PythonDefinition,
    SavedModelDefinition,
    TorchScriptDefinition,
)
from models_registry.samples import digits_pipeline_definition
from tests.support.people import Person

STORED: list[tuple[str, dict[str, Any]]] = [
    ("ensemble", digits_pipeline_definition()),
    ("python", {"requirements": ["numpy", "pillow>=10"]}),
    ("python", {"requirements": [], "trial_call": "passed: one call on zeros answered every declared output"}),
    ("tensorflow_savedmodel", {"signature_def": "serving_default", "signature_defs": ["predict", "serving_default"]}),
    ("torchscript", {"trial_run": "passed: one call on zeros matched the declared signature"}),
    ("torchscript", {}),
]


@pytest.mark.parametrize(("fmt", "data"), STORED)
def test_every_stored_shape_loads_and_is_written_back_as_it_was(fmt: str, data: dict[str, Any]) -> None:
    definition = formats.definition_from_json(fmt, data)
    assert definition is not None and definition.to_json() == data


def test_each_format_reads_its_own_definition_and_the_others_have_none() -> None:
    assert isinstance(formats.definition_from_json("ensemble", digits_pipeline_definition()), PipelineDefinition)
    assert isinstance(formats.definition_from_json("python", {}), PythonDefinition)
    assert isinstance(formats.definition_from_json("tensorflow_savedmodel", {}), SavedModelDefinition)
    assert isinstance(formats.definition_from_json("torchscript", {}), TorchScriptDefinition)
    assert formats.definition_from_json("onnx", {"anything": 1}) is None
    assert formats.definition_from_json("python", None) is None
    readers = {name for name, fmt in formats.REGISTRY.items() if fmt.read_definition is not None}
    assert readers == {"ensemble", "python", "tensorflow_savedmodel", "torchscript"}


def test_a_row_that_lacks_a_key_loads_with_its_default() -> None:
    """Rows written before a note existed (or by hand, as fixtures do)."""
    assert formats.definition_from_json("python", {}) == PythonDefinition(requirements=(), trial_call="")
    assert formats.definition_from_json("tensorflow_savedmodel", {"signature_def": "predict"}) == (
        SavedModelDefinition(signature_def="predict", signature_defs=()))
    steps_only = formats.definition_from_json("ensemble", {"steps": [
        {"model": "digits", "version": 1, "input_map": {"input": "x"}, "output_map": {"output": "y"}}]})
    assert isinstance(steps_only, PipelineDefinition) and steps_only.signature.is_empty
    assert steps_only.step_references == (("digits", 1),)
    assert formats.definition_from_json("ensemble", steps_only.to_json()) == steps_only


@pytest.mark.parametrize(("fmt", "data", "message"), [
    ("ensemble", [], "is a JSON object"),
    ("ensemble", {"steps": "digits"}, "definition.steps must be a list"),
    ("ensemble", {"steps": [7]}, "definition.steps[0] must be a JSON object"),
    ("ensemble", {"steps": [{"model": "digits", "input_map": {}, "output_map": {}}]}, "definition.steps[0] has no"),
    ("ensemble", {"steps": [{"model": "d", "version": "one", "input_map": {}, "output_map": {}}]},
     "definition.steps[0]"),
    ("ensemble", {"steps": [{"model": "d", "version": 1, "input_map": [], "output_map": {}}]},
     "definition.steps[0].input_map must be a JSON object"),
    ("ensemble", {"inputs": [{"name": "x", "datatype": "NOPE", "dims": [1]}], "steps": []}, "definition:"),
    ("python", {"requirements": "numpy"}, "definition.requirements must be a list"),
    ("tensorflow_savedmodel", {"signature_defs": 3}, "definition.signature_defs must be a list"),
])
def test_what_is_no_definition_is_refused_with_the_part_named(fmt: str, data: Any, message: str) -> None:
    with pytest.raises(DefinitionError) as raised:
        formats.definition_from_json(fmt, data)
    assert message in str(raised.value)


def test_a_revision_entry_with_a_broken_definition_is_a_spec_error_naming_the_model() -> None:
    entry = {"name": "p", "format": "ensemble", "version": 1, "definition": {"steps": [{"model": "x"}]}}
    with pytest.raises(SpecError, match=r"models\[0\] \(p\): definition.steps\[0\] has no"):
        ModelEntry.from_json(entry)


def test_a_stored_version_reads_its_column_as_the_typed_definition(alice: Person) -> None:
    from models_registry.models import Model, ModelVersion

    model = Model.objects.create(team=alice.team, name="digits-pipeline")
    version = ModelVersion.objects.create(model=model, number=1, format="ensemble",
                                          definition=digits_pipeline_definition(), status=ModelVersion.Status.READY)
    version.refresh_from_db()
    definition = version.parsed_definition
    assert isinstance(definition, PipelineDefinition)
    assert definition.to_json() == version.definition
    assert version.step_references == (("preprocess", 1), ("digits", 1), ("postprocess", 1))
    assert version.requirements == []
    python = ModelVersion.objects.create(model=model, number=2, format="python",
                                         definition={"requirements": ["numpy"]})
    assert python.requirements == ["numpy"] and python.step_references == ()
