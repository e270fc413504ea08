"""Inspection slots are fair between teams (models_registry/dispatch.py): at most INSPECTION_MAX_ACTIVE_PER_TEAM of
a team's uploads are queued or running for inspection; the rest wait in the database and are queued as the team's
own inspections end, and the periodic sweep repairs what a hard time limit or the broker left behind."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from models_registry import dispatch, tasks
from models_registry.models import ModelVersion
from tests.artifacts import tiny_onnx
from tests.support.people import Person


@pytest.fixture
def inspections(monkeypatch: pytest.MonkeyPatch, settings: Any) -> list[int]:
    """The inspections queued to the broker (none runs: the test drives them)."""
    settings.INSPECTION_MAX_ACTIVE_PER_TEAM = 2
    queued: list[int] = []
    monkeypatch.setattr(tasks, "send_inspection", lambda version_id: queued.append(version_id))
    return queued


Committer = Callable[..., Any]


@pytest.fixture
def committed(django_capture_on_commit_callbacks: Any) -> Committer:
    """Runs `action(*args)` as one request's or task's transaction: its on-commit callbacks (the dispatch of
    inspections) run when it returns, as the real commit would run them (the test's own transaction never commits)."""
    def run(action: Callable[..., Any], *args: Any) -> Any:
        with django_capture_on_commit_callbacks(execute=True):
            return action(*args)

    return run


def upload(person: Person, committed: Committer, model: str, count: int) -> list[int]:
    client = person.client()
    client.post("/api/v1/models/", {"name": model}, format="json")
    ids = []
    for _ in range(count):
        response = committed(lambda: client.post(f"/api/v1/models/{model}/versions/",
                                                 {"file": SimpleUploadedFile("m.onnx", tiny_onnx())},
                                                 format="multipart"))
        assert response.status_code == 201, response.json()
        assert response.json()["status"] == "validating"
        ids.append(ModelVersion.objects.get(model__name=model, number=response.json()["number"]).pk)
    return ids


def test_a_team_s_many_uploads_take_two_slots_and_another_team_s_upload_is_queued_at_once(
        alice: Person, charlie: Person, inspections: list[int], committed: Committer) -> None:
    alices = upload(alice, committed, "flood", 5)
    assert inspections == alices[:2]  # the other three wait in the database
    assert ModelVersion.objects.filter(pk__in=alices[2:], inspection_queued_at__isnull=True).count() == 3
    [charlies] = upload(charlie, committed, "one", 1)
    assert inspections == [*alices[:2], charlies]  # behind two of alice's, not five


def test_an_inspection_that_ends_hands_its_slot_to_the_team_s_oldest_waiting_upload(
        alice: Person, inspections: list[int], committed: Committer) -> None:
    alices = upload(alice, committed, "flood", 4)
    ModelVersion.objects.filter(pk=alices[0]).update(status=ModelVersion.Status.READY)
    committed(dispatch.finished, alices[0], tasks.send_inspection)
    assert inspections == alices[:3]
    # still validating (its task ran late): no slot is freed twice
    committed(dispatch.finished, alices[1], tasks.send_inspection)
    assert inspections == alices[:3]


def test_a_real_inspection_task_takes_and_releases_the_slot(alice: Person, inspections: list[int],
                                                            committed: Committer) -> None:
    alices = upload(alice, committed, "flood", 3)
    committed(tasks.inspect_version, alices[0])  # the task body, in this process
    first = ModelVersion.objects.get(pk=alices[0])
    assert first.status == "ready" and first.inspection_started_at is not None
    assert inspections == alices  # its slot went to the third


def test_a_deleted_or_inspected_version_s_task_passes_its_slot_on(alice: Person, inspections: list[int],
                                                                  committed: Committer) -> None:
    alices = upload(alice, committed, "flood", 4)
    assert committed(alice.client().delete, "/api/v1/models/flood/versions/1/").status_code == 204
    assert inspections == alices[:3]  # deleting a validating version frees its slot
    committed(tasks.inspect_version, alices[0])  # its task, still queued, finds nothing and frees nothing twice
    assert inspections == alices[:3]
    ModelVersion.objects.filter(pk=alices[1]).update(status=ModelVersion.Status.READY)  # inspected meanwhile
    committed(tasks.inspect_version, alices[1])
    assert inspections == alices


def test_the_sweep_marks_what_the_hard_limit_killed_invalid_and_queues_the_next(
        alice: Person, inspections: list[int], committed: Committer, settings: Any) -> None:
    alices = upload(alice, committed, "flood", 3)
    long_ago = timezone.now() - timedelta(seconds=settings.INSPECTION_TIME_LIMIT_SECONDS
                                          + settings.INSPECTION_KILL_GRACE_SECONDS + 31)
    ModelVersion.objects.filter(pk=alices[0]).update(inspection_started_at=long_ago)
    ModelVersion.objects.filter(pk=alices[1]).update(inspection_started_at=timezone.now())  # running: left alone
    assert committed(tasks.dispatch_inspections) == 1
    killed = ModelVersion.objects.get(pk=alices[0])
    assert killed.status == "invalid"
    assert killed.error.startswith(f"The inspection did not finish within {settings.INSPECTION_TIME_LIMIT_SECONDS:g} s")
    assert ModelVersion.objects.get(pk=alices[1]).status == "validating"
    assert inspections == alices


def test_the_sweep_queues_again_what_the_broker_lost(alice: Person, inspections: list[int],
                                                     committed: Committer) -> None:
    alices = upload(alice, committed, "flood", 2)
    ModelVersion.objects.filter(pk=alices[0]).update(
        inspection_queued_at=timezone.now() - dispatch.QUEUED_LOST_AFTER - timedelta(seconds=1))
    assert committed(tasks.dispatch_inspections) == 1
    assert inspections == [*alices, alices[0]]


def test_a_broker_that_is_down_gives_the_slot_back_for_the_sweep(
        alice: Person, inspections: list[int], committed: Committer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    def down(version_id: int) -> None:
        raise ConnectionRefusedError("no broker")

    monkeypatch.setattr(tasks, "send_inspection", down)
    [version] = upload(alice, committed, "flood", 1)
    assert ModelVersion.objects.get(pk=version).inspection_queued_at is None
    monkeypatch.setattr(tasks, "send_inspection", lambda version_id: inspections.append(version_id))
    assert committed(tasks.dispatch_inspections) == 1 and inspections == [version]


def test_a_version_whose_inspection_runs_cannot_be_deleted_so_its_slot_stays_taken(
        alice: Person, inspections: list[int], committed: Committer) -> None:
    """Issue 21 (8): deleting the row freed the slot while its task and trial run went on, so a team could run any
    number of inspections at once by deleting each as it started."""
    alices = upload(alice, committed, "flood", 3)
    assert committed(dispatch.started, alices[0])  # its task began (the trial run is running)
    client = alice.client()
    response = committed(client.delete, "/api/v1/models/flood/versions/1/")
    assert response.status_code == 409, response.content
    message = response.json()["error"]["message"]
    assert "Version 1 is being inspected" in message and "once its inspection ends" in message
    assert committed(client.delete, "/api/v1/models/flood/").status_code == 409  # nor with its model
    assert ModelVersion.objects.filter(pk=alices[0], status="validating").exists()
    assert inspections == alices[:2]  # the slot is still taken: the third waits
    # The inspection ends (the claimed task's body): its slot goes to the third, the version may go.
    from models_registry import inspection
    inspection.inspect_version(alices[0])
    committed(dispatch.finished, alices[0], tasks.send_inspection)
    assert inspections == alices
    assert committed(client.delete, "/api/v1/models/flood/versions/1/").status_code == 204


def test_an_inspection_delivered_twice_runs_once_and_the_second_leaves_the_first_alone(
        alice: Person, inspections: list[int], committed: Committer) -> None:
    """A message delivered twice (or a sample inspected in the web process while the worker takes its queued task):
    the second ran beside the first, found the bytes the first had just moved to their blob, and marked a good upload
    invalid (CI caught it as "The uploaded bytes are missing from storage")."""
    from models_registry import inspection

    [pk] = upload(alice, committed, "twice", 1)
    assert dispatch.started(pk)  # the first delivery's claim; its inspection is under way
    committed(tasks.inspect_version, pk)  # the second delivery: nothing to do
    version = ModelVersion.objects.get(pk=pk)
    assert version.status == "validating" and version.error == "" and version.staged_key
    inspection.inspect_version(pk)  # the first one ends
    version.refresh_from_db()
    assert version.status == "ready", version.error
    assert not dispatch.started(pk)


def test_inspect_here_waits_for_the_inspection_a_worker_claimed_first(
        alice: Person, inspections: list[int], committed: Committer, monkeypatch: pytest.MonkeyPatch) -> None:
    from models_registry import inspection

    [pk] = upload(alice, committed, "claimed", 1)
    assert dispatch.started(pk)  # the worker's task was first
    waits: list[float] = []

    def worker_meanwhile(seconds: float) -> None:  # the worker's inspection ends while this one waits
        waits.append(seconds)
        if len(waits) == 3:
            inspection.inspect_version(pk)

    monkeypatch.setattr(inspection.time, "sleep", worker_meanwhile)
    version = inspection.inspect_here(pk, wait_seconds=30)
    assert version.status == "ready", version.error
    assert len(waits) == 3  # it waited for the worker rather than inspect (and race) itself


def test_inspect_here_inspects_an_unclaimed_version_itself(alice: Person, inspections: list[int],
                                                           committed: Committer) -> None:
    from models_registry import inspection

    [pk] = upload(alice, committed, "mine", 1)
    version = inspection.inspect_here(pk, wait_seconds=0)
    assert version.status == "ready" and version.inspection_started_at is not None
