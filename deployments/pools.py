"""Shared servers (issue 24): which pools a team may use, who may share a process, and what fits.

Plain rules over the rows of deployments/pool_models.py; the local runtime's pool servers are in
deployments/runtimes/local/pool.py, the names of a revision's models in a pool in deployments/pool_names.py, and
what fits in deployments/pool_policy.py. A pool open to every team runs only what cannot execute code (ONNX, whose
operator domains inspection has checked are onnxruntime's own, and pipelines of such models); python models,
TorchScript and SavedModels may share a process only with their own team's models (docs/security.md).
"""

from __future__ import annotations

import hashlib
import math
import platform
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Q, Sum

from accounts.models import Team
from deployments import pool_policy
from deployments.pool_models import SHARED_POOL, ModelMemory, Pool, PoolLoad
from deployments.pool_policy import format_bytes as format_bytes
from deployments.revision_spec import RevisionSpec
from modelport.core import formats
from modelport.core.quantity import parse_quantity
from models_registry.models import ModelVersion

# What a Triton shared by several teams may run: formats whose artifact is data, read by Modelport's own code.
CROSS_TEAM_FORMATS = frozenset({formats.ONNX, formats.ENSEMBLE})


def shared_pool() -> Pool:
    """The built-in pool on the local runtime, open to every team: created at first use from the settings."""
    pool, _ = Pool.objects.get_or_create(name=SHARED_POOL, defaults={
        "runtime": Pool.Runtime.LOCAL, "team": None,
        "memory_budget_bytes": quantity_bytes(settings.POOL_SHARED_MEMORY_BUDGET),
        "idle_unload_seconds": settings.POOL_SHARED_IDLE_UNLOAD_SECONDS,
    })
    return pool


def usable_pools(team: Team) -> list[Pool]:
    shared_pool()
    return list(Pool.objects.filter(Q(team__isnull=True) | Q(team=team)).order_by("name"))


def pool_for(team: Team, name: str) -> Pool | None:
    """The pool `name` if `team` may use it (another team's pool is as absent as one that does not exist)."""
    if name == SHARED_POOL:
        shared_pool()
    return Pool.objects.filter(Q(team__isnull=True) | Q(team=team), name=name).first()


