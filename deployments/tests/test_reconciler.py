"""The reconciler's every path, tick by tick, through an in-memory runtime (fake_runtime.py): a rollout that keeps
the old revision serving and drains it, a restart of a dead server, a launch stuck past its deadline, a model that
fails to load, a change of spec mid-rollout, a burst of changes, stop, start, delete, an unavailable runtime and a
user who changes the deployment while a tick runs. No tick waits: each returns in milliseconds with the seconds it
wants until the next one, and time moves only when a test moves the clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from deployments import actions, reconcile, tasks
from deployments.models import Deployment, Event
from deployments.runtimes.base import Launch
from deployments.tests.fake_runtime import FakeRuntime
from deployments.tests.reconciling import (
    Clock,
    change,
    create,
    events,
    ready,
    serving,
    tick,
    ticks_until,
)
from models_registry.models import ModelVersion
from tests.support.people import Person

S = Deployment.Status


def test_a_new_deployment_renders_launches_and_serves_one_step_per_tick(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    deployment = create(alice)
    assert tick(deployment) == reconcile.NOW
    assert Deployment.objects.get(pk=deployment.pk).status == S.STARTING
    assert fake.calls == ["prepare r1"]
    assert tick(deployment) == fake.poll_seconds  # launched: look again in a second
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status == S.STARTING and row.upstream_url == row.grpc_upstream == ""
    assert row.launch_deadline == clock.now + timedelta(seconds=fake.ready_timeout_seconds)
    assert tick(deployment) == fake.poll_seconds  # first look: still loading
    tick(deployment)  # second look: ready, and switched
    row = Deployment.objects.get(pk=deployment.pk)
    [server] = fake.servers
    assert row.status == S.READY and row.status_message == "Serving revision 1."
    assert row.upstream_url == server.url and row.serving_revision_id == row.revision_id
    assert row.grpc_upstream == server.grpc_target == "fake-triton-1:8001"  # both gateways' routes, one UPDATE
    assert row.serving_launch == Launch(row.revision_id, server.url, "fake server 1", 1,
                                                          grpc_target=server.grpc_target)
    assert row.launch is None and row.launch_deadline is None
    assert fake.calls == ["prepare r1", "launch r1", "observe 1", "observe 1"]
    assert events(deployment)[1:] == ["Rendered the model repository of revision 1.",
                                      "Triton for revision 1 is starting (fake server 1).",
                                      "Revision 1 is ready and serving (fake server 1)."]
    # Serving: the next ticks only check its health, and want none sooner than the periodic one.
    tick(deployment)
    assert tick(deployment) is None and fake.calls[-1] == "check 1"


def test_a_rollout_keeps_the_old_revision_serving_until_the_new_one_is_ready_then_drains_it(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock, settings: Any) -> None:
    settings.ROLLOUT_DRAIN_SECONDS = 30.0
    deployment = serving(alice, fake, clock)
    old = fake.servers[0]
    change(alice, deployment, 500)
    while True:
        wait = tick(deployment)
        row = Deployment.objects.get(pk=deployment.pk)
        if row.status == S.READY:
            break
        assert row.upstream_url == old.url and row.serving_revision.number == 1  # type: ignore[union-attr]
        assert row.grpc_upstream == old.grpc_target
        clock.advance(wait or 0)
    new = fake.servers[1]
    assert row.upstream_url == new.url and row.serving_revision.number == 2  # type: ignore[union-attr]
    assert row.grpc_upstream == new.grpc_target
    # Requests routed to the old server before the switch still get their answer: it drains, it is not stopped.
    assert old.running and row.drain_until == clock.now + timedelta(seconds=30)
    assert wait == 30.0  # the next tick is due when the drain ends
    clock.advance(10)
    assert tick(deployment) == 20.0 and old.running
    clock.advance(20)
    tick(deployment)
    assert old.state == "stopped" and new.running
    assert Deployment.objects.get(pk=deployment.pk).drain_until is None
    assert events(deployment)[-1] == "Stopped fake server 1 of revision 1."


def test_a_rollout_on_the_same_url_drains_the_old_revision_too(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock, settings: Any) -> None:
    # A shared pool: the new revision is loaded in the same Triton under other names. A gateway's cached route may
    # still name the old revision for GATEWAY_CACHE_TTL_SECONDS, so it is unloaded only after the drain.
    settings.ROLLOUT_DRAIN_SECONDS = 30.0
    fake.one_url = "http://127.0.0.1:9999"
    deployment = serving(alice, fake, clock)
    old = fake.servers[0]
    change(alice, deployment, 500)
    ticks_until(deployment, lambda d: d.serving_revision is not None and d.serving_revision.number == 2, clock)
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.upstream_url == fake.one_url and row.drain_until == clock.now + timedelta(seconds=30)
    assert old.running
    clock.advance(30)
    tick(deployment)
    assert old.state == "stopped"


def test_a_dead_server_is_restarted_with_an_event_and_no_route_meanwhile(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    fake.servers[0].state = "dead"  # kill -9
    tick(deployment)
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status == S.STARTING and row.upstream_url == ""  # the gateway answers 503, not a dead server's 502
    assert row.grpc_upstream == ""  # and the gRPC gateway UNAVAILABLE
    assert events(deployment)[-1] == "Revision 1 stopped serving: fake server 1 died; restarting it. Last log lines:"
    ticks_until(deployment, ready, clock)
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.upstream_url == fake.servers[1].url and fake.launched_revisions() == [1, 1]
    assert row.grpc_upstream == fake.servers[1].grpc_target


def test_a_server_an_operator_stopped_is_started_again_as_news_not_an_error(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    """A newcomer's walk (issue 31): after `make stop-triton` every deployment got an error event at the next start,
    as if its Triton had crashed, filling the admin's "Errors in the last 24 hours"."""
    deployment = serving(alice, fake, clock)
    fake.servers[0].state = "stopped by an operator"
    tick(deployment)
    [told] = Event.objects.filter(deployment=deployment, message__contains="stopped by an operator")
    assert told.kind == Event.Kind.INFO
    assert told.message == "Revision 1 stopped serving: fake server 1 was stopped by an operator; starting it again."
    ticks_until(deployment, ready, clock)
    assert not Event.objects.filter(deployment=deployment, kind=Event.Kind.ERROR).exists()


