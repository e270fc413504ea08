"""Resumable uploads and version blobs on S3: the real tus endpoints against moto's S3 server over HTTP.

moto stands in for S3 because no real S3 can run on this machine; it is a real HTTP server speaking the S3 API, so
boto3's multipart uploads, copies and deletes go over the wire exactly as they would to AWS or MinIO."""

from __future__ import annotations

import base64
import hashlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from models_registry.models import Blob, Model, ModelVersion, Upload
from models_registry.storage import S3_PART_SIZE, S3Store, get_store
from tests.artifacts import tiny_onnx
from tests.support.people import Person

pytestmark = pytest.mark.s3

TUS = {"HTTP_TUS_RESUMABLE": "1.0.0"}
MiB = 1024 * 1024
PREFIX = "mp-test"


@dataclass
class Bucket:
    client: Any
    name: str


@pytest.fixture
def s3(s3_endpoint: str, settings: Any) -> Iterator[Bucket]:
    """A fresh bucket per test, with the portal's settings pointing at it, and a boto3 client of our own to look in."""
    import boto3

    bucket = f"modelport-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    client.create_bucket(Bucket=bucket)
    settings.S3_BUCKET = bucket
    settings.S3_ENDPOINT_URL = s3_endpoint
    settings.S3_REGION = "us-east-1"
    settings.S3_ACCESS_KEY_ID = "test"
    settings.S3_SECRET_ACCESS_KEY = "test"
    settings.S3_PREFIX = PREFIX
    get_store.cache_clear()
    yield Bucket(client, bucket)
    get_store.cache_clear()


def keys(s3: Bucket) -> list[str]:
    pages = s3.client.get_paginator("list_objects_v2").paginate(Bucket=s3.name)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def tails(s3: Bucket) -> list[str]:
    return [key for key in keys(s3) if ".tail-" in key]


def multipart_uploads(s3: Bucket) -> list[dict[str, Any]]:
    return s3.client.list_multipart_uploads(Bucket=s3.name).get("Uploads", [])  # type: ignore[no-any-return]


def read(s3: Bucket, key: str) -> bytes:
    return s3.client.get_object(Bucket=s3.name, Key=key)["Body"].read()  # type: ignore[no-any-return]


def sha256_header(data: bytes) -> str:
    return "sha256 " + base64.b64encode(hashlib.sha256(data).digest()).decode()


def create(person: Person, length: int, filename: str = "model.onnx") -> str:
    metadata = "filename " + base64.b64encode(filename.encode()).decode()
    response = person.client().post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH=str(length), HTTP_UPLOAD_METADATA=metadata,
                                    **TUS)
    assert response.status_code == 201, response.content
    return str(response["Location"]).split("testserver", 1)[-1]


def patch(person: Person, url: str, offset: int, body: bytes, **headers: Any) -> Any:
    return person.client().generic("PATCH", url, body, content_type="application/offset+octet-stream",
                                   HTTP_UPLOAD_OFFSET=str(offset), **TUS, **headers)


def upload_in_chunks(person: Person, url: str, data: bytes, sizes: list[int], start: int = 0) -> int:
    offset = start
    for size in sizes:
        response = patch(person, url, offset, data[offset:offset + size])
        assert response.status_code == 204, response.content
        offset += size
        assert response["Upload-Offset"] == str(offset)
    return offset


