"""A revision's spec: what one revision of a deployment serves and how, as one typed value.

Every reader holds a `RevisionSpec` (planning builds it, the Revision row stores it, the renderer, the manifests,
the runtimes, the API and the pages read it); nobody interprets the stored JSON but `RevisionSpec.from_json`, and
nothing writes it but `to_json`. Frozen dataclasses rather than pydantic: the spec is built by our own planning from
input that the API's serializers and the web forms have already parsed and bounded, so what this class needs is a
stable shape with a version, not a second validator of untrusted input; dataclasses add no dependency, are typed for
mypy as they stand, and match the renderer's own value objects in deployments.spec.

The snapshot names each served model version and carries every serving setting in effect, defaults filled in, so a
revision renders the same repository forever (it does not follow later changes of the model or of defaults).

Versions of the stored JSON (`spec_version`):
- 1 (no `spec_version` key; written until issue 13): the same keys, with empty strings for quantities not given
  (`"cpu": ""`) in revisions written before quantities were checked, and entries whose `instance_group` or
  `dynamic_batching` may lack keys (hand-made in tests and fixtures).
- 2: `spec_version: 2`; resources hold only what was given (`gpu` always).
A reader meets a newer version only after a downgrade; it refuses it rather than dropping what it does not know.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployments.spec import DynamicBatching, EnsembleStep, InstanceGroup, RepositorySpec, ServedModel
from models_registry import formats
from models_registry.signature import Signature, signature_from_json

SPEC_VERSION = 2


class SpecError(ValueError):
    """Stored spec JSON that cannot be read; the message says which part."""


@dataclass(frozen=True)
class Resources:
    """Per Triton server (a local process, or a pod): Kubernetes quantities, "" for the runtime's default."""

    cpu: str = ""
    memory: str = ""
    gpu: int = 0
    gpu_type: str = ""
    mig_profile: str = ""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"gpu": self.gpu}
        for key in ("cpu", "memory", "gpu_type", "mig_profile"):
            if getattr(self, key):
                data[key] = getattr(self, key)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Resources:
        data = _mapping(data or {}, "resources")
        return cls(cpu=str(data.get("cpu") or ""), memory=str(data.get("memory") or ""),
                   gpu=int(data.get("gpu") or 0), gpu_type=str(data.get("gpu_type") or ""),
                   mig_profile=str(data.get("mig_profile") or ""))


@dataclass(frozen=True)
class Autoscaling:
    """Kubernetes only: a HorizontalPodAutoscaler between min_replicas and max_replicas."""

    min_replicas: int
    max_replicas: int
    target: int  # cpu: percent of the request; queue_time: microseconds per request
    metric: str = "cpu"  # "cpu" | "queue_time"

    def to_json(self) -> dict[str, Any]:
        return {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas, "metric": self.metric,
                "target": self.target}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Autoscaling:
        data = _mapping(data, "autoscaling")
        return cls(min_replicas=int(data["min_replicas"]), max_replicas=int(data["max_replicas"]),
                   target=int(data["target"]), metric=str(data.get("metric", "cpu")))


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
    # {"batch_size": int, "count": int, "data": "zero" | "random"} (deployments.spec validates it); None: no warmup.
    warmup: Mapping[str, Any] | None = None
    # The version's definition when the revision was made, as models_registry keeps it: a pipeline's steps, a
    # SavedModel's signature_def, a python model's requirements. Copied, not referenced: the revision renders the
    # same repository forever.
    definition: Mapping[str, Any] | None = None

    @property
    def model(self) -> str:
        """The registry's model name (the same as `name` in every spec so far)."""
        return self.name

    @property
    def is_pipeline(self) -> bool:
        return self.format == formats.ENSEMBLE

    @property
    def ensemble_steps(self) -> tuple[EnsembleStep, ...]:
        if not self.is_pipeline:
            return ()
        return tuple(EnsembleStep(model=str(s["model"]), version=int(s["version"]), input_map=dict(s["input_map"]),
                                  output_map=dict(s["output_map"]))
                     for s in (self.definition or {}).get("steps", []))

    @property
    def step_references(self) -> tuple[tuple[str, int], ...]:
        """(model, version) of each step of a pipeline, in order."""
        return tuple((step.model, step.version) for step in self.ensemble_steps)

    @property
    def requirements(self) -> tuple[str, ...]:
        """A python model's requirements lines (models_registry.models.ModelVersion.requirements, as they were)."""
        if self.format != formats.PYTHON or not isinstance(self.definition, Mapping):
            return ()
        return tuple(str(r) for r in self.definition.get("requirements", ()))

    @property
    def signature_def(self) -> str:
        if self.format != formats.SAVEDMODEL:
            return ""
        return str((self.definition or {}).get("signature_def", ""))

    def served_model(self, artifact_path: Path | None) -> ServedModel:
        """The renderer's view of this entry, its artifact at `artifact_path` (None for a pipeline)."""
        return ServedModel(
            name=self.name, version=self.version, format=self.format, signature=self.signature,
            max_batch_size=self.max_batch_size, dynamic_batching=self.dynamic_batching,
            instance_group=self.instance_group, response_cache=self.response_cache,
            warmup=dict(self.warmup) if self.warmup is not None else None, artifact_path=artifact_path,
            ensemble_steps=self.ensemble_steps, signature_def=self.signature_def,
        )

    def to_json(self) -> dict[str, Any]:
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
            "warmup": _plain(self.warmup),
            "definition": _plain(self.definition),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "models[0]") -> ModelEntry:
        data = _mapping(data, where)
        name = data.get("name") or data.get("model")
        if not isinstance(name, str) or not name or "format" not in data or "version" not in data:
            raise SpecError(f"{where} needs a name, a format and a version")
        batching = data.get("dynamic_batching")
        group = _mapping(data.get("instance_group") or {}, f"{where}.instance_group")
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
                warmup=_frozen(data.get("warmup")),
                definition=_frozen(data.get("definition")),
            )
        except (TypeError, ValueError, KeyError) as exc:
            raise SpecError(f"{where} ({name}): {exc}") from None


