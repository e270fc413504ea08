"""One served model of a revision, as one typed value (issue 22: it existed three times, copied field by field).

`ModelEntry` is what a revision's spec holds per model (deployments.revision_spec reads and writes the stored JSON
through it), what planning builds, what the pages and the API show; the renderer's `deployments.spec.ServedModel`
is the same entry plus where its artifact is. A deploy request (the API's, the web form's, the CLI's through the
API, a tune's) holds the same class: an *asked* entry (`ModelEntry.asked`) names the model, perhaps a version, and
the settings given; what it leaves to the model's defaults is in `defaults`, and planning fills it in from the model
version. Plain: no Django, no runtime.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from modelport.core import formats
from modelport.core.definitions import (
    Definition,
    PipelineDefinition,
    PythonDefinition,
    SavedModelDefinition,
    definition_to_json,
)
from modelport.core.definitions import EnsembleStep as EnsembleStep  # where the spec's readers have found it
from modelport.core.signature import Signature, signature_from_json

InstanceKind = Literal["cpu", "gpu"]
# The settings whose default depends on the model version (its signature, format and inspected batch limit), so an
# asked entry may leave them to planning. The others have one default for every model: the entry's own.
DefaultedSetting = Literal["max_batch_size", "dynamic_batching"]
DEFAULTED_SETTINGS: frozenset[DefaultedSetting] = frozenset({"max_batch_size", "dynamic_batching"})
LATEST = 0  # an asked entry's version when none is given: the latest ready one


class _Default(enum.Enum):
    DEFAULT = "default"


DEFAULT = _Default.DEFAULT  # ModelEntry.asked(): a setting left to the model's default (as opposed to None: "off")


class SpecError(ValueError):
    """Stored spec JSON that cannot be read; the message says which part."""


@dataclass(frozen=True)
class DynamicBatching:
    max_queue_delay_microseconds: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    preserve_ordering: bool = False


@dataclass(frozen=True)
class InstanceGroup:
    count: int = 1
    kind: InstanceKind = "cpu"
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class Warmup:
    """Triton's model warm-up: `count` requests of `batch_size` with zero or random data before the model serves."""

    batch_size: int = 1
    count: int = 1
    data: str = "zero"  # one of WARMUP_DATA

    def to_json(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "count": self.count, "data": self.data}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Warmup:
        """A stored or parsed warm-up; what it leaves out is the default ({"batch_size": 2} was written so).
        TypeError/ValueError for what is no warm-up: the API's serializer refuses such input before."""
        if not isinstance(data, Mapping):
            raise TypeError(f"a warmup is an object, not {type(data).__name__}")
        return cls(batch_size=int(data.get("batch_size", 1)), count=int(data.get("count", 1)),
                   data=str(data.get("data", "zero")))


