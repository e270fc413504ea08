"""The memory limit of a local dedicated Triton whose revision gives no resources.memory (issue 31).

Every such server used to be limited to, and counted against its team's and the machine's ceilings at,
SANDBOX_DEFAULT_MEMORY (4Gi): a team fitted five tiny ONNX deployments on a 24 GiB machine where each used some
110 MiB. The limit now comes from what its models were measured to take, by the rule a pool reserves memory with
(pools.reservation: POOL_MODEL_MEMORY_HEADROOM over the figure, at least POOL_MODEL_MEMORY_MIN), per instance (each
instance of a python-backend model is a stub process of its own), plus SANDBOX_SERVER_MEMORY for Triton itself:

- a version's figure is its measured memory on this machine (ModelVersion.measured_memory_bytes: the peak of its own
  processes at the python trial call at inspection, of a TorchScript trial run's sandbox, at a load in a local
  pool, in a dedicated Triton);
- an ONNX or python version never measured is estimated from its file, as a pool estimates it
  (POOL_UNMEASURED_FACTOR times its size, at least POOL_MODEL_MEMORY_MIN): onnxruntime's memory follows the
  weights, and a python model's stub is what the minimum is sized for (a python version with requirements is never
  called at inspection, so it is measured only once it serves);
- a TorchScript version never measured (its trial run did not run confined) or a SavedModel one gives no estimate
  (its framework's size is not its file's): the server then gets SANDBOX_DEFAULT_MEMORY, as before, and says so.

The limit is the server's cgroup limit, so the figure is no promise a team can game: a model that measured small
and then takes more fails alone, the kernel killing its process at the limit, and the deployment says "Out of
memory" and how to give it more (resources.memory, `modelport deploy --memory`). A memory given is kept as given.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from django.conf import settings

from deployments import pools
from deployments.revision_spec import MemoryBasis, MemoryShare, RevisionSpec
from modelport.core import formats
from models_registry.models import Blob, ModelVersion

# The formats a version never measured is estimated for, as a pool estimates it, and what its artifact is called.
# A python model's stub is what POOL_MODEL_MEMORY_MIN is sized for (a python version with requirements has no
# trial call to measure it, and without this the sample image pipeline's first revision took 4Gi); TorchScript
# (measured at its trial run where that runs confined) and SavedModel load torch or TensorFlow, hundreds of MiB
# that their file does not show: unmeasured, they keep the default.
_ESTIMATED = {formats.ONNX: "ONNX file", formats.PYTHON: "python archive"}


def applies(spec: RevisionSpec) -> bool:
    """Whether the revision's server memory is derived: local, dedicated, no resources.memory given."""
    return spec.runtime == "local" and not spec.placement.shared and not spec.resources.memory


def basis_for(spec: RevisionSpec, versions: Iterable[ModelVersion]) -> MemoryBasis | None:
    """What the server's limit is derived from (None where it is not derived)."""
    if not applies(spec):
        return None
    by_id = {v.pk: v for v in versions}
    sizes: dict[str, int] | None = None  # read only where an ONNX version needs an estimate
    server = pools.quantity_bytes(settings.SANDBOX_SERVER_MEMORY or "0")
    shares = []
    for entry in spec.models:
        if entry.is_pipeline:
            continue  # Triton runs a pipeline itself: no process of its own
        version = by_id.get(entry.version_id) if entry.version_id is not None else None
        if version is not None and version.measured_memory_bytes:
            measured = version.measured_memory_bytes
            source = f"measured {_size(measured)} at {version.measured_memory_by or 'a run on this machine'}"
            shares.append(MemoryShare(entry.name, pools.reservation(measured), source))
        elif entry.format in _ESTIMATED:
            if sizes is None:
                sizes = dict(Blob.objects.filter(sha256__in=[m.sha256 for m in spec.models if m.sha256])
                             .values_list("sha256", "size"))
            size = sizes.get(entry.sha256, version.size if version is not None else 0)
            shares.append(MemoryShare(entry.name, pools.reservation(int(size * settings.POOL_UNMEASURED_FACTOR)),
                                      f"not measured yet: estimated from its {_size(size)} {_ESTIMATED[entry.format]}"))
        else:
            return MemoryBasis(server_bytes=server, fallback=str(settings.SANDBOX_DEFAULT_MEMORY), fallback_reason=(
                f"version {entry.version} of {entry.name!r} ({entry.format}) has not been measured on this machine "
                "yet"))
    return MemoryBasis(server_bytes=server, models=tuple(shares))