def test_a_health_check_that_cannot_tell_keeps_the_route_and_says_why_once(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    route = Deployment.objects.get(pk=deployment.pk).upstream_url
    fake.cannot_tell = "Kubernetes refused to let Modelport read Deployment ns/digits: forbidden"
    tick(deployment)
    tick(deployment)
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status == S.READY and row.upstream_url == route  # nothing restarted, the route stays
    assert row.status_message == ("Serving; the runtime cannot tell whether it still serves revision 1: Kubernetes "
                                  "refused to let Modelport read Deployment ns/digits: forbidden")
    assert [e for e in events(deployment) if e.startswith("Cannot tell")] == [
        "Cannot tell whether revision 1 still serves: Kubernetes refused to let Modelport read Deployment "
        "ns/digits: forbidden"]  # once, not at every tick
    assert fake.launched_revisions() == [1]
    fake.cannot_tell = ""
    tick(deployment)
    assert Deployment.objects.get(pk=deployment.pk).status_message == "Serving revision 1."


def test_a_launch_that_never_becomes_ready_fails_at_its_deadline_and_the_old_revision_keeps_serving(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    fake.ready_after = None  # hangs
    change(alice, deployment, 500)
    waits = ticks_until(deployment, lambda d: d.status == S.FAILED, clock, limit=100)
    assert max(w for w in waits if w is not None) <= fake.poll_seconds  # looked at every second, never waited
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status_message == ("Revision 2 failed to start: not ready after 60 s: loading its models (look 60) "
                                  "Revision 1 keeps serving.")
    assert row.upstream_url == fake.servers[0].url and fake.servers[0].running
    assert fake.servers[1].state == "stopped"  # abandoned
    assert tick(deployment) is None  # a failed deployment waits for the user


def test_a_model_that_fails_to_load_fails_the_rollout_with_the_runtimes_words(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    fake.fails_with = "failed to load 'digits': Invalid argument: bad ONNX"
    deployment = create(alice)
    ticks_until(deployment, lambda d: d.status == S.FAILED, clock)
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status_message == ("Revision 1 failed to start: failed to load 'digits': Invalid argument: bad ONNX\n"
                                  "E: the last lines of its log")
    assert row.upstream_url == "" and Event.objects.filter(kind="error", deployment=deployment).count() == 1
    # Retry: the user starts it again, and it comes up once the model loads.
    fake.fails_with = ""
    actions.start_deployment(row, alice.user)
    ticks_until(deployment, ready, clock)


def test_changing_the_spec_mid_rollout_abandons_the_launch_and_rolls_out_the_newest(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    fake.ready_after = 5
    change(alice, deployment, 500)
    ticks_until(deployment, lambda d: d.launch is not None, clock)
    starting = fake.servers[1]
    change(alice, deployment, 900)  # the user changes their mind while revision 2 loads
    ticks_until(deployment, lambda d: d.status == S.READY, clock)
    row = Deployment.objects.get(pk=deployment.pk)
    assert starting.state == "stopped" and f"abandon {starting.ref}" in fake.calls
    assert row.serving_revision.number == 3 and fake.launched_revisions() == [1, 2, 3]  # type: ignore[union-attr]
    assert row.upstream_url == fake.servers[2].url


def test_a_burst_of_changes_costs_one_rollout_of_the_last_revision(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    for delay in range(1, 21):
        change(alice, deployment, delay)
    ticks_until(deployment, ready, clock)
    assert fake.launched_revisions() == [1, 21]
    assert Deployment.objects.get(pk=deployment.pk).serving_revision.number == 21  # type: ignore[union-attr]


def test_preparation_that_takes_several_ticks_says_what_it_waits_for(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    fake.preparing_for = 2
    deployment = create(alice)
    assert tick(deployment) == 3.0
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status == S.RENDERING and row.status_message == "Building the environment of revision 1."
    assert fake.calls == ["prepare r1"]  # nothing is launched before the preparation is done
    ticks_until(deployment, ready, clock)
    assert fake.calls[:4] == ["prepare r1", "prepare r1", "prepare r1", "launch r1"]


def test_a_revision_whose_environment_is_being_built_shows_building_and_says_so_once(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    fake.preparing_for, fake.building = 3, True
    deployment = create(alice)
    assert tick(deployment) == 3.0
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status == S.BUILDING and row.status_message == "Building the environment of revision 1."
    assert row.is_transitional
    tick(deployment)
    tick(deployment)
    building_events = Event.objects.filter(deployment=deployment, message="Building the environment of revision 1.")
    assert building_events.count() == 1  # one event, not one per look
    assert reconcile.needs_attention() == [deployment.pk]  # the periodic tick keeps looking while it builds
    ticks_until(deployment, ready, clock)
    assert "launch r1" in fake.calls


def test_an_environment_that_cannot_be_built_fails_the_deployment_with_pips_message(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    fake.preparing_for, fake.building = 1, True
    fake.build_fails_with = "ERROR: No matching distribution found for nonexistent-pkg-zzz==9.9"
    deployment = create(alice)
    tick(deployment)
    tick(deployment)
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status == S.FAILED
    assert row.status_message == (
        "Revision 1 cannot be prepared: pip could not install its python packages (nonexistent-pkg-zzz==9.9)\n"
        "ERROR: No matching distribution found for nonexistent-pkg-zzz==9.9")
    assert Event.objects.filter(deployment=deployment, kind=Event.Kind.ERROR,
                                message__contains="No matching distribution found").exists()
    assert fake.servers == []


def test_a_revision_that_cannot_be_rendered_fails_with_the_errors(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    fake.render_errors = {"digits.format": ["TensorRT plans cannot be served locally"]}
    deployment = create(alice)
    tick(deployment)
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status == S.FAILED
    assert row.status_message == ("Revision 1 cannot be rendered: digits.format: TensorRT plans cannot be served "
                                  "locally")
    assert fake.servers == []


def test_stop_stops_everything_even_what_was_starting_and_start_brings_it_back(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    fake.ready_after = 10
    change(alice, deployment, 500)
    ticks_until(deployment, lambda d: d.launch is not None, clock)
    actions.stop_deployment(Deployment.objects.get(pk=deployment.pk), alice.user)
    assert tick(deployment) is None
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status == S.STOPPED and row.upstream_url == row.grpc_upstream == "" and row.serving_revision is None
    assert row.launch is None and row.serving_launch is None and row.drain_until is None
    assert not fake.running(row)
    assert tick(deployment) is None and fake.calls[-1] == "stop"  # at rest: nothing more is asked of the runtime
    fake.ready_after = 1
    actions.start_deployment(row, alice.user)
    ticks_until(deployment, ready, clock)
    assert [s.revision_number for s in fake.running(row)] == [2]


def test_delete_answers_at_once_and_the_worker_tears_down(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    response = alice.client().delete("/api/v1/deployments/digits-prod/")
    assert response.status_code == 202
    row = Deployment.objects.get(pk=deployment.pk)  # still there: the request ran no reconciler
    assert row.desired_state == "deleted" and row.upstream_url == row.grpc_upstream == ""
    assert "teardown" not in fake.calls
    assert alice.client().get("/api/v1/deployments/digits-prod/").status_code == 404
    assert tick(deployment) is None
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    assert fake.torn_down == [deployment.pk] and not fake.running(deployment)


def test_an_unavailable_runtime_fails_a_start_and_a_stop_waits_for_it_without_repeating_itself(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    fake.unavailable = "The Kubernetes API server is not reachable"
    deployment = create(alice)
    tick(deployment)
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status == S.FAILED and row.status_message == "The Kubernetes API server is not reachable"
    actions.stop_deployment(row, alice.user)
    for _ in range(3):
        assert tick(deployment) is None  # the periodic tick tries again
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status == S.STOPPING
    assert row.status_message == "Waiting for the runtime: The Kubernetes API server is not reachable"
    assert Event.objects.filter(deployment=deployment, kind="warning").count() == 1
    assert deployment.pk in reconcile.needs_attention()
    fake.unavailable = ""
    tick(deployment)
    assert Deployment.objects.get(pk=deployment.pk).status == S.STOPPED


def test_a_change_made_while_a_tick_runs_wins_over_what_the_tick_writes(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = create(alice)
    prepare = fake.prepare

    def user_changes_it_meanwhile(revision: Any) -> Any:
        change(alice, deployment, 700)  # committed while the tick renders revision 1
        return prepare(revision)

    monkeypatch.setattr(fake, "prepare", user_changes_it_meanwhile)
    assert tick(deployment) == reconcile.NOW
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status == S.PENDING and row.revision.number == 2  # type: ignore[union-attr]
    monkeypatch.setattr(fake, "prepare", prepare)
    ticks_until(deployment, ready, clock)
    assert fake.launched_revisions() == [2]  # revision 1 was rendered, never launched


def test_a_second_worker_leaves_the_deployment_to_the_one_holding_it(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    deployment = create(alice)
    assert deployment.claim(reconcile.LEASE_SECONDS)
    assert tick(deployment) == reconcile.BUSY_RETRY_SECONDS  # and looks again shortly: the holder may have read
    assert fake.calls == []                                  # the state before a change
    Deployment.objects.filter(pk=deployment.pk).update(lease_until=None)
    assert tick(deployment) == reconcile.NOW


def test_a_deployment_made_ready_by_an_older_modelport_adopts_what_serves_it(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    # As the migration leaves it; and made ready before the gRPC gateway, with no server found for its gRPC route.
    Deployment.objects.filter(pk=deployment.pk).update(serving_launch=None, grpc_upstream="")
    assert tick(deployment) == reconcile.NOW
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.status == S.READY and row.serving_launch is not None and row.serving_launch.ref == 1
    assert row.grpc_upstream == fake.servers[0].grpc_target
    assert fake.launched_revisions() == [1]  # adopted, not started twice


def test_a_launch_recorded_before_it_had_a_grpc_target_still_loads() -> None:
    stored = {"revision_id": 7, "url": "http://127.0.0.1:41000", "description": "pid 1", "ref": 3}
    assert Launch.from_json(stored) == Launch(7, "http://127.0.0.1:41000", "pid 1", 3, grpc_target="")
    launch = Launch(7, "http://127.0.0.1:41000", "pid 1", 3, grpc_target="127.0.0.1:41001")
    assert Launch.from_json(launch.to_json()) == launch


def test_the_launch_columns_read_and_write_launches_as_the_json_they_always_held(
        alice: Person, digits: ModelVersion) -> None:
    """deployments.models.LaunchField: parsed in one place, and the stored JSON is what earlier code wrote and read."""
    deployment = create(alice)
    launch = Launch(deployment.revision_id, "http://127.0.0.1:41000", "pid 1", 3, grpc_target="127.0.0.1:41001")
    old = {"revision_id": deployment.revision_id, "url": "http://127.0.0.1:41002", "description": "pid 2", "ref": 4}
    Deployment.objects.filter(pk=deployment.pk).update(serving_launch=launch, launch=old, canary_launch=["junk"])
    row = Deployment.objects.get(pk=deployment.pk)
    assert row.serving_launch == launch
    assert row.launch == Launch(deployment.revision_id, "http://127.0.0.1:41002", "pid 2", 4)
    assert row.canary_launch is None  # what holds no launch reads as none, as Launch.from_json says
    stored = Deployment.objects.filter(pk=deployment.pk).values_list("serving_launch__url", "launch__ref").get()
    assert stored == ("http://127.0.0.1:41000", 4)
    assert Deployment.objects.filter(serving_launch__isnull=False, canary_launch__ref__isnull=True).count() == 1
    row.launch = launch.to_json()  # a dict assigned (fixtures, tests) is a Launch at once
    assert row.launch == launch


# --- The tasks: what queues the next tick --------------------------------------------------------------------


@pytest.fixture
def reconciles_sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, dict[str, Any]]]:
    """What would go to the broker: (deployment id, options)."""
    calls: list[tuple[int, dict[str, Any]]] = []
    monkeypatch.setattr(tasks.reconcile_deployment, "apply_async",
                        lambda args, **options: calls.append((args[0], options)))
    return calls


def test_each_tick_queues_the_next_one_with_the_wait_it_asked_for(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock,
        reconciles_sent: list[tuple[int, dict[str, Any]]]) -> None:
    deployment = create(alice)
    tasks.reconcile_deployment(deployment.pk)  # renders
    tasks.reconcile_deployment(reconciles_sent[-1][0], **reconciles_sent[-1][1]["kwargs"])  # launches
    assert [options.get("countdown") for _, options in reconciles_sent] == [None, fake.poll_seconds]
    assert Deployment.objects.get(pk=deployment.pk).reconcile_due_at == clock.now + timedelta(seconds=1)
    # A follow-up due in a second does not hold back what a user asks for now; a second request now is coalesced.
    assert tasks.queue_reconcile(deployment.pk) is True
    assert tasks.queue_reconcile(deployment.pk) is False
    assert len(reconciles_sent) == 3


def test_a_task_clears_only_its_own_mark(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock,
        reconciles_sent: list[tuple[int, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = create(alice)
    assert tasks.queue_reconcile(deployment.pk, countdown=10)
    early = clock.now.isoformat()
    monkeypatch.setattr(reconcile, "reconcile", lambda deployment_id, queue_build: None)
    tasks.reconcile_deployment(deployment.pk, due=early)  # an older task: the one due in 10 s still waits
    assert Deployment.objects.get(pk=deployment.pk).reconcile_due_at == clock.now + timedelta(seconds=10)
    tasks.reconcile_deployment(deployment.pk, **reconciles_sent[-1][1]["kwargs"])
    assert Deployment.objects.get(pk=deployment.pk).reconcile_due_at is None


def test_a_failed_rollouts_leftovers_are_retired_when_the_drain_ends(
        alice: Person, digits: ModelVersion, fake: FakeRuntime, clock: Clock) -> None:
    deployment = serving(alice, fake, clock)
    Deployment.objects.filter(pk=deployment.pk).update(status=S.FAILED, drain_until=clock.now)
    assert deployment.pk in reconcile.needs_attention()
    tick(deployment)
    assert Deployment.objects.get(pk=deployment.pk).drain_until is None
    assert deployment.pk not in reconcile.needs_attention()