def fingerprint(pool: Pool | None = None) -> str:
    """The machine a measurement holds for: memory taken by a model depends on the CPU, the libraries, the host.
    A cluster pool's is its own (its name, GPU share and Triton image): its figures come from its pods' agents, and
    those of a team's own pool, written next to the team's code, never count for another pool."""
    if pool is not None and pool.runtime == Pool.Runtime.KUBERNETES:
        # "own-processes": since each model runs in stub processes of its own there, its figure is their peak, no
        # longer Triton's statistic (which the figures of the pools before counted).
        text = "|".join(("kubernetes", pool.name, pool.gpu_share, pool.gpu_type, pool.mig_profile,
                         str(settings.KUBERNETES_POOL_TRITON_IMAGE or settings.KUBERNETES_TRITON_IMAGE),
                         "own-processes"))
    else:
        text = "|".join((platform.machine(), platform.node(), str(settings.MODELPORT_RUNTIME_ENV)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sharing_refusal(pool: Pool, spec: RevisionSpec) -> list[tuple[str, str]]:
    """(model, why) for each model of `spec` that may not go into `pool`."""
    found = []
    for entry in spec.models:
        if pool.open_to_all and entry.format not in CROSS_TEAM_FORMATS:
            found.append((entry.name, (
                f"model {entry.name!r} is a {entry.format} model, which runs code a team uploaded, and pool "
                f"{pool.name!r} is shared by every team, where only ONNX models (and pipelines of them) may run: "
                "deploy it with placement mode 'dedicated', or in a pool of your own team (ask an operator)")))
        elif entry.format == formats.PYTHON and entry.requirements and pool.runtime != Pool.Runtime.LOCAL:
            # On the local runtime requirements the runtime env meets are served (its plan check says which not).
            found.append((entry.name, (
                f"model {entry.name!r} has requirements, and a pool's Triton runs with the runtime env alone: "
                "deploy it with placement mode 'dedicated'")))
    return found


def memory_used(pool: Pool, team_id: int | None = None, exclude: int | None = None) -> tuple[int, int]:
    """(bytes, models) the pool's loaded revisions take (with team_id: that team's only), as charged when each
    loaded, and what the loads under way reserved (their models not counted: not loaded yet). exclude: a load's
    own row, not counted (the load asking)."""
    rows = PoolLoad.objects.filter(pool=pool)
    if team_id is not None:
        rows = rows.filter(deployment__team_id=team_id)
    if exclude is not None:
        rows = rows.exclude(pk=exclude)
    loaded = rows.filter(state=PoolLoad.State.LOADED)
    total = loaded.aggregate(total=Sum("memory_bytes"))["total"] or 0
    loading = rows.filter(state=PoolLoad.State.LOADING, reserved_bytes__gt=0)
    total += loading.aggregate(total=Sum("reserved_bytes"))["total"] or 0
    models = sum(len(load.revision.spec.models) for load in loaded.select_related("revision"))
    return int(total), models


def team_share(pool: Pool) -> int:
    """What one team's models may take of `pool`: all of a team's own pool, POOL_TEAM_SHARE of an open one."""
    if not pool.open_to_all:
        return pool.memory_budget_bytes
    return int(pool.memory_budget_bytes * settings.POOL_TEAM_SHARE)


def room_for(pool: Pool, team_id: int) -> int:
    """The bytes `team_id` may still load into `pool`: within its share and what the pool has free."""
    used, _ = memory_used(pool)
    mine, _ = memory_used(pool, team_id)
    return max(0, min(pool.memory_budget_bytes - used, team_share(pool) - mine))


def measured(version: ModelVersion, pool: Pool | None = None) -> int | None:
    row = ModelMemory.objects.filter(version=version, fingerprint=fingerprint(pool)).first()
    return row.memory_bytes if row is not None else None


def copy_needs(version: ModelVersion, pool: Pool) -> int | None:
    """What one more copy of `version` takes from `pool`: its reservation (its measured peak with headroom: the
    memory limit a load gives it, on either runtime); None: never measured."""
    found = measured(version, pool)
    return None if found is None else reservation(found)


@dataclass(frozen=True)
class Fit:
    memory_bytes: int | None  # None: never measured on this machine
    fits: bool | None
    copies: int | None
    message: str


def fit(pool: Pool, version: ModelVersion) -> Fit:
    """Whether one more copy of `version` fits in `pool` now for its team, and how many, from what a copy takes
    (what the team may still load: its share, within what the pool has free; never the others' figures)."""
    need = copy_needs(version, pool)
    free = room_for(pool, version.model.team_id)
    if need is None:
        return Fit(None, None, None, f"version {version.number} of {version.model.name!r} has not been measured on "
                                     "this machine yet: it is measured at its first load in a pool")
    copies = free // need if need > 0 else None
    fits = need <= free
    return Fit(need, fits, copies, f"{free} bytes free for your team; it takes {need}")


def estimate(spec: RevisionSpec, pool: Pool | None = None) -> int:
    """What the revision's models took at their last load on this machine (in a cluster pool: in that pool); a
    version never measured counts at its artifact's size times POOL_UNMEASURED_FACTOR (never 0, or new versions
    would fit anywhere)."""
    from models_registry.models import Blob

    ids = [m.version_id for m in spec.models if m.version_id is not None]
    found = dict(ModelMemory.objects.filter(version_id__in=ids, fingerprint=fingerprint(pool))
                 .values_list("version_id", "memory_bytes"))
    sizes = dict(Blob.objects.filter(sha256__in=[m.sha256 for m in spec.models if m.sha256])
                 .values_list("sha256", "size"))
    total = 0
    for entry in spec.models:
        if entry.version_id is not None and entry.version_id in found:
            total += found[entry.version_id]
        elif entry.sha256:
            total += int(sizes.get(entry.sha256, 0) * settings.POOL_UNMEASURED_FACTOR)
    return total


def reservation(measured_bytes: int) -> int:
    """What a pool reserves for one model that took `measured_bytes` at its peak (or is estimated to): the memory
    limit of its own processes, and what it is charged (POOL_MODEL_MEMORY_HEADROOM over its peak, at least
    POOL_MODEL_MEMORY_MIN: a python-backend stub with onnxruntime holds some 70 MB before its first request)."""
    return max(int(measured_bytes * settings.POOL_MODEL_MEMORY_HEADROOM),
               quantity_bytes(settings.POOL_MODEL_MEMORY_MIN))


def figure_past_limit(limit_bytes: int) -> int:
    """The figure to remember for a model whose process the kernel ended at its memory limit `limit_bytes`, at a
    load or under use: the peak whose reservation is twice that limit. It needed more than the limit, and how much
    more no reading tells (its peak is the limit); doubling reaches any need in a few loads, each within its team's
    share, and the next reading once it fits replaces the guess with its real peak where that is higher."""
    return math.ceil(2 * limit_bytes / settings.POOL_MODEL_MEMORY_HEADROOM)


def reservations(spec: RevisionSpec, pool: Pool | None = None) -> dict[str, int]:
    """Each model's reservation by name (pipelines run in Triton itself and reserve nothing), from its peak measured
    on this machine, or for a version never measured its artifact's size times POOL_UNMEASURED_FACTOR."""
    from models_registry.models import Blob

    ids = [m.version_id for m in spec.models if m.version_id is not None]
    found = dict(ModelMemory.objects.filter(version_id__in=ids, fingerprint=fingerprint(pool))
                 .values_list("version_id", "memory_bytes"))
    sizes = dict(Blob.objects.filter(sha256__in=[m.sha256 for m in spec.models if m.sha256])
                 .values_list("sha256", "size"))
    out = {}
    for entry in spec.models:
        if entry.is_pipeline:
            continue
        if entry.version_id is not None and entry.version_id in found:
            out[entry.name] = reservation(found[entry.version_id])
        else:
            out[entry.name] = reservation(int(sizes.get(entry.sha256, 0) * settings.POOL_UNMEASURED_FACTOR))
    return out


def process_limits(spec: RevisionSpec, pool: Pool) -> dict[str, int]:
    """Each model's memory limit per process in a cluster pool (what the stub wrapper limits each of its processes
    to, deployments/runtimes/kubernetes/pool_stub.py): its reservation shared by its instances, each one's at least
    POOL_MODEL_MEMORY_MIN (what one stub holds idle). Pipelines run in Triton itself and have none."""
    minimum = quantity_bytes(settings.POOL_MODEL_MEMORY_MIN)
    counts = {entry.name: max(1, entry.instance_group.count) for entry in spec.models}
    return {name: max(reserved // counts[name], minimum) for name, reserved in reservations(spec, pool).items()}


def cluster_charge(spec: RevisionSpec, pool: Pool) -> int:
    """What loading `spec` takes from a cluster pool: every process's limit (so that the limits together stay
    within the budget, and the pod's own memory limit, the budget plus overhead, is not what runs out)."""
    counts = {entry.name: max(1, entry.instance_group.count) for entry in spec.models}
    return sum(limit * counts[name] for name, limit in process_limits(spec, pool).items())


def budget_of(pool: Pool) -> pool_policy.Budget:
    """The pool's budget and a team's share of it, as the policy (deployments/pool_policy.py) counts them."""
    return pool_policy.Budget(pool=pool.name, budget_bytes=pool.memory_budget_bytes, team_share_bytes=team_share(pool),
                              open_to_all=pool.open_to_all)


def eviction_rules() -> pool_policy.Eviction:
    return pool_policy.Eviction(min_idle_seconds=settings.POOL_EVICTION_MIN_IDLE_SECONDS,
                                min_residency_seconds=settings.POOL_EVICTION_MIN_RESIDENCY_SECONDS)


def quantity_bytes(text: str) -> int:
    """A Kubernetes memory quantity ("2Gi") in bytes."""
    return int(parse_quantity(text))
