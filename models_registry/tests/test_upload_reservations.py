"""Issue 30 (5): a declared Upload-Length is a reservation of the declaring team's own, against its quota and its caps
on open uploads, never against another team's uploads; a reservation that sends nothing expires in minutes. Over
real HTTP, through portal.asgi on uvicorn (the tus PATCH's thin path), on this machine's real disk."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from infra.schedule import beat_schedule
from models_registry import quota, tasks
from models_registry.models import Upload
from models_registry.tests.live_portal import Answer, Live, b64, read_answer, request_head
from tests.support.people import Person

pytestmark = pytest.mark.django_db(transaction=True)
GiB = 1024**3


def _send(live: Live, method: str, path: str, person: Person, body: bytes = b"", **headers: str) -> Answer:
    with live.connect() as sock:
        sock.sendall(request_head(method, path, {"Authorization": f"Bearer {person.token}", "Tus-Resumable": "1.0.0",
                                                 "Content-Length": str(len(body)), **headers}))
        sock.sendall(body)
        return read_answer(sock)


def create(live: Live, person: Person, length: int) -> Answer:
    return _send(live, "POST", "/api/v1/uploads/", person, **{"Upload-Length": str(length),
                                                                "Upload-Metadata": f"filename {b64('model.onnx')}"})


def path_of(answer: Answer) -> str:
    assert answer.status == 201, answer.body
    return "/api/v1/uploads/" + answer.headers["location"].rstrip("/").rsplit("/", 1)[-1]


def patch(live: Live, person: Person, path: str, offset: int, body: bytes) -> Answer:
    return _send(live, "PATCH", path, person, body, **{"Upload-Offset": str(offset),
                                                       "Content-Type": "application/offset+octet-stream"})


def message(answer: Answer) -> str:
    try:
        return str(json.loads(answer.body)["error"]["message"])
    except ValueError:
        return f"{answer.status}: {answer.body!r}"


def test_one_teams_empty_reservations_leave_another_teams_upload_its_room(
        alice: Person, charlie: Person, live: Live, settings: Any) -> None:
    """Four creations declaring 20 GiB (or, on a disk with less room, together all of it) that send nothing: charlie's
    4,510-byte upload got 413 "the server's disk can take only 0 bytes more" for the next 24 hours."""
    free = quota.free_bytes()
    assert free is not None  # the artifacts are on this machine's disk
    room = free - settings.STORAGE_FREE_SPACE_RESERVE_BYTES
    assert room > 1024**2, "this test needs a disk with more than the reserve free"
    # Three of 20 GiB (or a quarter of the room) and a fourth of what is left: together exactly what the disk has,
    # so that counted against the disk they take it all, whatever this machine has free.
    first = min(20 * GiB, room // 4)
    sizes = [first, first, first, room - 3 * first]
    settings.MAX_UPLOAD_SIZE = max(sizes)
    settings.TEAM_STORAGE_QUOTA_BYTES = settings.UPLOAD_MAX_OPEN_BYTES_PER_TEAM = 2 * room
    reservations = [create(live, alice, size) for size in sizes]

    data = b"m" * 4510
    created = create(live, charlie, len(data))
    assert created.status == 201, message(created)
    sent = patch(live, charlie, path_of(created), 0, data)
    assert sent.status == 204, message(sent)
    assert sent.headers["upload-offset"] == "4510"
    victim = Upload.objects.get(team=charlie.team)
    assert victim.completed_at is not None
    assert (Path(django_settings.ARTIFACT_ROOT) / victim.key).read_bytes() == data

    # The attacker's reservations were each admitted against its own quota, and each nothing but a row and an empty
    # file: no disk was taken.
    assert [r.status for r in reservations] == [201] * 4, [message(r) for r in reservations]
    assert quota.usage_of(alice.team) == sum(sizes)
    assert quota.usage_of(charlie.team) == len(data)


def test_a_fifth_open_upload_is_refused_naming_the_cap_and_how_to_free_it(
        alice: Person, bob: Person, charlie: Person, live: Live) -> None:
    paths = [path_of(create(live, person, 1000)) for person in (alice, bob, alice, bob)]  # one team: acme
    fifth = create(live, alice, 1000)
    assert fifth.status == 429, message(fifth)
    text = message(fifth)
    assert "Team 'acme' has 4 unfinished uploads, the most it may have open at once (UPLOAD_MAX_OPEN_PER_TEAM = 4)" \
        in text
    assert "DELETE /api/v1/uploads/<id>" in text and "expires by itself" in text
    assert Upload.objects.filter(team=alice.team).count() == 4
    # Another team has caps of its own.
    assert create(live, charlie, 1000).status == 201
    # A finished upload no longer counts as open, and an ended one is gone.
    assert patch(live, alice, paths[0], 0, b"x" * 1000).status == 204
    assert _send(live, "DELETE", paths[1], bob).status == 204
    assert create(live, alice, 1000).status == 201
    assert create(live, bob, 1000).status == 201
    assert create(live, bob, 1000).status == 429


def test_a_teams_open_uploads_have_a_cap_on_the_bytes_still_to_come(
        alice: Person, charlie: Person, live: Live, settings: Any) -> None:
    settings.UPLOAD_MAX_OPEN_BYTES_PER_TEAM = 10_000
    first = path_of(create(live, alice, 6000))
    refused = create(live, alice, 5000)
    assert refused.status == 413, message(refused)
    assert ("The upload is 4.9 KiB (5000 bytes), but the unfinished uploads of team 'acme' have 5.9 KiB (6000 bytes) "
            "still to come, and may have at most 9.8 KiB (10000 bytes) together (UPLOAD_MAX_OPEN_BYTES_PER_TEAM)") \
        in message(refused)
    assert create(live, charlie, 10_000).status == 201  # not charlie's cap
    # What has arrived is no longer to come.
    assert patch(live, alice, first, 0, b"x" * 2000).status == 204
    assert create(live, alice, 5000).status == 201


def _poll(condition: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_reservation_that_sends_nothing_expires_and_its_client_is_told(
        alice: Person, live: Live, settings: Any) -> None:
    settings.UPLOAD_STALL_EXPIRY_SECONDS = 2
    settings.TEAM_STORAGE_QUOTA_BYTES = 1000
    stalled = path_of(create(live, alice, 1000))
    assert create(live, alice, 1000).status == 413  # the quota is reserved
    # Once no bytes came for the stall expiry, the reservation stops counting, before any sweep has run.
    _poll(lambda: create(live, alice, 1000).status == 201, "the stalled reservation still holds the quota")
    key = Upload.objects.get(pk=stalled.rsplit("/", 1)[-1]).key
    assert alice.client().head(stalled, HTTP_TUS_RESUMABLE="1.0.0").status_code == 410
    late = patch(live, alice, stalled, 0, b"x" * 10)
    assert late.status == 410, message(late)
    assert ("This upload expired: it received no bytes for 2 s (UPLOAD_STALL_EXPIRY_SECONDS), so its reservation "
            "was given back. Start a new upload.") in message(late)
    # The periodic sweep removes its row and its file; a client resuming then gets a 404 that says why it may be.
    assert tasks.delete_expired_uploads() == 1
    assert not Upload.objects.filter(pk=stalled.rsplit("/", 1)[-1]).exists()
    assert not (Path(django_settings.ARTIFACT_ROOT) / key).exists()
    gone = patch(live, alice, stalled, 0, b"x" * 10)
    assert gone.status == 404
    assert "it may have expired and been removed (an unfinished upload expires after 2 s with no bytes" \
        in message(gone)


def test_bytes_arriving_keep_a_reservation_alive(alice: Person, live: Live, settings: Any) -> None:
    settings.UPLOAD_STALL_EXPIRY_SECONDS = 600
    path = path_of(create(live, alice, 1000))
    upload = Upload.objects.get()
    created_expiry = upload.expires_at
    assert created_expiry <= timezone.now() + timedelta(seconds=600)  # minutes, not UPLOAD_EXPIRY_HOURS
    assert patch(live, alice, path, 0, b"x" * 10).status == 204
    upload.refresh_from_db()
    assert upload.expires_at > created_expiry
    # Finished, it waits to become a version as long as before: UPLOAD_EXPIRY_HOURS after it began.
    assert patch(live, alice, path, 10, b"x" * 990).status == 204
    upload.refresh_from_db()
    assert upload.expires_at == upload.created_at + timedelta(hours=settings.UPLOAD_EXPIRY_HOURS)


def test_the_sweep_leaves_an_upload_a_request_is_writing_to(alice: Person, live: Live) -> None:
    path = path_of(create(live, alice, 1000))
    now = timezone.now()
    Upload.objects.update(expires_at=now - timedelta(seconds=1), busy_until=now + timedelta(minutes=2))
    assert tasks.delete_expired_uploads() == 0
    assert Upload.objects.exists()
    Upload.objects.update(busy_until=None)
    assert tasks.delete_expired_uploads() == 1
    assert alice.client().head(path, HTTP_TUS_RESUMABLE="1.0.0").status_code == 404


def test_the_sweep_runs_every_minute() -> None:
    sweep = beat_schedule(5.0)["delete-expired-uploads"]
    assert sweep["task"] == "models_registry.tasks.delete_expired_uploads"
    assert sweep["schedule"] <= 60


def test_a_long_patch_whose_bytes_keep_arriving_outlives_the_stall_expiry_and_the_sweep(
        alice: Person, live: Live, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No byte is committed before a PATCH ends; its claim's renewals (while bytes flow) keep the upload alive."""
    from models_registry import tus_asgi

    settings.UPLOAD_STALL_EXPIRY_SECONDS = 1
    monkeypatch.setattr(tus_asgi, "RENEW_EVERY_SECONDS", 0.2)
    path = path_of(create(live, alice, 2000))
    upload = Upload.objects.get()
    with live.connect() as sock:
        sock.sendall(request_head("PATCH", path, {"Authorization": f"Bearer {alice.token}", "Tus-Resumable": "1.0.0",
                                                  "Content-Type": "application/offset+octet-stream",
                                                  "Upload-Offset": "0", "Content-Length": "2000"}))
        started = time.monotonic()
        sent = 0
        # Bytes every 0.12 s for longer than the stall expiry, with the sweep running all along.
        while sent < 2000:
            sock.sendall(b"y" * 100)
            sent += 100
            time.sleep(0.12)
            assert tasks.delete_expired_uploads() == 0
        assert time.monotonic() - started > 2  # past the expiry twice over
        answer = read_answer(sock)
    assert answer.status == 204, answer.body
    upload.refresh_from_db()
    assert upload.completed_at is not None
    assert (Path(django_settings.ARTIFACT_ROOT) / upload.key).read_bytes() == b"y" * 2000