def upload_id(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def test_chunks_smaller_and_larger_than_a_part_become_one_object_with_the_exact_bytes(alice: Person,
                                                                                      s3: Bucket) -> None:
    data = os.urandom(20 * MiB + 12345)
    url = create(alice, len(data), filename="weights.bin")
    # Under the 5 MiB S3 minimum, across a part boundary, over a whole 8 MiB part, then a ragged end.
    sizes = [3 * MiB, 1 * MiB + 7, 9 * MiB, 3 * MiB - 7, 1, 4 * MiB + 12344]
    assert sum(sizes) == len(data)

    first = sizes[0]
    upload_in_chunks(alice, url, data, sizes[:1])
    assert multipart_uploads(s3) != []
    assert tails(s3) == [f"{PREFIX}/uploads/{upload_id(url)}.tail-0-{first}"]  # too small for a part yet
    upload_in_chunks(alice, url, data, sizes[1:], start=first)

    upload = Upload.objects.get()
    assert upload.completed_at is not None
    key = f"{PREFIX}/uploads/{upload.id}"
    assert keys(s3) == [key]
    assert hashlib.sha256(read(s3, key)).digest() == hashlib.sha256(data).digest()
    assert multipart_uploads(s3) == []
    head = s3.client.head_object(Bucket=s3.name, Key=key)
    assert head["ContentLength"] == len(data)
    assert head["ETag"].strip('"').endswith("-3")  # two full 8 MiB parts and the rest


def test_a_chunk_with_a_wrong_checksum_is_discarded_and_the_upload_resumes(alice: Person, s3: Bucket) -> None:
    data = os.urandom(19 * MiB)
    url = create(alice, len(data), filename="weights.bin")
    upload_in_chunks(alice, url, data, [6 * MiB])
    old_tail = f"{PREFIX}/uploads/{upload_id(url)}.tail-0-{6 * MiB}"
    assert tails(s3) == [old_tail]

    # 6 + 5 MiB crosses the first part boundary: a part is sent and a new tail written before the check fails.
    corrupted = bytearray(data[6 * MiB:11 * MiB])
    corrupted[-1] ^= 0xFF
    response = patch(alice, url, 6 * MiB, bytes(corrupted), HTTP_UPLOAD_CHECKSUM=sha256_header(data[6 * MiB:11 * MiB]))
    assert response.status_code == 460
    upload = Upload.objects.get()
    assert upload.offset == 6 * MiB
    assert upload.storage_state["parts"] == []
    assert alice.client().head(url, **TUS)["Upload-Offset"] == str(6 * MiB)
    assert tails(s3) == [old_tail]  # the rejected chunk's tail is gone, the committed one kept

    response = patch(alice, url, 6 * MiB, data[6 * MiB:11 * MiB],
                     HTTP_UPLOAD_CHECKSUM=sha256_header(data[6 * MiB:11 * MiB]))
    assert response.status_code == 204
    assert Upload.objects.get().storage_state["parts"] != []

    # A mismatch on the last chunk must not complete the multipart upload either.
    last = data[11 * MiB:]
    response = patch(alice, url, 11 * MiB, last[:-1] + b"\0", HTTP_UPLOAD_CHECKSUM=sha256_header(last))
    assert response.status_code == 460
    assert Upload.objects.get().completed_at is None
    assert multipart_uploads(s3) != []

    response = patch(alice, url, 11 * MiB, last, HTTP_UPLOAD_CHECKSUM=sha256_header(last))
    assert response.status_code == 204
    upload = Upload.objects.get()
    assert upload.completed_at is not None
    assert read(s3, f"{PREFIX}/{upload.key}") == data
    assert tails(s3) == []
    assert multipart_uploads(s3) == []
    assert keys(s3) == [f"{PREFIX}/{upload.key}"]


def test_termination_aborts_the_multipart_upload_and_deletes_its_tail(alice: Person, s3: Bucket) -> None:
    data = os.urandom(S3_PART_SIZE + 2 * MiB)
    url = create(alice, 20 * MiB, filename="weights.bin")
    upload_in_chunks(alice, url, data, [len(data)])
    assert len(multipart_uploads(s3)) == 1
    assert len(tails(s3)) == 1

    assert alice.client().delete(url, **TUS).status_code == 204
    assert not Upload.objects.exists()
    assert multipart_uploads(s3) == []
    assert keys(s3) == []
    assert alice.client().head(url, **TUS).status_code == 404


def test_a_finished_upload_becomes_a_version_whose_blob_is_stored_once_and_deleted_with_it(
    alice: Person, s3: Bucket, eager_tasks: Any
) -> None:
    Model.objects.create(team=alice.team, name="digits", created_by=alice.user)
    data = tiny_onnx()
    sha256 = hashlib.sha256(data).hexdigest()
    blob_key = f"{PREFIX}/blobs/sha256/{sha256[:2]}/{sha256}"

    for number in (1, 2):
        url = create(alice, len(data))
        upload_in_chunks(alice, url, data, [100, len(data) - 100])
        response = alice.client().post("/api/v1/models/digits/versions/", {"upload_id": upload_id(url)}, format="json")
        assert response.status_code == 201, response.json()
        version = ModelVersion.objects.get(model__name="digits", number=number)
        assert version.status == "ready", version.error
        assert version.sha256 == sha256
        assert version.artifact_key == f"blobs/sha256/{sha256[:2]}/{sha256}"
        # The upload's object was moved to (or, the second time, dropped in favour of) the content-addressed blob.
        assert keys(s3) == [blob_key]
        assert read(s3, blob_key) == data
        assert not Upload.objects.exists()
    assert Blob.objects.count() == 1

    assert alice.client().delete("/api/v1/models/digits/versions/1/").status_code == 204
    assert keys(s3) == [blob_key]  # version 2 still uses the bytes
    assert alice.client().delete("/api/v1/models/digits/versions/2/").status_code == 204
    assert not Blob.objects.exists()
    assert keys(s3) == []
    assert multipart_uploads(s3) == []


def test_a_failed_completion_leaves_the_last_chunk_to_be_sent_again(alice: Person, s3: Bucket,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(S3_PART_SIZE + 3 * MiB)
    url = create(alice, len(data), filename="weights.bin")
    upload_in_chunks(alice, url, data, [6 * MiB])
    store = get_store()
    assert isinstance(store, S3Store)
    complete = store.client.complete_multipart_upload

    def unavailable_once(**kwargs: Any) -> None:
        monkeypatch.setattr(store.client, "complete_multipart_upload", complete)
        raise ConnectionError("S3 is unavailable")

    # A transient error on CompleteMultipartUpload: the request fails, and the client may send the chunk again at
    # once (not 409 for the hour a PATCH holds its claim).
    monkeypatch.setattr(store.client, "complete_multipart_upload", unavailable_once)
    with pytest.raises(ConnectionError):
        patch(alice, url, 6 * MiB, data[6 * MiB:])
    upload = Upload.objects.get()
    assert (upload.offset, upload.completed_at, upload.busy_until) == (6 * MiB, None, None)

    upload_in_chunks(alice, url, data, [len(data) - 6 * MiB], start=6 * MiB)
    assert read(s3, f"{PREFIX}/{Upload.objects.get().key}") == data
    assert tails(s3) == []
    assert multipart_uploads(s3) == []


@pytest.mark.django_db(transaction=True)
def test_a_streamed_patch_keeps_what_arrived_on_s3_and_refuses_a_body_too_long(alice: Person, s3: Bucket) -> None:
    """The thin ASGI path (portal.asgi on uvicorn) into S3: a PATCH cut mid-part keeps its bytes (a part and a tail),
    a chunked body longer than the rest leaves the state as it was, and the rest completes the object."""
    from models_registry.tests.live_portal import chunked, live_portal, read_answer, request_head, settled

    data = os.urandom(21 * MiB)
    url = create(alice, len(data), filename="weights.bin")
    headers = {"Authorization": f"Bearer {alice.token}", "Tus-Resumable": "1.0.0",
               "Content-Type": "application/offset+octet-stream"}
    cut = 13 * MiB + 5
    with live_portal() as live:
        with live.connect() as sock:
            sock.sendall(request_head("PATCH", url,
                                      {**headers, "Upload-Offset": "0", "Content-Length": str(len(data))}))
            sock.sendall(data[:cut])
        upload = settled(Upload.objects.get(), offset=cut)
        assert upload.offset == cut
        assert len(upload.storage_state["parts"]) == 1
        assert tails(s3) == [f"{PREFIX}/uploads/{upload.id}.tail-1-{cut - S3_PART_SIZE}"]

        rest = data[cut:]
        with live.connect() as sock:
            sock.sendall(request_head("PATCH", url,
                                      {**headers, "Upload-Offset": str(cut), "Transfer-Encoding": "chunked"}))
            sock.sendall(chunked(rest, b"!"))
            assert read_answer(sock).status == 413
        upload = settled(upload)
        assert upload.offset == cut and len(upload.storage_state["parts"]) == 1
        assert tails(s3) == [f"{PREFIX}/uploads/{upload.id}.tail-1-{cut - S3_PART_SIZE}"]

        with live.connect() as sock:
            sock.sendall(request_head("PATCH", url,
                                      {**headers, "Upload-Offset": str(cut), "Content-Length": str(len(rest))}))
            sock.sendall(rest)
            answer = read_answer(sock)
        assert answer.status == 204, answer.body
    upload = settled(upload)
    assert upload.completed_at is not None
    assert read(s3, f"{PREFIX}/{upload.key}") == data
    assert tails(s3) == [] and multipart_uploads(s3) == []


def test_the_periodic_clean_up_aborts_stale_multipart_uploads_under_our_prefix_only(
        alice: Person, s3: Bucket, settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    """An abort that failed, or a worker killed in the middle of upload_fileobj, leaves a multipart upload whose
    parts cost storage for ever; the periodic task aborts those that no live upload holds once they are older than
    any upload could be. Another application's uploads in the same bucket are not ours to touch."""
    from datetime import timedelta

    from django.utils import timezone

    from models_registry import tasks, uploads

    live = create(alice, 10 * MiB)
    upload_in_chunks(alice, live, os.urandom(9 * MiB), [9 * MiB])  # one part sent: a live multipart upload
    orphan = s3.client.create_multipart_upload(Bucket=s3.name, Key=f"{PREFIX}/blobs/sha256/ab/orphan")
    foreign = s3.client.create_multipart_upload(Bucket=s3.name, Key="someone-else/file")
    assert len(multipart_uploads(s3)) == 3

    # The clock is set from what S3 says (moto dates every multipart upload 2010-11-10).
    begun = max(u["Initiated"] for u in multipart_uploads(s3))
    soon = begun + timedelta(hours=settings.UPLOAD_EXPIRY_HOURS)
    assert uploads.abort_stale_multipart_uploads(now=soon) == 0  # young enough to belong to a running upload
    later = begun + timedelta(hours=settings.UPLOAD_EXPIRY_HOURS + 2)
    with caplog.at_level("INFO", logger="models_registry.storage"):
        assert uploads.abort_stale_multipart_uploads(now=later) == 1
    left = {(u["Key"], u["UploadId"]) for u in multipart_uploads(s3)}
    live_state = Upload.objects.get().storage_state
    assert left == {(f"{PREFIX}/uploads/{upload_id(live)}", live_state["upload_id"]),
                    ("someone-else/file", foreign["UploadId"])}
    orphan_key = f"s3://{s3.name}/{PREFIX}/blobs/sha256/ab/orphan"
    assert f"aborted multipart upload {orphan['UploadId']} of {orphan_key}" in caplog.text
    # Once the live upload has expired, the task removes it, its multipart upload with it.
    Upload.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert tasks.delete_expired_uploads() == 1
    assert [u["Key"] for u in multipart_uploads(s3)] == ["someone-else/file"]


def test_a_failed_abort_is_logged_with_the_object_and_left_for_the_clean_up(
        alice: Person, s3: Bucket, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    url = create(alice, 10 * MiB)
    upload_in_chunks(alice, url, os.urandom(6 * MiB), [6 * MiB])
    store = get_store()
    assert isinstance(store, S3Store)

    def refuse(**kwargs: Any) -> None:
        raise RuntimeError("S3 is down")

    monkeypatch.setattr(store.client, "abort_multipart_upload", refuse)
    with caplog.at_level("WARNING", logger="models_registry.storage"):
        assert alice.client().delete(url, **TUS).status_code == 204
    upload = f"{PREFIX}/uploads/{upload_id(url)}"
    assert "storage: could not abort multipart upload" in caplog.text
    assert f"s3://{s3.name}/{upload} (RuntimeError: S3 is down); it is left behind" in caplog.text
    assert [u["Key"] for u in multipart_uploads(s3)] == [upload]  # for abort_stale_multipart_uploads
