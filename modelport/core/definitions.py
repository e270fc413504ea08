"""Each format's definition, typed: what a model version holds besides its signature and artifact.

A version's `definition` column (models_registry.models.ModelVersion) and the copy a revision keeps of it
(deployments.model_entry.ModelEntry) are JSON; they are read here once, into the format's frozen dataclass, and
written back with `to_json()`, so no reader digs in a mapping with `.get()`:

- ensemble: `PipelineDefinition`, the pipeline's own signature and its steps (models_registry.pipelines checks it
  when it is created);
- python: `PythonDefinition`, the requirements.txt lines inspection parsed, and the trial call's note;
- savedmodel: `SavedModelDefinition`, the SignatureDef served and the servable ones inspection listed;
- torchscript: `TorchScriptDefinition`, the trial run's note.
Other formats have none (None). Each format names its reader (`modelport.core.formats.base.Format.read_definition`);
`modelport.core.formats.definition_from_json(format, data)` reads one.

Old rows load: a key that was not written (a hand-made row, a definition from before a note existed) gets its
default, and the JSON a reader was given is what `to_json()` writes back for every shape the portal ever stored.
A stored definition is the portal's own writing, checked when it was made; what cannot be read is DefinitionError.
Plain: no Django.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from modelport.core.signature import Signature, signature_from_json


class DefinitionError(ValueError):
    """A stored definition that cannot be read; the message says which part."""


class FrozenMap(dict[str, str]):
    """A step's tensor map inside a frozen definition: read-only (no reader changes a revision by accident) and
    hashable, like the dataclasses that hold it."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a definition is immutable")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(json.dumps(self, sort_keys=True))


@dataclass(frozen=True)
class EnsembleStep:
    """One step of an ensemble: maps the step model's tensor names to the ensemble's tensor names."""

    model: str
    version: int  # -1: the latest version Triton has loaded
    input_map: Mapping[str, str]  # step model input name -> ensemble tensor name
    output_map: Mapping[str, str]  # step model output name -> ensemble tensor name

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_map", FrozenMap(self.input_map))
        object.__setattr__(self, "output_map", FrozenMap(self.output_map))

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "version": self.version, "input_map": dict(self.input_map),
                "output_map": dict(self.output_map)}

    @classmethod
    def from_json(cls, data: Any, where: str) -> EnsembleStep:
        data = _object(data, where)
        try:
            return cls(model=str(data["model"]), version=int(data["version"]),
                       input_map={str(k): str(v) for k, v in _object(data["input_map"], f"{where}.input_map").items()},
                       output_map={str(k): str(v)
                                   for k, v in _object(data["output_map"], f"{where}.output_map").items()})
        except KeyError as exc:
            raise DefinitionError(f"{where} has no {exc}") from None
        except (TypeError, ValueError) as exc:
            raise DefinitionError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class PipelineDefinition:
    """An ensemble's definition: its inputs and outputs (`signature`) and its steps, in order."""

    signature: Signature
    steps: tuple[EnsembleStep, ...] = ()

    @property
    def step_references(self) -> tuple[tuple[str, int], ...]:
        """(model, version) of each step, in order."""
        return tuple((step.model, step.version) for step in self.steps)

    def to_json(self) -> dict[str, Any]:
        signature = self.signature.to_json() if not self.signature.is_empty else {}  # steps alone stay so
        return {**signature, "steps": [step.to_json() for step in self.steps]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PipelineDefinition:
        steps = data.get("steps", [])
        if not isinstance(steps, list | tuple):
            raise DefinitionError(f"definition.steps must be a list, got {type(steps).__name__}")
        try:
            # A definition of steps alone (hand-made rows, fixtures) has an empty signature.
            signature = signature_from_json({key: data[key] for key in ("inputs", "outputs") if key in data})
        except ValueError as exc:
            raise DefinitionError(f"definition: {exc}") from None
        return cls(signature=signature,
                   steps=tuple(EnsembleStep.from_json(s, f"definition.steps[{i}]") for i, s in enumerate(steps)))


@dataclass(frozen=True)
class PythonDefinition:
    """A python model's definition: its requirements.txt lines as inspection parsed them (installed when it is
    deployed), and what the trial call at inspection said ("" when it was not run, or not yet recorded)."""

    requirements: tuple[str, ...] = ()
    trial_call: str = ""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"requirements": list(self.requirements)}
        if self.trial_call:
            data["trial_call"] = self.trial_call
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PythonDefinition:
        requirements = data.get("requirements", [])
        if not isinstance(requirements, list | tuple):
            raise DefinitionError(f"definition.requirements must be a list, got {type(requirements).__name__}")
        return cls(requirements=tuple(str(r) for r in requirements), trial_call=str(data.get("trial_call") or ""))


@dataclass(frozen=True)
class SavedModelDefinition:
    """A SavedModel's definition: the key of the SignatureDef served, and every servable key of its MetaGraph."""

    signature_def: str = ""
    signature_defs: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"signature_def": self.signature_def, "signature_defs": list(self.signature_defs)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SavedModelDefinition:
        keys = data.get("signature_defs", [])
        if not isinstance(keys, list | tuple):
            raise DefinitionError(f"definition.signature_defs must be a list, got {type(keys).__name__}")
        return cls(signature_def=str(data.get("signature_def") or ""), signature_defs=tuple(str(k) for k in keys))


@dataclass(frozen=True)
class TorchScriptDefinition:
    """A TorchScript model's definition: what its trial run at inspection said."""

    trial_run: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"trial_run": self.trial_run} if self.trial_run else {}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TorchScriptDefinition:
        return cls(trial_run=str(data.get("trial_run") or ""))


Definition: TypeAlias = PipelineDefinition | PythonDefinition | SavedModelDefinition | TorchScriptDefinition


# What a format names to read its stored definition (the class's `from_json`).
ReadDefinition: TypeAlias = Callable[[Mapping[str, Any]], Definition]


def definition_to_json(definition: Definition | None) -> dict[str, Any] | None:
    return definition.to_json() if definition is not None else None


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise DefinitionError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value