# A basis keeps what planning said as it stood (a refusal at planning says it so: deployments.ceilings); shown later,
# with the revision, it is said of the planning time, since a model measured since would make the present false.
_PLANNED_WORDS = (("has not been measured on this machine yet", "had not been measured on this machine"),
                  ("not measured yet: estimated", "not measured when planned: estimated"))


def _as_planned(text: str) -> str:
    for old, new in _PLANNED_WORDS:
        text = text.replace(old, new)
    return text


def derived_now(spec: RevisionSpec, versions: Iterable[ModelVersion]) -> str | None:
    """The limit a revision planned now with the same settings would derive, where its models were measured since
    it was planned and that changes it ("640Mi"); None otherwise. The revision keeps its own (a running server's
    limit never changes under it, and deploying the same settings again makes no revision): this says what a new
    one would take."""
    planned = spec.memory_basis
    if planned is None or not applies(spec):
        return None
    versions = list(versions)
    if not any(v.measured_memory_bytes for v in versions):
        return None  # nothing measured at all: nothing can have been measured since
    now = basis_for(spec, versions)
    if now is None or now.fallback is not None:
        return None  # not every model that needs a figure has one yet
    if planned.fallback is None and [s.source for s in now.models] == [_as_planned(s.source) for s in planned.models]:
        return None  # the same figures as planned (a setting changed since is no measurement)
    limit = replace(spec, memory_basis=now).derived_memory()
    return limit if limit != spec.derived_memory() else None


def words(spec: RevisionSpec, now: str | None = None, name: str = "NAME") -> str:
    """How the server's memory limit was chosen when its revision was planned, for the API and the pages ("" where
    nothing is to say); with `now` (derived_now), what a new revision would take and how to ask for it."""
    basis = spec.memory_basis
    if spec.resources.memory or basis is None:
        return ""
    since = (f"; measured since: a new revision would take {now} (resources.memory in the API, modelport deploy "
             f"{name} --memory {now})" if now else "")
    if basis.fallback is not None:
        return (f"SANDBOX_DEFAULT_MEMORY, since {_as_planned(basis.fallback_reason)} when this revision was "
                f"planned{since}")
    counts = {m.name: m.instance_group.count for m in spec.models}
    parts = [f"Triton's own {_size(basis.server_bytes)}"]
    for share in basis.models:
        count = counts.get(share.model, 1)
        times = f"{count} × " if count != 1 else ""
        parts.append(f"{times}{_size(share.bytes_per_instance)} for {share.model!r} ({_as_planned(share.source)}, "
                     "with headroom)")
    return " + ".join(parts) + ", rounded up" + since


def _size(value: int) -> str:
    if value < 2**10:
        return f"{value} bytes"  # a 97-byte ONNX file is not "0 KiB"
    if value < 2**20:
        return f"{value / 2**10:.0f} KiB"
    return f"{value / 2**20:.0f} MiB"


def in_effect(spec: RevisionSpec, versions: Iterable[ModelVersion] | None = None,
              name: str = "NAME") -> dict[str, Any]:
    """The memory limit each server of a dedicated revision runs under, where it comes from and how it was reached
    (the API's `memory`, the deployment page). With the revision's `versions` (their figures now), also the limit a
    new revision would derive where they were measured since (`derived_now`), told in the basis with the command
    of deployment `name` that takes it."""
    from deployments.ceilings import default_memory

    if spec.resources.memory:
        return {"limit": spec.resources.memory, "source": "given", "basis": "", "derived_now": None}
    basis = spec.memory_basis
    if basis is not None:
        now = derived_now(spec, versions) if versions is not None else None
        return {"limit": spec.derived_memory() or None, "source": "derived" if basis.fallback is None else "default",
                "basis": words(spec, now, name), "derived_now": now}
    default = default_memory(spec.runtime)
    setting = "KUBERNETES_DEFAULT_MEMORY" if spec.runtime == "kubernetes" else "SANDBOX_DEFAULT_MEMORY"
    return {"limit": default or None, "source": "default",
            "basis": f"the {spec.runtime} runtime's default ({setting})", "derived_now": None}
