"""The tus 1.0 endpoint, with raw protocol requests and with the stock tuspy client against a live server."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from models_registry.models import Model, ModelVersion, Upload
from models_registry.tests.tus_client import TUS, create, patch, path_of
from tests.artifacts import tiny_onnx
from tests.support.people import Person


def test_options_advertises_the_protocol(alice: Person) -> None:
    response = alice.client().options("/api/v1/uploads/")
    assert response.status_code == 204
    assert response["Tus-Version"] == "1.0.0"
    assert set(response["Tus-Extension"].split(",")) == {"creation", "termination", "checksum", "expiration"}
    assert response["Tus-Checksum-Algorithm"] == "sha256"
    assert int(response["Tus-Max-Size"]) == settings.MAX_UPLOAD_SIZE


def test_an_upload_in_two_chunks_reaches_its_length(alice: Person) -> None:
    data = tiny_onnx()
    created = create(alice, len(data))
    assert created.status_code == 201
    assert "Upload-Expires" in created
    url = path_of(created["Location"])
    first = patch(alice, url, 0, data[:50])
    assert first.status_code == 204
    assert first["Upload-Offset"] == "50"
    head = alice.client().head(url, **TUS)
    assert head["Upload-Offset"] == "50"
    assert head["Upload-Length"] == str(len(data))
    assert head["Cache-Control"] == "no-store"
    second = patch(alice, url, 50, data[50:])
    assert second["Upload-Offset"] == str(len(data))
    upload = Upload.objects.get()
    assert upload.completed_at is not None
    assert (Path(settings.ARTIFACT_ROOT) / upload.key).read_bytes() == data


def test_it_answers_409_to_a_wrong_offset_and_keeps_the_bytes(alice: Person) -> None:
    data = tiny_onnx()
    url = path_of(create(alice, len(data))["Location"])
    patch(alice, url, 0, data[:50])
    response = patch(alice, url, 10, data[10:])
    assert response.status_code == 409
    assert "resume from 50" in response.json()["error"]["message"]
    assert Upload.objects.get().offset == 50
    assert (Path(settings.ARTIFACT_ROOT) / Upload.objects.get().key).read_bytes() == data[:50]


def test_it_answers_460_to_a_checksum_mismatch_and_discards_the_chunk(alice: Person) -> None:
    data = tiny_onnx()
    url = path_of(create(alice, len(data))["Location"])
    wrong = base64.b64encode(hashlib.sha256(b"something else").digest()).decode()
    response = patch(alice, url, 0, data[:50], HTTP_UPLOAD_CHECKSUM=f"sha256 {wrong}")
    assert response.status_code == 460
    assert Upload.objects.get().offset == 0
    right = base64.b64encode(hashlib.sha256(data[:50]).digest()).decode()
    assert patch(alice, url, 0, data[:50], HTTP_UPLOAD_CHECKSUM=f"sha256 {right}")["Upload-Offset"] == "50"


def test_it_refuses_other_checksum_algorithms(alice: Person) -> None:
    url = path_of(create(alice, 10)["Location"])
    response = patch(alice, url, 0, b"0123456789", HTTP_UPLOAD_CHECKSUM="md5 AAAA")
    assert response.status_code == 400
    assert "use sha256" in response.json()["error"]["message"]


def test_it_needs_the_tus_version_header(alice: Person) -> None:
    response = alice.client().post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH="10")
    assert response.status_code == 412
    assert not Upload.objects.exists()


def test_it_answers_413_over_the_maximum_size(alice: Person, settings: Any) -> None:
    settings.MAX_UPLOAD_SIZE = 1000
    response = create(alice, 1001)
    assert response.status_code == 413
    assert "the limit is 1000 bytes" in response.json()["error"]["message"]
    assert not Upload.objects.exists()


def test_a_chunk_longer_than_what_remains_is_refused(alice: Person) -> None:
    url = path_of(create(alice, 10)["Location"])
    response = patch(alice, url, 0, b"x" * 20)
    assert response.status_code == 413
    assert Upload.objects.get().offset == 0


def test_termination_deletes_the_partial_upload(alice: Person) -> None:
    url = path_of(create(alice, 100)["Location"])
    patch(alice, url, 0, b"x" * 10)
    key = Upload.objects.get().key
    assert alice.client().delete(url, **TUS).status_code == 204
    assert not Upload.objects.exists()
    assert not (Path(settings.ARTIFACT_ROOT) / key).exists()


def test_charlie_cannot_touch_alices_upload(alice: Person, charlie: Person) -> None:
    url = path_of(create(alice, 100)["Location"])
    assert charlie.client().head(url, **TUS).status_code == 404
    assert patch(charlie, url, 0, b"x" * 10).status_code == 404
    assert charlie.client().delete(url, **TUS).status_code == 404
    assert Upload.objects.get().offset == 0


def test_expired_uploads_are_cleaned_up(alice: Person) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from models_registry.uploads import delete_expired_uploads

    url = path_of(create(alice, 100)["Location"])
    patch(alice, url, 0, b"x" * 10)
    key = Upload.objects.get().key
    assert delete_expired_uploads() == 0
    Upload.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert alice.client().head(url, **TUS).status_code == 410
    assert delete_expired_uploads() == 1
    assert not Upload.objects.exists()
    assert not (Path(settings.ARTIFACT_ROOT) / key).exists()


def test_a_finished_upload_becomes_a_version_once(alice: Person, eager_tasks: Any) -> None:
    Model.objects.create(team=alice.team, name="digits")
    data = tiny_onnx()
    url = path_of(create(alice, len(data))["Location"])
    patch(alice, url, 0, data)
    upload_id = url.rstrip("/").rsplit("/", 1)[-1]
    response = alice.client().post("/api/v1/models/digits/versions/", {"upload_id": upload_id}, format="json")
    assert response.status_code == 201, response.json()
    version = ModelVersion.objects.get()
    assert version.status == "ready", version.error
    assert version.original_filename == "model.onnx"
    again = alice.client().post("/api/v1/models/digits/versions/", {"upload_id": upload_id}, format="json")
    assert again.status_code == 400
    assert "can be used once" in again.json()["error"]["message"]


def test_an_unfinished_upload_cannot_become_a_version(alice: Person) -> None:
    Model.objects.create(team=alice.team, name="digits")
    url = path_of(create(alice, 100)["Location"])
    patch(alice, url, 0, b"x" * 10)
    upload_id = url.rstrip("/").rsplit("/", 1)[-1]
    response = alice.client().post("/api/v1/models/digits/versions/", {"upload_id": upload_id}, format="json")
    assert response.status_code == 400
    assert "not finished: 10 of 100 bytes" in response.json()["error"]["message"]
    assert not ModelVersion.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_stock_tuspy_client_uploads_and_resumes(alice: Person, live_server: Any, tmp_path: Path) -> None:
    from tusclient import client as tus_client

    data = tiny_onnx(in_features=64, out_features=512)  # ~130 KB
    source = tmp_path / "model.onnx"
    source.write_bytes(data)
    tus = tus_client.TusClient(f"{live_server.url}/api/v1/uploads/", headers={"Authorization": f"Bearer {alice.token}"})
    uploader = tus.uploader(str(source), chunk_size=40_000, metadata={"filename": "model.onnx"})
    uploader.upload_chunk()  # one chunk, then the "connection drops"
    url = uploader.url
    assert Upload.objects.get().offset == 40_000
    resumed = tus.uploader(str(source), chunk_size=40_000, url=url)
    assert resumed.offset == 40_000  # asked the server with HEAD
    resumed.upload()
    upload = Upload.objects.get()
    assert upload.offset == len(data)
    assert (Path(settings.ARTIFACT_ROOT) / upload.key).read_bytes() == data


@pytest.mark.parametrize(("header", "value", "message"), [
    ("HTTP_UPLOAD_LENGTH", "²", "Upload-Length must be a non-negative integer"),  # "²".isdigit() is True
    ("HTTP_UPLOAD_LENGTH", "٣", "Upload-Length must be a non-negative integer"),  # int() reads it as 3
    ("HTTP_UPLOAD_LENGTH", "9" * 5000, "at most 19 digits"),  # int() refuses over 4,300 digits
    ("HTTP_UPLOAD_LENGTH", " 10", "Upload-Length must be a non-negative integer"),
    ("HTTP_UPLOAD_METADATA", "filename é", "not valid base64"),  # b64decode raises ValueError, not binascii.Error
    ("HTTP_UPLOAD_METADATA", "filename /w==", "not valid base64 of UTF-8"),
    ("HTTP_UPLOAD_METADATA", "filename " + "QUFB" * 5000, "at most 16384 are accepted"),
])
def test_hostile_creation_headers_get_a_clear_400(alice: Person, header: str, value: str, message: str) -> None:
    headers = {"HTTP_UPLOAD_LENGTH": "10", header: value}
    response = alice.client().post("/api/v1/uploads/", **headers, **TUS)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
    assert not Upload.objects.exists()


@pytest.mark.parametrize(("headers", "message"), [
    ({"HTTP_UPLOAD_OFFSET": "²"}, "Upload-Offset must be a non-negative integer"),
    ({"HTTP_UPLOAD_CHECKSUM": "sha256 é"}, "Upload-Checksum digest is not valid base64"),
])
def test_hostile_patch_headers_get_a_clear_400(alice: Person, headers: dict[str, str], message: str) -> None:
    url = path_of(create(alice, 10)["Location"])
    response = alice.client().generic("PATCH", url, b"x", content_type="application/offset+octet-stream",
                                      **{"HTTP_UPLOAD_OFFSET": "0", **headers}, **TUS)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
    assert Upload.objects.get().offset == 0


def test_a_body_of_unknown_length_past_the_uploads_end_is_refused_whole(alice: Person) -> None:
    """What a server without the thin path hands the view for a chunked PATCH: the view cut it at the upload's
    length and kept the start. (Under `make run` the thin path handles PATCH: see test_tus_asgi.py.)"""
    import io

    from models_registry.uploads import UploadProblem, append_chunk

    upload = Upload.objects.get(pk=path_of(create(alice, 100)["Location"]).rsplit("/", 1)[-1])
    with pytest.raises(UploadProblem) as refused:
        append_chunk(upload, 0, io.BytesIO(b"x" * 1000), None, None)
    assert refused.value.status == 413
    upload.refresh_from_db()
    assert upload.offset == 0 and upload.busy_until is None
    assert append_chunk(upload, 0, io.BytesIO(b"y" * 100), None, None).offset == 100
    assert (Path(settings.ARTIFACT_ROOT) / upload.key).read_bytes() == b"y" * 100