@dataclass(frozen=True)
class RevisionSpec:
    runtime: str  # Deployment.Runtime: "local" or "kubernetes"
    models: tuple[ModelEntry, ...]
    replicas: int = 1
    resources: Resources = field(default_factory=Resources)
    autoscaling: Autoscaling | None = None
    # A Triton image an operator chose for this revision (Kubernetes); "": the configured one.
    image: str = ""

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    def entry(self, name: str) -> ModelEntry | None:
        return next((m for m in self.models if m.name == name), None)

    def repository(self, artifact_for: Callable[[ModelEntry], Path | None]) -> RepositorySpec:
        """The renderer's input; `artifact_for(entry)` gives the local file of an entry's stored artifact."""
        return RepositorySpec(models=tuple(m.served_model(artifact_for(m) if m.sha256 else None)
                                           for m in self.models))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "spec_version": SPEC_VERSION,
            "runtime": self.runtime,
            "replicas": self.replicas,
            "resources": self.resources.to_json(),
            "models": [m.to_json() for m in self.models],
        }
        if self.autoscaling is not None:
            data["autoscaling"] = self.autoscaling.to_json()
        if self.image:
            data["image"] = self.image
        return data

    @classmethod
    def from_json(cls, data: Any) -> RevisionSpec:
        """Any spec a Modelport ever stored (see the module's docstring), or SpecError."""
        data = _mapping(data, "spec")
        version = data.get("spec_version", 1)
        if not isinstance(version, int) or version < 1:
            raise SpecError(f"spec_version must be a positive integer, got {version!r}")
        if version > SPEC_VERSION:
            raise SpecError(f"this spec was written by a newer Modelport (spec_version {version}; this one reads "
                            f"up to {SPEC_VERSION})")
        models = data.get("models", [])
        if not isinstance(models, list):
            raise SpecError("spec.models must be a list")
        autoscaling = data.get("autoscaling")
        try:
            return cls(
                runtime=str(data.get("runtime") or "local"),
                models=tuple(ModelEntry.from_json(m, f"models[{i}]") for i, m in enumerate(models)),
                replicas=int(data.get("replicas") or 1),
                resources=Resources.from_json(data.get("resources")),
                autoscaling=Autoscaling.from_json(autoscaling) if autoscaling else None,
                image=str(data.get("image") or ""),
            )
        except (TypeError, ValueError, KeyError) as exc:
            if isinstance(exc, SpecError):
                raise
            raise SpecError(f"spec: {exc}") from None

    @classmethod
    def coerce(cls, value: Any) -> RevisionSpec:
        return value if isinstance(value, RevisionSpec) else cls.from_json(value)


class _FrozenDict(dict[str, Any]):
    """A JSON object inside the frozen spec: read-only, so that no reader changes a revision by accident."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a revision's spec is immutable")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(json.dumps(self, sort_keys=True))


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return _FrozenDict({str(k): _frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _plain(value: Any) -> Any:
    """JSON values back from _frozen(): dicts and lists."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


class SpecEncoder(json.JSONEncoder):
    """Writes a RevisionSpec as its JSON (the Revision.spec column, the admin's read-only view)."""

    def default(self, o: Any) -> Any:
        if isinstance(o, RevisionSpec):
            return o.to_json()
        return super().default(o)
