"""What fits in a shared pool, which idle models make room, and what a refusal says: one rule for both runtimes.

Plain functions over plain values (no Django, no database): each runtime reads its pool's rows into `Held` (what
every other load of the pool counts now) and a `Budget`, asks `make_room`, evicts the victims it names (each with
its own conditional update: a use recorded meanwhile keeps a victim, and the runtime asks again without it), and
says `refusal` when nothing fits. So a local pool and a cluster pool decide alike for the same pool and loads.

The rule:
- every load of the pool that is loading or loaded counts, at what it is charged (a runtime says what a load in
  each state is charged: the local pool charges a load under way what it reserved, a cluster pool what its models'
  process limits add up to);
- a revision fits when, with what it needs, its team stays within its share and the pool within its budget;
- one that needs more than the share or the budget never fits: nothing is evicted for it;
- otherwise the team's own loaded revisions idle for `min_idle_seconds` go first (least recently used first), then,
  only while the team is within its share, other teams' idle ones that have been loaded `min_residency_seconds`
  (so that one team's loads cannot churn the others' out); loading revisions are never evicted.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

State = Literal["loading", "loaded"]
LOADING: State = "loading"
LOADED: State = "loaded"


@dataclass(frozen=True)
class Held:
    """One other load of the pool, as the policy counts it."""

    load_id: int
    team_id: int
    state: State
    charge: int  # bytes it counts against the share and the budget
    last_used_at: datetime | None = None
    loaded_at: datetime | None = None
    name: str = ""  # "<deployment> r<revision>", for the team's own refusal message


@dataclass(frozen=True)
class Budget:
    pool: str  # its name, for messages
    budget_bytes: int
    team_share_bytes: int  # all of a team's own pool; POOL_TEAM_SHARE of one open to every team
    open_to_all: bool = False


@dataclass(frozen=True)
class Eviction:
    min_idle_seconds: float  # POOL_EVICTION_MIN_IDLE_SECONDS
    min_residency_seconds: float  # POOL_EVICTION_MIN_RESIDENCY_SECONDS


@dataclass(frozen=True)
class Room:
    """`make_room`'s answer: whether the revision fits once `evict` (load ids, in order) are unloaded."""

    fits: bool
    evict: tuple[int, ...] = ()


def used(held: Sequence[Held], team_id: int | None = None) -> int:
    """What the loading and loaded revisions count (with team_id: that team's only)."""
    return sum(h.charge for h in held if h.state in (LOADING, LOADED) and (team_id is None or h.team_id == team_id))


def fits(budget: Budget, held: Sequence[Held], team_id: int, need: int) -> bool:
    return (used(held) + need <= budget.budget_bytes
            and used(held, team_id) + need <= budget.team_share_bytes)


def never_fits(budget: Budget, need: int) -> bool:
    """Whether `need` passes the team's share or the pool's budget even in an empty pool."""
    return need > min(budget.team_share_bytes, budget.budget_bytes)


def make_room(budget: Budget, held: Sequence[Held], team_id: int, need: int, now: datetime, rules: Eviction,
              spared: Collection[int] = ()) -> Room:
    """Whether a revision of `team_id` needing `need` bytes fits, and the idle loads to evict first (none when it
    fits as it is, or never will). `spared`: loads not to name (an eviction the runtime could not make)."""
    if fits(budget, held, team_id, need):
        return Room(True)
    if never_fits(budget, need):
        return Room(False)
    idle_before = now - timedelta(seconds=rules.min_idle_seconds)
    resident_before = now - timedelta(seconds=rules.min_residency_seconds)
    idle = sorted((h for h in held if h.state == LOADED and h.load_id not in spared
                   and h.last_used_at is not None and h.last_used_at < idle_before),
                  key=lambda h: (h.last_used_at, h.load_id))
    own = [h for h in idle if h.team_id == team_id]
    others = [h for h in idle if h.team_id != team_id and h.loaded_at is not None and h.loaded_at < resident_before]
    remaining = list(held)
    evict: list[int] = []

    def without(victim: Held) -> None:
        remaining.remove(victim)
        evict.append(victim.load_id)

    for victim in own:
        if fits(budget, remaining, team_id, need):
            break
        without(victim)
    if used(remaining, team_id) + need > budget.team_share_bytes:
        return Room(False)  # past the team's share: another team's idle models are never evicted for it
    for victim in others:
        if fits(budget, remaining, team_id, need):
            break
        without(victim)
    if not fits(budget, remaining, team_id, need):
        return Room(False)
    return Room(True, tuple(evict))


def refusal(budget: Budget, held: Sequence[Held], team_id: int, need: int, head: str = "") -> str:
    """Why the revision may not go into the pool, naming the team's own loaded revisions (never another team's)
    and where else to go. `head`: what the runtime knows more (a model past its memory limit at its last load)."""
    total, mine = used(held), used(held, team_id)
    if mine + need > budget.team_share_bytes and budget.team_share_bytes < budget.budget_bytes:
        what = (f"your team's share of it ({format_bytes(budget.team_share_bytes)}, POOL_TEAM_SHARE) has "
                f"{format_bytes(max(0, budget.team_share_bytes - mine))} free")
    else:
        what = (f"it has {format_bytes(max(0, budget.budget_bytes - total))} free of its "
                f"{format_bytes(budget.budget_bytes)} budget")
        if budget.open_to_all:
            what += (f" (your team may use {format_bytes(budget.team_share_bytes)} of it, POOL_TEAM_SHARE, and "
                     f"uses {format_bytes(mine)})")
    own = ", ".join(f"{h.name} ({format_bytes(h.charge)})" for h in held
                    if h.team_id == team_id and h.state == LOADED and h.name)
    return (f"{head}pool {budget.pool!r} cannot take this revision: this revision takes {format_bytes(need)} (its "
            "models' memory limits, from what they took when they last loaded in this pool, or their size times "
            f"POOL_UNMEASURED_FACTOR) and {what}: "
            + (f"stop one of your deployments loaded in it ({own}), " if own else
               "stop one of your deployments in it, ")
            + "choose a pool with room (GET /api/v1/pools/), or use placement mode 'dedicated'")


def format_bytes(value: int) -> str:
    return f"{value / 2**20:.0f} MiB"
