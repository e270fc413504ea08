"""Shared servers on the web pages (issue 24): the pools the deploy form offers, each with what fits of the models
about to be deployed (from their measured memory, as GET /api/v1/pools/ says it), and a deployment's placement as
its page shows it (the pool, loaded or idle, the last cold start). Plain reads of deployments/pools.py; what may be
deployed where stays the planner's (deployments/planning.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from accounts.models import Team
from deployments import pools
from deployments.models import Deployment, Pool, PoolLoad
from deployments.revision_spec import RevisionSpec
from models_registry.models import ModelVersion


@dataclass(frozen=True)
class PoolChoice:
    """One pool the team may use, with its capacity and what fits of the models to deploy."""

    pool: Pool
    used_bytes: int  # the pool's total, every team's loads (no names: only the totals are shown)
    models_loaded: int
    # What the team may still load: its share of a pool open to every team (POOL_TEAM_SHARE) within what the pool
    # has free, as GET /api/v1/pools/ says (pools.room_for).
    free_bytes: int
    need_bytes: int | None  # the models to deploy together, as measured here; None: not all measured yet
    unavailable: str  # why the deploy form cannot offer it for these models ("": it can)

    @property
    def copies(self) -> int | None:
        """How many more copies fit now (None: not measured yet, or they take nothing measurable)."""
        if not self.need_bytes:
            return None
        return self.free_bytes // self.need_bytes

    @property
    def who(self) -> str:
        return "every team, ONNX only" if self.pool.open_to_all else "your team's own"

    @property
    def capacity_words(self) -> str:
        budget = self.pool.memory_budget_bytes
        return (f"{pools.format_bytes(self.used_bytes)} of {pools.format_bytes(budget)} used, "
                f"{self.models_loaded} model{'s' if self.models_loaded != 1 else ''} loaded")

    @property
    def fit_words(self) -> str:
        if self.need_bytes is None:
            return "not measured yet: measured at its first load in a pool"
        copies = self.copies
        if copies is None:
            return "fits"
        if copies == 0:
            # The pool unloads its least recently used idle models to make room (docs/pools.md): not a refusal yet.
            return (f"full now: needs {pools.format_bytes(self.need_bytes)}, {pools.format_bytes(self.free_bytes)} "
                    "free unless idle models make room")
        return f"fits {copies} more ({pools.format_bytes(self.need_bytes)} each)"

    @property
    def isolation(self) -> str:
        """On a cluster: what the pool's GPU share class isolates ("" for a local pool, which has no GPU)."""
        return self.pool.isolation if self.pool.runtime == Pool.Runtime.KUBERNETES else ""

    @property
    def label(self) -> str:
        """The select's option: short, so that it is not cut off (the list below the select says it all)."""
        copies = self.copies
        fit = ("not measured yet" if self.need_bytes is None else "fits" if copies is None
               else "full now" if copies == 0 else f"fits {copies} more")
        return f"{self.pool.name} ({self.who}): {fit}"


def versions_to_deploy(team: Team, version: ModelVersion) -> list[ModelVersion]:
    """`version` and, for a pipeline, the step versions the planner deploys with it."""
    steps = version.step_references
    found = [version]
    for model, number in steps:
        step = (ModelVersion.objects.select_related("model")
                .filter(model__team=team, model__name=model, number=number).first())
        if step is not None and step not in found:
            found.append(step)
    return found


def pool_choices(team: Team, versions: Sequence[ModelVersion]) -> list[PoolChoice]:
    """The pools `team` may use (the built-in `shared` among them), each with what fits of `versions` together."""
    choices = []
    for pool in pools.usable_pools(team):
        measured = [pools.copy_needs(v, pool) for v in versions]  # a cluster pool's figures are its own
        need = None if any(m is None for m in measured) else sum(m or 0 for m in measured)
        used, loaded = pools.memory_used(pool)
        choices.append(PoolChoice(pool=pool, used_bytes=used, models_loaded=loaded,
                                  free_bytes=pools.room_for(pool, team.pk), need_bytes=need,
                                  unavailable=_unavailable(pool, versions)))
    return choices


def _unavailable(pool: Pool, versions: Iterable[ModelVersion]) -> str:
    """A hint for the form's pool list; the planner's refusal (pools.sharing_refusal) stays the rule."""
    if pool.open_to_all:
        code = sorted({v.format for v in versions if v.format not in pools.CROSS_TEAM_FORMATS})
        if code:
            return f"every team's: no {', '.join(code)} models"
    return ""


@dataclass(frozen=True)
class PlacementView:
    """What the deployment page says of where its models run."""

    shared: bool
    pool: str = ""
    idle_unload_seconds: int = 0
    state: str = ""  # PoolLoad.State of the revision shown; "": not in the pool yet
    cold_start_seconds: float | None = None
    memory_bytes: int = 0
    message: str = ""

    @property
    def state_words(self) -> str:
        words: dict[str, str] = {
            PoolLoad.State.LOADED: "loaded",
            PoolLoad.State.LOADING: "loading",
            PoolLoad.State.UNLOADED: "idle: unloaded, its next request loads it",
            PoolLoad.State.FAILED: "failed to load",
        }
        return words.get(self.state, "not loaded yet")

    @property
    def idle_words(self) -> str:
        if self.idle_unload_seconds <= 0:
            return "never unloaded while idle"
        return f"unloaded after {duration_words(self.idle_unload_seconds)} unused"

    @property
    def memory_words(self) -> str:
        return pools.format_bytes(self.memory_bytes) if self.memory_bytes else ""


def placement_view(deployment: Deployment) -> PlacementView:
    """The placement of the revision serving (else the one asked for), with its load in the pool."""
    revision = deployment.serving_revision or deployment.revision
    spec: RevisionSpec | None = revision.spec if revision else None
    if spec is None or not spec.placement.shared:
        return PlacementView(shared=False)
    placement = spec.placement
    load = PoolLoad.objects.filter(deployment=deployment, revision=revision).first()
    if load is None:
        return PlacementView(shared=True, pool=placement.pool, idle_unload_seconds=placement.idle_unload_seconds)
    return PlacementView(shared=True, pool=placement.pool, idle_unload_seconds=placement.idle_unload_seconds,
                         state=load.state, cold_start_seconds=load.cold_start_seconds, memory_bytes=load.memory_bytes,
                         message=load.message[:300] if load.state == PoolLoad.State.FAILED else "")


def placement_words(deployments: list[Deployment]) -> dict[int, str]:
    """The dashboard's Placement column: "dedicated", or "shared: POOL" with the load state of the revision shown
    ("shared: gpu-a, loaded"); one query for every row's load."""
    shown = {d.pk: d.serving_revision or d.revision for d in deployments}
    states = {(load.deployment_id, load.revision_id): load.state for load in PoolLoad.objects.filter(
        deployment_id__in=[pk for pk, r in shown.items() if r is not None and r.spec.placement.shared])}
    words: dict[int, str] = {}
    for pk, revision in shown.items():
        if revision is None or not revision.spec.placement.shared:
            words[pk] = "dedicated"
            continue
        placement = revision.spec.placement
        view = PlacementView(shared=True, pool=placement.pool, state=states.get((pk, revision.pk), ""))
        words[pk] = f"shared: {placement.pool}, {view.state_words.split(':')[0]}"
    return words


def duration_words(seconds: int) -> str:
    """600 -> "10 min", 90 -> "90 s", 7200 -> "2 h": the units the CLI's --idle-unload takes."""
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0 and seconds >= 60:
        return f"{seconds // 60} min"
    return f"{seconds} s"
