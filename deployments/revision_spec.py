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
- 3: `spec_version: 3`; `placement` (issue 24): dedicated, or shared in a pool. Versions 1 and 2 are dedicated.
  Since issue 31 a local dedicated revision that gives no resources.memory may carry `memory_basis`, what its
  server's memory limit is derived from (deployments/server_memory.py). A reader that predates it drops the key and
  limits the server to SANDBOX_DEFAULT_MEMORY, more than derived: safe, so the version stays 3.
A reader meets a newer version only after a downgrade; it refuses it rather than dropping what it does not know.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployments.model_entry import DynamicBatching as DynamicBatching  # where the spec's readers have found them
from deployments.model_entry import ModelEntry as ModelEntry
from deployments.model_entry import SpecError as SpecError
from deployments.model_entry import json_object
from deployments.spec import RepositorySpec, ServedModel

SPEC_VERSION = 3
# A derived memory limit is rounded up to this: a figure measured to the byte promises nothing to the byte.
MEMORY_STEP_BYTES = 64 * 2**20


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
        data = json_object(data or {}, "resources")
        return cls(cpu=str(data.get("cpu") or ""), memory=str(data.get("memory") or ""),
                   gpu=int(data.get("gpu") or 0), gpu_type=str(data.get("gpu_type") or ""),
                   mig_profile=str(data.get("mig_profile") or ""))


@dataclass(frozen=True)
class MemoryShare:
    """One model's part of a derived memory limit: per instance, from a figure measured or estimated."""

    model: str
    bytes_per_instance: int
    source: str  # "measured 110 MiB at its trial call at inspection", "estimated: never measured, 4 KiB ONNX file"

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "bytes_per_instance": self.bytes_per_instance, "source": self.source}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryShare:
        data = json_object(data, "memory_basis.models[]")
        return cls(model=str(data["model"]), bytes_per_instance=int(data["bytes_per_instance"]),
                   source=str(data.get("source") or ""))


@dataclass(frozen=True)
class MemoryBasis:
    """What the memory limit of a local dedicated server is derived from when its revision gives no
    resources.memory (deployments/server_memory.py, issue 31): Triton's own memory, and each model's share times
    its instances, the sum rounded up. Kept with the revision, so its limit does not change under a running server;
    the instance counts are read from the spec itself, so a tune's trial server with more instances gets more.
    `fallback`: a model had no figure at all (a framework's model never measured), so the server gets this limit
    (SANDBOX_DEFAULT_MEMORY when planned; "" is none)."""

    server_bytes: int
    models: tuple[MemoryShare, ...] = ()
    fallback: str | None = None
    fallback_reason: str = ""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"server_bytes": self.server_bytes, "models": [m.to_json() for m in self.models]}
        if self.fallback is not None:
            data.update(fallback=self.fallback, fallback_reason=self.fallback_reason)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryBasis:
        data = json_object(data, "memory_basis")
        shares = data.get("models") or []
        if not isinstance(shares, list):
            raise SpecError("memory_basis.models must be a list")
        fallback = data.get("fallback")
        return cls(server_bytes=int(data["server_bytes"]), models=tuple(MemoryShare.from_json(m) for m in shares),
                   fallback=None if fallback is None else str(fallback),
                   fallback_reason=str(data.get("fallback_reason") or ""))


@dataclass(frozen=True)
class Autoscaling:
    """Kubernetes only: a HorizontalPodAutoscaler between min_replicas and max_replicas (or KEDA's ScaledObject,
    which alone may go down to 0: the gateway then holds the first request while a pod starts)."""

    min_replicas: int
    max_replicas: int
    target: int  # cpu: percent of the request; queue_time: microseconds per request
    metric: str = "cpu"  # "cpu" | "queue_time"

    @property
    def scales_to_zero(self) -> bool:
        return self.min_replicas == 0

    def to_json(self) -> dict[str, Any]:
        return {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas, "metric": self.metric,
                "target": self.target}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Autoscaling:
        data = json_object(data, "autoscaling")
        return cls(min_replicas=int(data["min_replicas"]), max_replicas=int(data["max_replicas"]),
                   target=int(data["target"]), metric=str(data.get("metric", "cpu")))


