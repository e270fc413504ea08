"""Canary rollouts: the reconciler's canary steps tick by tick through the in-memory runtime (launch beside the
stable revision, a canary that fails to load, promote, rollback, delete and stop during a canary, a dead canary
restarted), the API (PATCH with a rollout, promote, rollback, who may, what is refused), and the guardrails'
verdicts on the gateway's per-revision statistics. The gateway's split is tested in gateway/tests/test_canary_split.py
and with a real Triton in tests/test_canary_e2e.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from audit.models import AuditEntry
from deployments import actions, canary, planning
from deployments.models import Deployment
from deployments.tests.fake_runtime import FakeRuntime
from deployments.tests.reconciling import Clock, events, request, serving, tick, ticks_until
from gateway import canary as gateway_canary
from gateway import tasks as gateway_tasks
from gateway.models import LATENCY_BUCKETS_MS, RequestStats
from tests.support.people import Person

S = Deployment.Status


def start_canary(person: Person, deployment: Deployment, percent: int = 20, **guardrails: Any) -> None:
    actions.update_deployment(Deployment.objects.get(pk=deployment.pk), person.user,
                              planning.plan(person.team, request(500)),
                              canary=canary.Rollout(percent=percent, **guardrails))


def row(deployment: Deployment) -> Deployment:
    return Deployment.objects.select_related("canary_revision", "serving_revision", "revision").get(pk=deployment.pk)


def canary_serving(d: Deployment) -> bool:
    return bool(d.canary_upstream_url)


def test_a_canary_starts_beside_the_stable_revision_and_gets_its_route_once_ready(
        alice: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    stable_url = deployment.upstream_url
    start_canary(alice, deployment, percent=20)
    current = row(deployment)
    assert current.canary_revision.number == 2 and current.revision.number == 1  # the stable one is still asked for
    assert current.canary_percent == 20 and current.canary_upstream_url == ""
    ticks_until(deployment, canary_serving, clock)
    current = row(deployment)
    stable, canary_server = fake.servers
    assert current.status == S.READY and current.upstream_url == stable_url == stable.url  # untouched
    assert current.canary_upstream_url == canary_server.url
    assert current.canary_grpc_upstream == canary_server.grpc_target
    assert current.canary_serving_since == clock.now
    assert stable.state == canary_server.state == "ready"
    assert "Canary revision 2 is ready and serving 20% of the requests (fake server 2)." in events(deployment)
    # Serving: both are health-checked, and nothing is retired.
    for _ in range(3):
        tick(deployment)
    assert {"check 1", "check 2"} <= set(fake.calls[-4:]) and canary_server.state == "ready"


def test_a_canary_that_fails_to_load_ends_and_the_stable_revision_serves_on(
        alice: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    fake.fails_with = "model 'digits' failed to load: bad weights"
    start_canary(alice, deployment)
    ticks_until(deployment, lambda d: d.canary_revision_id is None, clock)
    current = row(deployment)
    assert current.status == S.READY and current.serving_revision.number == 1 and current.upstream_url
    assert current.canary_launch is None and current.canary_upstream_url == ""
    assert fake.servers[1].state == "stopped" and fake.servers[0].state == "ready"  # abandoned
    assert ("Canary revision 2 failed to start: model 'digits' failed to load: bad weights. Revision 1 keeps "
            "serving all requests.") in events(deployment)


def test_a_canary_whose_packages_cannot_be_installed_ends_and_the_stable_revision_serves_on(
        alice: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    fake.preparing_for, fake.building = 1, True
    fake.build_fails_with = "ERROR: No matching distribution found for nonexistent-pkg-zzz==9.9"
    start_canary(alice, deployment)
    ticks_until(deployment, lambda d: d.canary_revision_id is None, clock)
    current = row(deployment)
    assert current.status == S.READY and current.serving_revision.number == 1 and current.upstream_url
    assert fake.launched_revisions() == [1]  # the canary never launched
    message = next(e for e in events(deployment) if e.startswith("Canary revision 2 cannot be prepared"))
    assert "nonexistent-pkg-zzz==9.9" in message and "Revision 1 keeps serving all requests." in message


def test_a_canary_stuck_past_its_deadline_is_abandoned(
        alice: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    fake.ready_after = None  # hangs
    start_canary(alice, deployment)
    ticks_until(deployment, lambda d: d.canary_revision_id is None, clock, limit=100)
    assert fake.servers[1].state == "stopped" and row(deployment).upstream_url == fake.servers[0].url
    assert any(e.startswith("Canary revision 2 failed to start: not ready after 60 s") for e in events(deployment))


def test_promote_switches_the_route_in_one_update_then_drains_and_stops_the_old_revision(
        alice: Person, bob: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    start_canary(alice, deployment)
    ticks_until(deployment, canary_serving, clock)
    stable, canary_server = fake.servers
    assert actions.promote_canary(row(deployment), bob.user) == 2
    current = row(deployment)
    assert current.revision.number == current.serving_revision.number == 2
    assert current.upstream_url == canary_server.url and current.grpc_upstream == canary_server.grpc_target
    assert current.canary_revision_id is None and current.canary_upstream_url == "" and current.canary_percent == 0
    assert current.drain_until == clock.now + timedelta(seconds=2)
    assert stable.state == "ready"  # drains first
    ticks_until(deployment, lambda d: d.drain_until is None, clock)
    assert stable.state == "stopped" and canary_server.state == "ready"
    assert row(deployment).status == S.READY
    assert ("Canary revision 2 promoted by bob: it serves all requests; revision 1 drains and stops."
            in events(deployment))
    assert AuditEntry.objects.filter(action="deployment.promote", username="bob").exists()


def test_rollback_clears_the_canary_route_then_stops_the_canary(
        alice: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    start_canary(alice, deployment)
    ticks_until(deployment, canary_serving, clock)
    stable, canary_server = fake.servers
    actions.rollback_canary(row(deployment), alice.user)
    current = row(deployment)
    assert current.canary_revision_id is None and current.canary_upstream_url == current.canary_grpc_upstream == ""
    assert current.upstream_url == stable.url and current.serving_revision.number == 1
    assert canary_server.state == "ready"  # answers what was routed to it until the drain ends
    ticks_until(deployment, lambda d: d.drain_until is None, clock)
    assert canary_server.state == "stopped" and stable.state == "ready"
    assert "Canary revision 2 rolled back by alice; revision 1 serves all requests." in events(deployment)


def test_a_rollback_while_the_canary_starts_stops_its_server(
        alice: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    fake.ready_after = 5
    start_canary(alice, deployment)
    ticks_until(deployment, lambda d: d.canary_launch is not None, clock)
    with pytest.raises(actions.Conflict, match="not serving yet"):
        actions.promote_canary(row(deployment), alice.user)
    actions.rollback_canary(row(deployment), alice.user)
    ticks_until(deployment, lambda d: d.drain_until is None, clock)
    assert fake.servers[1].state == "stopped" and fake.servers[0].state == "ready"


def test_a_dead_canary_loses_its_route_and_is_launched_again(
        alice: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    start_canary(alice, deployment)
    ticks_until(deployment, canary_serving, clock)
    fake.servers[1].state = "dead"
    tick(deployment)
    current = row(deployment)
    assert current.canary_upstream_url == "" and current.canary_revision.number == 2  # its share goes to stable
    assert any(e.startswith("Canary revision 2 stopped serving: fake server 2 died") for e in events(deployment))
    ticks_until(deployment, canary_serving, clock)
    assert row(deployment).canary_upstream_url == fake.servers[2].url


def test_deleting_during_a_canary_tears_both_down(
        alice: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    start_canary(alice, deployment)
    ticks_until(deployment, canary_serving, clock)
    actions.delete_deployment(row(deployment), alice.user)
    assert row(deployment).canary_upstream_url == ""  # the gateway stops routing to either at once
    tick(deployment)
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    assert all(server.state == "stopped" for server in fake.servers)


def test_stopping_during_a_canary_ends_it(alice: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    start_canary(alice, deployment)
    ticks_until(deployment, canary_serving, clock)
    actions.stop_deployment(row(deployment), alice.user)
    ticks_until(deployment, lambda d: d.status == S.STOPPED, clock)
    current = row(deployment)
    assert current.canary_revision_id is None and all(server.state == "stopped" for server in fake.servers)


def test_a_worker_restart_mid_canary_carries_on_from_what_was_recorded(
        alice: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    fake.ready_after = 3
    start_canary(alice, deployment)
    ticks_until(deployment, lambda d: d.canary_launch is not None, clock)
    # A new worker (the same database, nothing in memory but the runtime's servers): it looks at the same launch.
    launched = len(fake.servers)
    ticks_until(deployment, canary_serving, clock)
    assert len(fake.servers) == launched  # not launched twice


def test_a_change_during_a_canary_is_refused_until_it_is_promoted_or_rolled_back(
        alice: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    start_canary(alice, deployment)
    with pytest.raises(actions.Conflict, match="A canary of revision 2 is in progress"):
        actions.update_deployment(row(deployment), alice.user, planning.plan(alice.team, request(900)))


# --- Guardrails -------------------------------------------------------------------------------------------------


def stats(deployment: Deployment, revision: int, requests: int, errors: int, latency_ms: float,
          at: Any = None) -> None:
    histogram = [0] * len(LATENCY_BUCKETS_MS)
    index = next(i for i, bound in enumerate(LATENCY_BUCKETS_MS) if latency_ms <= bound)
    histogram[index] = requests
    now = at or timezone.now()
    start = now - timedelta(seconds=now.timestamp() % 10)
    RequestStats.objects.create(deployment=deployment, revision=revision, bucket_start=start, requests=requests,
                                errors=errors, latency_sum_ms=latency_ms * requests, latency_histogram=histogram)


@pytest.fixture
def with_canary(alice: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> Deployment:
    deployment = serving(alice, fake, clock)
    start_canary(alice, deployment, window_seconds=30, min_requests=10)
    ticks_until(deployment, canary_serving, clock)
    return row(deployment)


def test_a_canary_past_its_error_rate_is_rolled_back_with_the_figures(
        with_canary: Deployment, fake: FakeRuntime, clock: Clock) -> None:
    stats(with_canary, 1, 100, 0, 4)
    stats(with_canary, 2, 25, 3, 4)
    assert gateway_tasks.check_canaries() == 1
    current = row(with_canary)
    assert current.canary_revision_id is None and current.serving_revision.number == 1
    assert ("Canary revision 2 rolled back automatically: canary error rate 12.0% > 5.0% over 30 s, stable 0.0% "
            "(3 of 25 requests; p99 not judged: 25 of the 100 requests needed); revision 1 serves all "
            "requests.") in events(with_canary)
    assert AuditEntry.objects.get(action="deployment.rollback").detail["reason"].startswith("canary error rate 12.0%")
    ticks_until(with_canary, lambda d: d.drain_until is None, clock)
    assert fake.servers[1].state == "stopped"


def test_a_canary_much_slower_than_the_stable_revision_is_rolled_back(
        with_canary: Deployment, clock: Clock) -> None:
    stats(with_canary, 1, 100, 0, 9)
    stats(with_canary, 2, 50, 0, 140)
    # Fifty requests make no p99: their slowest one (a cold start) is no verdict on the canary.
    assert gateway_canary.judge(with_canary.pk).action == "wait"
    clock.advance(10)  # the next bucket
    stats(with_canary, 2, 50, 0, 140)
    # Enough requests, but not a whole window yet: the first seconds are its warm-up.
    assert gateway_canary.judge(with_canary.pk).action == "wait"
    clock.advance(20)  # a whole window (30 s) since it serves
    stats(with_canary, 1, 100, 0, 9)
    stats(with_canary, 2, 100, 0, 140)
    verdict = gateway_canary.judge(with_canary.pk)
    assert verdict.action == "rollback" and verdict.reason.startswith("canary p99 latency")
    assert "> 2 x stable" in verdict.reason and row(with_canary).canary_revision_id is None


def test_the_defaults_do_not_roll_back_a_healthy_canary_warming_up_on_a_busy_machine(
        alice: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> None:
    """What happened to a first canary: rolled back 11 s in, p99 41.6 against 14.7 ms, with every request fine."""
    deployment = serving(alice, fake, clock)
    start_canary(alice, deployment)  # the defaults
    ticks_until(deployment, canary_serving, clock)
    current = row(deployment)
    assert (current.canary_window_seconds, current.canary_min_requests) == (120, 100)
    stats(deployment, 1, 600, 0, 14.7)
    stats(deployment, 2, 150, 0, 41.6)
    clock.advance(11)
    assert gateway_canary.judge(deployment.pk).action == "wait"
    # Once warm it answers as fast as the stable revision: a whole window later, still no rollback.
    for _ in range(12):
        clock.advance(10)
        stats(deployment, 1, 600, 0, 14.7)
        stats(deployment, 2, 150, 0, 14.9)
    assert gateway_canary.judge(deployment.pk).action == "wait"
    assert row(deployment).canary_revision_id is not None


def test_the_stable_revision_is_measured_over_the_same_interval_as_the_canary(
        with_canary: Deployment, clock: Clock) -> None:
    # A quiet minute before the canary (1 ms) is no yardstick for a canary on the busy machine since (20 ms both).
    stats(with_canary, 1, 5000, 0, 1, at=clock.now - timedelta(seconds=20))
    clock.advance(30)
    stats(with_canary, 1, 200, 0, 20)
    stats(with_canary, 2, 200, 0, 20)
    assert gateway_canary.judge(with_canary.pk).action == "wait"
    assert row(with_canary).canary_revision_id is not None


def test_no_verdict_below_the_minimum_of_requests_nor_on_old_figures(
        with_canary: Deployment, clock: Clock) -> None:
    stats(with_canary, 2, 9, 9, 4)  # every one failed, but fewer than min_requests
    stats(with_canary, 2, 100, 100, 4, at=clock.now - timedelta(seconds=300))  # outside the window
    assert gateway_canary.judge(with_canary.pk).action == "wait"
    assert row(with_canary).canary_revision_id is not None


def test_a_clean_window_promotes_a_canary_only_when_asked_to(
        alice: Person, digits: Any, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    start_canary(alice, deployment, window_seconds=30, min_requests=10, auto_promote=True)
    ticks_until(deployment, canary_serving, clock)
    stats(deployment, 1, 100, 0, 4)
    stats(deployment, 2, 30, 0, 4)
    assert gateway_canary.judge(deployment.pk).action == "wait"  # not a whole window yet
    clock.advance(31)
    stats(deployment, 2, 30, 0, 4)
    verdict = gateway_canary.judge(deployment.pk)
    assert verdict.action == "promote" and row(deployment).serving_revision.number == 2
    assert any(e.startswith("Canary revision 2 promoted automatically: a clean window of 30 s")
               for e in events(deployment))


def test_the_verdict_is_a_function_of_the_figures() -> None:
    deployment = Deployment(canary_max_error_rate=0.05, canary_max_p99_ratio=2.0, canary_window_seconds=60,
                            canary_min_requests=20, canary_auto_promote=False)
    good = canary.Figures(requests=100, errors=1, p99_ms=10.0)
    assert canary.decide(deployment, good, good, 600).action == "wait"
    # A 2 ms p99 against 0.5 ms is four times slower and still noise.
    assert canary.decide(deployment, canary.Figures(100, 0, 2.0), canary.Figures(100, 0, 0.5), 10).action == "wait"
    assert canary.decide(deployment, canary.Figures(100, 6, 1.0), good, 10).reason == (
        "canary error rate 6.0% > 5.0% over 60 s, stable 1.0% (6 of 100 requests; p99 not judged: 10 s of the whole "
        "60 s window served)")


def test_a_promotion_says_which_guardrails_it_judged_and_on_how_many_requests() -> None:
    """What a newcomer saw: 'rolled back past 5.0% errors or 2x the stable p99 (at least 20 requests)', then promoted
    at 2.4x the stable p99 after 25 requests, because a p99 is judged on 100 requests of each only; nothing said so."""
    deployment = Deployment(canary_max_error_rate=0.05, canary_max_p99_ratio=2.0, canary_window_seconds=15,
                            canary_min_requests=20, canary_auto_promote=True)
    slow, stable = canary.Figures(25, 0, 24.0), canary.Figures(80, 0, 10.0)
    verdict = canary.decide(deployment, slow, stable, 16)
    assert verdict.action == "promote"
    assert verdict.reason.endswith("; error rate judged on 25 requests; p99 not judged: 25 of the 100 requests "
                                   "needed")
    assert canary.judged(deployment, canary.Figures(120, 0, 24.0), stable, 16) == (
        "error rate judged on 120 requests; p99 not judged: the stable revision has 80 of the 100 requests needed")
    assert canary.judged(deployment, canary.Figures(10, 0, 4.0), stable, 5) == (
        "error rate not judged: 10 of the 20 requests needed; p99 not judged: 10 of the 100 requests needed")
    both = canary.Figures(150, 0, 11.0), canary.Figures(300, 0, 10.0)
    assert canary.judged(deployment, *both, 9) == (
        "error rate judged on 150 requests; p99 not judged: 9 s of the whole 15 s window served")
    assert canary.decide(deployment, *both, 16).reason.endswith(
        "error rate judged on 150 requests; p99 judged on 150 canary and 300 stable requests")
    # Slower past the ratio with enough of both: the rollback names what it judged on.
    assert canary.decide(deployment, canary.Figures(150, 0, 40.0), both[1], 16).reason == (
        "canary p99 latency 40.0 ms > 2 x stable 10.0 ms over 15 s (150 canary and 300 stable requests)")
