"""The pool policy (deployments/pool_policy.py): plain values in, a decision out; no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from deployments import pool_policy
from deployments.pool_policy import LOADED, LOADING, Budget, Eviction, Held

MIB = 2**20
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RULES = Eviction(min_idle_seconds=30, min_residency_seconds=300)
OPEN = Budget(pool="shared", budget_bytes=1000 * MIB, team_share_bytes=500 * MIB, open_to_all=True)
OWN = Budget(pool="team-a", budget_bytes=1000 * MIB, team_share_bytes=1000 * MIB)
ALICE, CHARLIE = 1, 2


def held(load_id: int, team: int, mib: int, state: pool_policy.State = LOADED, idle: float = 3600,
         resident: float = 7200, name: str = "") -> Held:
    return Held(load_id, team, state, mib * MIB, last_used_at=NOW - timedelta(seconds=idle),
                loaded_at=NOW - timedelta(seconds=resident), name=name)


def test_a_revision_that_fits_evicts_nobody() -> None:
    room = pool_policy.make_room(OPEN, [held(1, ALICE, 200), held(2, CHARLIE, 400)], ALICE, 300 * MIB, NOW, RULES)
    assert room == pool_policy.Room(True, ())


def test_loading_and_loaded_revisions_both_count_and_a_loading_one_is_never_evicted() -> None:
    others = [held(1, CHARLIE, 300, state=LOADING), held(2, CHARLIE, 300, state=LOADED)]
    assert pool_policy.used(others) == 600 * MIB
    assert pool_policy.fits(OPEN, others, ALICE, 400 * MIB)
    assert not pool_policy.fits(OPEN, others, ALICE, 401 * MIB)
    room = pool_policy.make_room(OPEN, others, ALICE, 450 * MIB, NOW, RULES)
    assert room == pool_policy.Room(True, (2,))  # the loaded one goes; the one loading holds its room


def test_the_teams_own_idle_revisions_go_first_least_recently_used_first() -> None:
    loads = [held(1, ALICE, 200, idle=100), held(2, ALICE, 200, idle=900), held(3, CHARLIE, 400, idle=5000),
             held(4, ALICE, 100, idle=5)]  # used 5 s ago: not idle
    room = pool_policy.make_room(OPEN, loads, ALICE, 300 * MIB, NOW, RULES)
    # Alice holds 500 of her 500: her idlest (2) then the next (1) make room in her share; Charlie's stays.
    assert room == pool_policy.Room(True, (2, 1))


def test_another_teams_idle_revision_goes_only_once_resident_and_only_within_the_share() -> None:
    loads = [held(1, CHARLIE, 400, resident=60), held(2, CHARLIE, 400, resident=3600), held(3, ALICE, 100, idle=5)]
    room = pool_policy.make_room(OPEN, loads, ALICE, 300 * MIB, NOW, RULES)
    assert room == pool_policy.Room(True, (2,))  # 1 was loaded a minute ago: kept; Alice's own is in use
    # Past Alice's share (100 + 450 of 500), Charlie's models are never evicted for her.
    assert pool_policy.make_room(OPEN, loads, ALICE, 450 * MIB, NOW, RULES) == pool_policy.Room(False, ())
    # Her own idle one goes first, before any of Charlie's.
    idle_own = [*loads[:2], held(3, ALICE, 100, idle=3600)]
    assert pool_policy.make_room(OPEN, idle_own, ALICE, 300 * MIB, NOW, RULES) == pool_policy.Room(True, (3, 2))


def test_a_revision_past_the_share_or_the_budget_evicts_nobody() -> None:
    """Where the two runtimes' old rules differed: the cluster pool's evicted the team's own idle revisions one by
    one before it found that the revision could not fit anyway (its share is smaller than what it needs); the local
    pool refused at once. One rule now: refused, nothing evicted, on either runtime."""
    loads = [held(1, ALICE, 300), held(2, CHARLIE, 300)]
    assert pool_policy.make_room(OPEN, loads, ALICE, 501 * MIB, NOW, RULES) == pool_policy.Room(False, ())
    assert pool_policy.make_room(OWN, loads, ALICE, 1001 * MIB, NOW, RULES) == pool_policy.Room(False, ())


def test_a_load_the_runtime_could_not_evict_is_spared_and_the_next_one_named() -> None:
    loads = [held(1, ALICE, 300, idle=900), held(2, ALICE, 300, idle=100)]
    assert pool_policy.make_room(OWN, loads, ALICE, 500 * MIB, NOW, RULES).evict == (1,)
    assert pool_policy.make_room(OWN, loads, ALICE, 500 * MIB, NOW, RULES, spared={1}).evict == (2,)
    assert not pool_policy.make_room(OWN, loads, ALICE, 500 * MIB, NOW, RULES, spared={1, 2}).fits


def test_the_refusal_names_the_teams_own_loads_never_anothers() -> None:
    loads = [held(1, ALICE, 300, name="alice-digits r2"), held(2, CHARLIE, 600, name="charlie-secret r1")]
    share = pool_policy.refusal(OPEN, loads, ALICE, 300 * MIB)
    assert "pool 'shared' cannot take this revision: this revision takes 300 MiB" in share
    assert "your team's share of it (500 MiB, POOL_TEAM_SHARE) has 200 MiB free" in share
    assert "alice-digits r2 (300 MiB)" in share and "charlie" not in share
    budget = pool_policy.refusal(OPEN, [held(2, CHARLIE, 900)], ALICE, 200 * MIB)
    assert "it has 100 MiB free of its 1000 MiB budget (your team may use 500 MiB of it" in budget
    assert "stop one of your deployments in it, choose a pool with room" in budget
    own_pool = pool_policy.refusal(OWN, [held(1, ALICE, 900)], ALICE, 200 * MIB)
    assert "it has 100 MiB free of its 1000 MiB budget:" in own_pool and "POOL_TEAM_SHARE" not in own_pool
