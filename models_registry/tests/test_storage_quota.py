"""Uploads are refused, with a 413 that says why, when the team's storage quota or the disk cannot hold what they
declare (issue 21, disk; issue 30: a reservation is its own team's, see test_upload_reservations). The disk's free
space is faked; everything else is the real API and database."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from models_registry import quota, tasks
from models_registry.models import Model, ModelVersion, TeamStorageQuota, Upload
from models_registry.tests.tus_client import TUS, create, patch, path_of
from tests.artifacts import tiny_onnx
from tests.support.people import Person

GiB = 1024**3


class _Usage(NamedTuple):
    total: int
    used: int
    free: int


@pytest.fixture
def free_space(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The artifact disk's free space, as the test sets it."""
    disk = {"free": 71 * GiB}

    def disk_usage(path: Any) -> _Usage:
        return _Usage(252 * GiB, 252 * GiB - disk["free"], disk["free"])

    monkeypatch.setattr(quota.shutil, "disk_usage", disk_usage)
    return disk


def test_uploads_declaring_20_gib_count_against_their_own_teams_caps_not_the_disk(alice: Person, charlie: Person,
                                                                                 free_space: dict[str, int]) -> None:
    """Issue 30 (5): each admitted reservation counted against the disk for every team, so one team's empty
    reservations refused the others' uploads. Now they count against the declaring team's own quota and caps."""
    statuses = [create(person, 20 * GiB) for person in (alice, charlie, alice, charlie, alice, charlie)]
    # 71 GiB free, 2 GiB reserved: each fits the disk; each team may have 40 GiB to come (2 x MAX_UPLOAD_SIZE).
    assert [r.status_code for r in statuses] == [201, 201, 201, 201, 413, 413]
    refused = statuses[4].json()["error"]
    assert refused["code"] == "too_large"
    assert "the unfinished uploads of team 'acme' have 40.0 GiB (42949672960 bytes) still to come" in refused["message"]
    assert "(UPLOAD_MAX_OPEN_BYTES_PER_TEAM)" in refused["message"]
    assert Upload.objects.count() == 4


def test_an_upload_above_the_free_space_less_the_reserve_is_refused(alice: Person,
                                                                    free_space: dict[str, int]) -> None:
    free_space["free"] = 3 * GiB
    assert create(alice, 1 * GiB + 1).status_code == 413  # 3 GiB free less 2 GiB in reserve
    assert create(alice, 1 * GiB).status_code == 201


def test_an_upload_above_the_teams_quota_is_refused_naming_it(alice: Person, bob: Person, charlie: Person,
                                                              settings: Any, free_space: dict[str, int]) -> None:
    settings.TEAM_STORAGE_QUOTA_BYTES = 1000
    assert create(alice, 600).status_code == 201
    refused = create(bob, 500)  # bob shares alice's team, and its quota
    assert refused.status_code == 413
    message = refused.json()["error"]["message"]
    assert "team 'acme' has 400 bytes left of its storage quota of 1000 bytes (600 bytes used" in message
    assert "ask an operator for a larger quota" in message
    assert create(charlie, 900).status_code == 201  # another team has a quota of its own
    # Terminating an unfinished upload gives its declared length back.
    url = f"/api/v1/uploads/{Upload.objects.get(team=alice.team).id}"
    assert alice.client().delete(url, **TUS).status_code == 204
    assert create(bob, 1000).status_code == 201


def test_an_operators_quota_for_a_team_replaces_the_default(alice: Person, charlie: Person, settings: Any) -> None:
    settings.TEAM_STORAGE_QUOTA_BYTES = 100
    TeamStorageQuota.objects.create(team=alice.team, bytes=10_000)
    assert create(alice, 5_000).status_code == 201
    assert create(charlie, 5_000).status_code == 413
    TeamStorageQuota.objects.filter(team=alice.team).update(bytes=0)
    assert create(alice, 1).status_code == 413


def test_hostile_lengths_are_400s_not_500s(alice: Person, free_space: dict[str, int]) -> None:
    for length in ("-1", "1e9", "9" * 20, "²", " 5"):
        response = alice.client().post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH=length, **TUS)
        assert response.status_code == 400, length
    assert create(alice, settings.MAX_UPLOAD_SIZE + 1).status_code == 413


def _post_file(person: Person, data: bytes) -> Any:
    return person.client().post("/api/v1/models/digits/versions/",
                                {"file": SimpleUploadedFile("model.onnx", data), "create_model": "true"},
                                format="multipart")


def test_stored_versions_count_against_the_quota_of_a_multipart_post(alice: Person, settings: Any) -> None:
    data = tiny_onnx()
    settings.TEAM_STORAGE_QUOTA_BYTES = len(data) * 3 // 2
    assert _post_file(alice, data).status_code == 201
    assert quota.usage_of(alice.team) == len(data)
    refused = _post_file(alice, data)
    assert refused.status_code == 413
    assert "storage quota" in refused.json()["error"]["message"]
    assert ModelVersion.objects.count() == 1
    staging = Path(settings.ARTIFACT_ROOT) / "staging"
    assert len(list(staging.iterdir())) == 1  # the refused file was not kept


def test_a_multipart_post_above_the_free_space_is_refused(alice: Person, settings: Any,
                                                          free_space: dict[str, int]) -> None:
    free_space["free"] = settings.STORAGE_FREE_SPACE_RESERVE_BYTES + 10
    refused = _post_file(alice, tiny_onnx())
    assert refused.status_code == 413
    assert "the server's disk can take only 10 bytes more" in refused.json()["error"]["message"]
    assert not Model.objects.exists()  # the model asked for with create_model is not left behind either


def test_a_chunk_that_would_eat_into_the_reserve_waits_with_a_507(alice: Person, settings: Any,
                                                                 free_space: dict[str, int]) -> None:
    url = path_of(create(alice, 100)["Location"])
    free_space["free"] = settings.STORAGE_FREE_SPACE_RESERVE_BYTES + 50  # something else filled the disk
    full = patch(alice, url, 0, b"x" * 100)
    assert full.status_code == 507
    assert "resume the upload later" in full.json()["error"]["message"]
    assert Upload.objects.get().offset == 0
    free_space["free"] = 71 * GiB
    assert patch(alice, url, 0, b"x" * 100).status_code == 204


def test_an_abandoned_upload_is_cleaned_by_the_periodic_task_and_frees_the_quota(alice: Person,
                                                                               settings: Any) -> None:
    settings.TEAM_STORAGE_QUOTA_BYTES = 1000
    url = path_of(create(alice, 1000)["Location"])
    patch(alice, url, 0, b"x" * 10)
    key = Upload.objects.get().key
    assert create(alice, 1).status_code == 413
    Upload.objects.update(expires_at=timezone.now() - timedelta(seconds=1))  # abandoned past UPLOAD_EXPIRY_HOURS
    assert tasks.delete_expired_uploads() == 1
    assert not Upload.objects.exists()
    assert not (Path(settings.ARTIFACT_ROOT) / key).exists()
    assert create(alice, 1000).status_code == 201


def test_without_a_local_disk_only_the_quota_applies(alice: Person, settings: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    settings.S3_BUCKET = "bucket"
    monkeypatch.setattr(shutil, "disk_usage", lambda path: pytest.fail("no local disk to look at"))
    assert quota.free_bytes() is None
    assert quota.room_for(alice.team).disk is None