@dataclass(frozen=True)
class ModelEntry:
    """One served model version with its serving settings."""

    name: str  # the Triton model name (the model's name in the registry: a deployment serves one version of each)
    version: int
    format: str
    signature: Signature
    sha256: str = ""  # the stored artifact ("" for a pipeline, which has none)
    version_id: int | None = None
    max_batch_size: int = 0
    dynamic_batching: DynamicBatching | None = None
    instance_group: InstanceGroup = field(default_factory=InstanceGroup)
    response_cache: bool = False
    warmup: Warmup | None = None  # None: no warmup
    # The version's definition when the revision was made (modelport/core/definitions.py): a pipeline's steps, a
    # SavedModel's signature_def, a python model's requirements. Copied, not referenced: the revision renders the
    # same repository forever.
    definition: Definition | None = None
    # An asked entry's settings left to the model's defaults (planning fills them in); a planned entry has none.
    defaults: frozenset[DefaultedSetting] = frozenset()
    # The version streams (a decoupled python model, models_registry.models.ModelVersion.decoupled): rendered with
    # Triton's decoupled transaction policy, and answered by the gateway on /generate_stream, not /infer.
    decoupled: bool = False
    # The version's chat template (models_registry.models.ModelVersion.chat_template): copied, so that the gateway's
    # route cache has it with the rest of the revision and the OpenAI-compatible chat endpoint renders it without a
    # query. "" for the default one.
    chat_template: str = ""

    @classmethod
    def asked(cls, name: str, *, version: int | None = None, max_batch_size: int | None = None,
              dynamic_batching: DynamicBatching | None | Literal[_Default.DEFAULT] = DEFAULT,
              instance_group: InstanceGroup | None = None, response_cache: bool = False,
              warmup: Warmup | None = None) -> ModelEntry:
        """A model as a deploy request asks for it: `version` None for the latest ready one, `max_batch_size` None
        and `dynamic_batching` DEFAULT for the model's defaults (None batching: off). Its format, signature and
        artifact are the model version's: planning takes them from the registry, not from here."""
        defaults: set[DefaultedSetting] = set()
        if max_batch_size is None:
            defaults.add("max_batch_size")
        if dynamic_batching is DEFAULT:
            defaults.add("dynamic_batching")
        return cls(name=name, version=LATEST if version is None else version, format="", signature=Signature(),
                   max_batch_size=max_batch_size or 0,
                   dynamic_batching=None if dynamic_batching is DEFAULT else dynamic_batching,
                   instance_group=instance_group or InstanceGroup(), response_cache=response_cache, warmup=warmup,
                   defaults=frozenset(defaults))

    @property
    def asked_version(self) -> int | None:
        """The version asked for; None: the latest ready one."""
        return None if self.version == LATEST else self.version

    def left_to_default(self, setting: DefaultedSetting) -> bool:
        return setting in self.defaults

    @property
    def model(self) -> str:
        """The registry's model name (the same as `name` in every spec so far)."""
        return self.name

    @property
    def is_pipeline(self) -> bool:
        return self.format == formats.ENSEMBLE

    @property
    def ensemble_steps(self) -> tuple[EnsembleStep, ...]:
        return self.definition.steps if isinstance(self.definition, PipelineDefinition) else ()

    @property
    def step_references(self) -> tuple[tuple[str, int], ...]:
        """(model, version) of each step of a pipeline, in order."""
        return tuple((step.model, step.version) for step in self.ensemble_steps)

    @property
    def requirements(self) -> tuple[str, ...]:
        """A python model's requirements lines (models_registry.models.ModelVersion.requirements, as they were)."""
        return self.definition.requirements if isinstance(self.definition, PythonDefinition) else ()

    @property
    def signature_def(self) -> str:
        return self.definition.signature_def if isinstance(self.definition, SavedModelDefinition) else ""

    def to_json(self) -> dict[str, Any]:
        if self.defaults:
            # Only planned entries are stored or shown: an asked one's zeros would read as settings chosen.
            raise ValueError(f"{self.name}: an asked entry has no JSON of its own; plan it first")
        batching = self.dynamic_batching
        group = self.instance_group
        return {
            "name": self.name,
            "model": self.name,
            "version": self.version,
            "version_id": self.version_id,
            "format": self.format,
            "sha256": self.sha256,
            "signature": self.signature.to_json() if not self.signature.is_empty else {},
            "max_batch_size": self.max_batch_size,
            "dynamic_batching": {
                "max_queue_delay_microseconds": batching.max_queue_delay_microseconds,
                "preferred_batch_size": list(batching.preferred_batch_size),
                "preserve_ordering": batching.preserve_ordering,
            } if batching is not None else None,
            "instance_group": {"count": group.count, "kind": group.kind, "gpus": list(group.gpus)},
            "response_cache": self.response_cache,
            "warmup": self.warmup.to_json() if self.warmup is not None else None,
            "definition": definition_to_json(self.definition),
            # Written only when set: the specs of every model that does not stream keep the JSON they always had.
            **({"decoupled": True} if self.decoupled else {}),
            **({"chat_template": self.chat_template} if self.chat_template else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "models[0]") -> ModelEntry:
        data = json_object(data, where)
        name = data.get("name") or data.get("model")
        if not isinstance(name, str) or not name or "format" not in data or "version" not in data:
            raise SpecError(f"{where} needs a name, a format and a version")
        batching = data.get("dynamic_batching")
        group = json_object(data.get("instance_group") or {}, f"{where}.instance_group")
        version_id = data.get("version_id")
        try:
            return cls(
                name=name,
                version=int(data["version"]),
                format=str(data["format"]),
                signature=signature_from_json(data.get("signature")),
                sha256=str(data.get("sha256") or ""),
                version_id=int(version_id) if version_id is not None else None,
                max_batch_size=int(data.get("max_batch_size") or 0),
                dynamic_batching=DynamicBatching(
                    max_queue_delay_microseconds=int(batching.get("max_queue_delay_microseconds", 0)),
                    preferred_batch_size=tuple(int(s) for s in batching.get("preferred_batch_size") or ()),
                    preserve_ordering=bool(batching.get("preserve_ordering", False)),
                ) if isinstance(batching, Mapping) else None,
                instance_group=InstanceGroup(count=int(group.get("count", 1)), kind=group.get("kind", "cpu"),
                                             gpus=tuple(int(g) for g in group.get("gpus") or ())),
                response_cache=bool(data.get("response_cache", False)),
                warmup=Warmup.from_json(data["warmup"]) if data.get("warmup") is not None else None,
                definition=formats.definition_from_json(str(data["format"]), data.get("definition")),
                decoupled=data.get("decoupled") is True,
                chat_template=str(data.get("chat_template") or ""),
            )
        except (TypeError, ValueError, KeyError) as exc:
            raise SpecError(f"{where} ({name}): {exc}") from None


def json_object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value
