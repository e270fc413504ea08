"""Reconcile work is coalesced per deployment, and a PATCH that changes nothing does nothing.

A fuzzing run PATCHed deployments with `{}` and empty bodies: every one made a revision and rolled Triton, 761
reconcile tasks piled up, and a new deployment stayed pending for over 80 s behind them. Here the broker is
replaced by a recorder of what would be sent (the real worker and broker run in tests/test_faults.py), and
on-commit callbacks run as the real commit would run them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import kombu.exceptions
import pytest
from django.utils import timezone

from audit.models import AuditEntry
from deployments import tasks
from deployments.models import Deployment, Event, Revision
from models_registry.models import ModelVersion
from tests.support.people import Person
from tests.support.versions import make_ready_version


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The reconcile tasks handed to the broker, as (deployment id,) tuples."""
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks.reconcile_deployment, "apply_async", lambda args, **options: calls.append(tuple(args)))
    return calls


Committer = Callable[[Callable[[], Any]], Any]


@pytest.fixture
def committing(django_capture_on_commit_callbacks: Any) -> Committer:
    """Runs an action as one request's transaction: its on-commit callbacks run when it returns, as the real commit
    would run them (the test's own transaction never commits)."""
    def run(action: Callable[[], Any]) -> Any:
        with django_capture_on_commit_callbacks(execute=True):
            return action()

    return run


def create(person: Person, commit: Committer, name: str = "digits-prod") -> Deployment:
    response = commit(lambda: person.client().post("/api/v1/deployments/", {"name": name, "models": [
        {"model": "digits"}]}, format="json"))
    assert response.status_code == 201, response.json()
    return Deployment.objects.get(name=name)


def patch(person: Person, commit: Committer, body: Any, **kwargs: Any) -> Any:
    response = commit(lambda: person.client().patch("/api/v1/deployments/digits-prod/", body, **kwargs))
    assert response.status_code == 200, response.content
    return response.json()


def worker_runs_the_queued_task(monkeypatch: pytest.MonkeyPatch, deployment: Deployment) -> None:
    """What the worker does with a queued task, without starting Triton: the reconciler itself is a no-op here."""
    monkeypatch.setattr(tasks.reconcile, "reconcile", lambda deployment_id, queue_build: None)
    tasks.reconcile_deployment(deployment.pk)


@pytest.mark.parametrize("body", [{}, None, {"replicas": 1}, {"name": "digits-prod", "runtime": "local"},
                                  {"resources": {}}, {"resources": {"gpu": 0}}, {"autoscaling": None},
                                  {"models": [{"model": "digits"}]}, {"models": [{"model": "digits", "version": 1}]}])
def test_a_patch_that_changes_nothing_makes_no_revision_and_queues_nothing(
        alice: Person, digits: ModelVersion, enqueued: list[Any], committing: Committer, body: Any) -> None:
    deployment = create(alice, committing)
    assert len(enqueued) == 1
    enqueued.clear()
    Deployment.objects.filter(pk=deployment.pk).update(reconcile_due_at=None)  # the worker took the first task
    kwargs = {"format": "json"} if body is not None else {"content_type": "application/json"}
    body_after = patch(alice, committing, body if body is not None else "", **kwargs)
    assert body_after["revision"] == 1 and body_after["status"] == "pending"
    assert Revision.objects.filter(deployment=deployment).count() == 1
    assert not Event.objects.filter(message__contains="Revision 2").exists()
    assert not AuditEntry.objects.filter(action="deployment.update").exists()
    assert enqueued == []


def test_a_patch_with_a_change_still_makes_a_revision(alice: Person, digits: ModelVersion, enqueued: list[Any],
                                                      committing: Committer) -> None:
    create(alice, committing)
    assert patch(alice, committing, {"models": [{"model": "digits", "max_batch_size": 4}]},
                 format="json")["revision"] == 2
    assert patch(alice, committing, {"models": [{"model": "digits", "max_batch_size": 4}]},
                 format="json")["revision"] == 2


def test_a_newer_version_counts_as_a_change(alice: Person, digits: ModelVersion, enqueued: list[Any],
                                            committing: Committer) -> None:
    create(alice, committing)
    make_ready_version(alice, "digits")
    assert patch(alice, committing, {"models": [{"model": "digits"}]}, format="json")["models"][0]["version"] == 2


def test_a_burst_of_changes_queues_one_reconcile_until_the_worker_takes_it(
        alice: Person, digits: ModelVersion, enqueued: list[Any], committing: Committer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = create(alice, committing)
    for delay in range(1, 11):
        patch(alice, committing,
              {"models": [{"model": "digits", "dynamic_batching": {"max_queue_delay_microseconds": delay}}]},
              format="json")
    assert Revision.objects.filter(deployment=deployment).count() == 11
    assert enqueued == [(deployment.pk,)]  # one task for the creation and all 10 changes
    worker_runs_the_queued_task(monkeypatch, deployment)
    patch(alice, committing, {"models": [{"model": "digits", "max_batch_size": 2}]}, format="json")
    assert enqueued == [(deployment.pk,), (deployment.pk,)]  # a change after the worker started queues the next run


def test_each_deployment_has_its_own_queued_reconcile(alice: Person, digits: ModelVersion, enqueued: list[Any],
                                                      committing: Committer) -> None:
    first = create(alice, committing)
    create(alice, committing, name="digits-canary")
    assert enqueued == [(first.pk,), (Deployment.objects.get(name="digits-canary").pk,)]


def test_the_periodic_reconcile_queues_again_what_the_broker_lost(
        alice: Person, digits: ModelVersion, enqueued: list[Any], committing: Committer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = create(alice, committing)
    enqueued.clear()
    tasks.reconcile_all()
    assert enqueued == []  # the first task still waits: nothing more to send
    Deployment.objects.filter(pk=deployment.pk).update(
        reconcile_due_at=timezone.now() - tasks.QUEUED_FOR_AT_MOST - timedelta(seconds=1))
    assert tasks.reconcile_all() == 1  # lost with a Redis restart: queued again from the database
    assert enqueued == [(deployment.pk,)]


def test_a_change_made_while_the_broker_is_down_is_saved_and_picked_up_later(
        alice: Person, digits: ModelVersion, committing: Committer, monkeypatch: pytest.MonkeyPatch) -> None:
    def broker_down(args: Any, **options: Any) -> None:
        raise kombu.exceptions.OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(tasks.reconcile_deployment, "apply_async", broker_down)
    deployment = create(alice, committing)  # 201, not a 500 after the commit
    assert deployment.revision is not None and deployment.reconcile_due_at is None
    enqueued: list[Any] = []
    monkeypatch.setattr(tasks.reconcile_deployment, "apply_async", lambda args, **options: enqueued.append(tuple(args)))
    assert tasks.reconcile_all() == 1
    assert enqueued == [(deployment.pk,)]