@dataclass(frozen=True)
class Placement:
    """Where a revision's models run: a Triton of its own (dedicated), or loaded on demand into a pool's shared
    Triton (deployments/pools.py) with `idle_unload_seconds` resolved from the pool's default (0: never unload)."""

    mode: str = "dedicated"  # "dedicated" | "shared"
    pool: str = ""  # the pool's name when shared
    idle_unload_seconds: int = 0

    @property
    def shared(self) -> bool:
        return self.mode == "shared"

    def to_json(self) -> dict[str, Any]:
        if not self.shared:
            return {"mode": self.mode}
        return {"mode": self.mode, "pool": self.pool, "idle_unload_seconds": self.idle_unload_seconds}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Placement:
        data = json_object(data or {}, "placement")
        mode = str(data.get("mode") or "dedicated")
        if mode not in ("dedicated", "shared"):
            raise SpecError(f"placement.mode must be dedicated or shared, got {mode!r}")
        return cls(mode=mode, pool=str(data.get("pool") or ""),
                   idle_unload_seconds=int(data.get("idle_unload_seconds") or 0))


DEDICATED = Placement()


@dataclass(frozen=True)
class RevisionSpec:
    runtime: str  # Deployment.Runtime: "local" or "kubernetes"
    models: tuple[ModelEntry, ...]
    replicas: int = 1
    resources: Resources = field(default_factory=Resources)
    autoscaling: Autoscaling | None = None
    # A Triton image an operator chose for this revision (Kubernetes); "": the configured one.
    image: str = ""
    placement: Placement = DEDICATED
    # A local dedicated revision without resources.memory: what its server's limit is derived from (None: before
    # issue 31, another runtime, a pool, or a memory given).
    memory_basis: MemoryBasis | None = None

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    def entry(self, name: str) -> ModelEntry | None:
        return next((m for m in self.models if m.name == name), None)

    def derived_memory(self) -> str | None:
        """The server's memory limit derived from `memory_basis`, as a quantity ("384Mi"; "": none), or None."""
        basis = self.memory_basis
        if basis is None:
            return None
        if basis.fallback is not None:
            return basis.fallback
        counts = {m.name: m.instance_group.count for m in self.models}
        total = basis.server_bytes + sum(share.bytes_per_instance * counts.get(share.model, 1)
                                         for share in basis.models)
        mebibytes = -(-total // MEMORY_STEP_BYTES) * MEMORY_STEP_BYTES // 2**20
        return f"{mebibytes // 1024}Gi" if mebibytes % 1024 == 0 else f"{mebibytes}Mi"

    def memory_limit(self, runtime_default: str) -> str:
        """Each server's memory limit as a quantity: resources.memory as given, else the one derived from what its
        models were measured to take, else `runtime_default` ("": none)."""
        if self.resources.memory:
            return self.resources.memory
        derived = self.derived_memory()
        return derived if derived is not None else runtime_default

    def repository(self, artifact_for: Callable[[ModelEntry], Path | None]) -> RepositorySpec:
        """The renderer's input; `artifact_for(entry)` gives the local file of an entry's stored artifact."""
        return RepositorySpec(models=tuple(ServedModel.of(m, artifact_for(m) if m.sha256 else None)
                                           for m in self.models))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "spec_version": SPEC_VERSION,
            "runtime": self.runtime,
            "replicas": self.replicas,
            "resources": self.resources.to_json(),
            "models": [m.to_json() for m in self.models],
            "placement": self.placement.to_json(),
        }
        if self.autoscaling is not None:
            data["autoscaling"] = self.autoscaling.to_json()
        if self.image:
            data["image"] = self.image
        if self.memory_basis is not None:
            data["memory_basis"] = self.memory_basis.to_json()
        return data

    @classmethod
    def from_json(cls, data: Any) -> RevisionSpec:
        """Any spec a Modelport ever stored (see the module's docstring), or SpecError."""
        data = json_object(data, "spec")
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
        basis = data.get("memory_basis")
        try:
            return cls(
                runtime=str(data.get("runtime") or "local"),
                models=tuple(ModelEntry.from_json(m, f"models[{i}]") for i, m in enumerate(models)),
                replicas=int(data.get("replicas") or 1),
                resources=Resources.from_json(data.get("resources")),
                autoscaling=Autoscaling.from_json(autoscaling) if autoscaling else None,
                image=str(data.get("image") or ""),
                placement=Placement.from_json(data.get("placement")),
                memory_basis=MemoryBasis.from_json(basis) if basis else None,
            )
        except (TypeError, ValueError, KeyError) as exc:
            if isinstance(exc, SpecError):
                raise
            raise SpecError(f"spec: {exc}") from None

    @classmethod
    def coerce(cls, value: Any) -> RevisionSpec:
        return value if isinstance(value, RevisionSpec) else cls.from_json(value)


class SpecEncoder(json.JSONEncoder):
    """Writes a RevisionSpec as its JSON (the Revision.spec column, the admin's read-only view)."""

    def default(self, o: Any) -> Any:
        if isinstance(o, RevisionSpec):
            return o.to_json()
        return super().default(o)
