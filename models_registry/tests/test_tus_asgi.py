"""The tus PATCH over real HTTP, through portal.asgi on uvicorn: the thin path streams the body into storage, keeps
what arrived when the connection drops or the body stops, and refuses what the Django view could not see coming."""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from models_registry.models import Upload
from models_registry.tests.live_portal import Live, b64, chunked, read_answer, request_head, settled
from tests.support.people import Person

pytestmark = pytest.mark.django_db(transaction=True)
TUS = {"HTTP_TUS_RESUMABLE": "1.0.0"}


def create(person: Person, length: int) -> Upload:
    response = person.client().post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH=str(length),
                                    HTTP_UPLOAD_METADATA=f"filename {b64('model.onnx')}", **TUS)
    assert response.status_code == 201, response.content
    return Upload.objects.get(pk=response["Location"].rstrip("/").rsplit("/", 1)[-1])


def patch_headers(person: Person | None, offset: int, **extra: str) -> dict[str, str]:
    headers = {"Tus-Resumable": "1.0.0", "Content-Type": "application/offset+octet-stream",
               "Upload-Offset": str(offset)}
    if person is not None:
        headers["Authorization"] = f"Bearer {person.token}"
    return {**headers, **extra}


def send_patch(live: Live, upload: Upload, body: bytes, headers: dict[str, str]) -> Any:
    with live.connect() as sock:
        sock.sendall(request_head("PATCH", f"/api/v1/uploads/{upload.pk}",
                                  {"Content-Length": str(len(body)), **headers}))
        sock.sendall(body)
        return read_answer(sock)


def stored(upload: Upload) -> bytes:
    return (Path(settings.ARTIFACT_ROOT) / upload.key).read_bytes()


def test_a_patch_streams_into_storage(alice: Person, live: Live) -> None:
    data = bytes(range(256)) * 12_000  # 3 MB: several batches
    upload = create(alice, len(data))
    answer = send_patch(live, upload, data, patch_headers(alice, 0))
    assert answer.status == 204, answer.body
    assert answer.headers["upload-offset"] == str(len(data))
    assert answer.headers["tus-resumable"] == "1.0.0"
    assert "upload-expires" in answer.headers
    upload.refresh_from_db()
    assert upload.offset == len(data) and upload.completed_at is not None and upload.busy_until is None
    assert stored(upload) == data


def test_a_dropped_connection_keeps_what_arrived_and_the_upload_resumes(alice: Person, live: Live) -> None:
    """Before the thin path Django spooled the whole body first: a PATCH cut at 60% kept nothing."""
    data = bytes(range(256)) * 8_000
    upload = create(alice, len(data))
    cut = 1_200_000
    with live.connect() as sock:
        sock.sendall(request_head("PATCH", f"/api/v1/uploads/{upload.pk}",
                                  {"Content-Length": str(len(data)), **patch_headers(alice, 0)}))
        sock.sendall(data[:cut])
        time.sleep(0.3)
    upload = settled(upload, offset=cut)
    assert upload.offset == cut
    assert stored(upload) == data[:cut]
    answer = send_patch(live, upload, data[cut:], patch_headers(alice, cut))
    assert answer.status == 204, answer.body
    assert stored(settled(upload)) == data


def test_a_body_shorter_than_its_content_length_times_out_and_keeps_what_arrived(
        alice: Person, live: Live, settings: Any) -> None:
    """It held the request until the client gave up."""
    settings.UPLOAD_IDLE_TIMEOUT_SECONDS = 1
    upload = create(alice, 1000)
    with live.connect(timeout=10) as sock:
        sock.sendall(request_head("PATCH", f"/api/v1/uploads/{upload.pk}",
                                  {"Content-Length": "1000", **patch_headers(alice, 0)}))
        sock.sendall(b"x" * 400)
        started = time.monotonic()
        answer = read_answer(sock)
        assert time.monotonic() - started < 5
        assert sock.recv(1) == b""  # and the connection is closed
    assert answer.status == 408
    assert answer.headers["upload-offset"] == "400"
    assert "No data for 1 s: the 400 bytes that arrived were kept; resume from offset 400" in answer.body.decode()
    upload = settled(upload)
    assert upload.offset == 400 and stored(upload) == b"x" * 400


def test_a_chunked_body_longer_than_what_remains_is_refused_and_nothing_kept(alice: Person, live: Live) -> None:
    """It was cut at the upload's length and answered 204: 900 bytes silently dropped."""
    upload = create(alice, 100)
    with live.connect() as sock:
        sock.sendall(request_head("PATCH", f"/api/v1/uploads/{upload.pk}",
                                  {"Transfer-Encoding": "chunked", **patch_headers(alice, 0)}))
        sock.sendall(chunked(b"a" * 60, b"b" * 940))
        answer = read_answer(sock)
    assert answer.status == 413
    assert "longer than the 100 bytes that remain in this upload; nothing of it was kept" in answer.body.decode()
    upload = settled(upload)
    assert upload.offset == 0 and stored(upload) == b""


def test_a_chunked_body_that_fits_is_kept(alice: Person, live: Live) -> None:
    upload = create(alice, 100)
    with live.connect() as sock:
        sock.sendall(request_head("PATCH", f"/api/v1/uploads/{upload.pk}",
                                  {"Transfer-Encoding": "chunked", **patch_headers(alice, 0)}))
        sock.sendall(chunked(b"a" * 30, b"b" * 30))
        answer = read_answer(sock)
    assert answer.status == 204
    assert answer.headers["upload-offset"] == "60"
    assert stored(settled(upload)) == b"a" * 30 + b"b" * 30


def test_a_content_length_over_what_remains_is_refused_before_reading(alice: Person, live: Live) -> None:
    upload = create(alice, 100)
    with live.connect() as sock:
        sock.sendall(request_head("PATCH", f"/api/v1/uploads/{upload.pk}",
                                  {"Content-Length": str(10**12), **patch_headers(alice, 0)}))
        answer = read_answer(sock)  # no body sent at all
    assert answer.status == 413
    assert "only 100 bytes remain" in answer.body.decode()


def checksum(data: bytes) -> str:
    return "sha256 " + base64.b64encode(hashlib.sha256(data).digest()).decode()


def test_a_chunk_with_a_checksum_is_kept_whole_or_not_at_all(alice: Person, live: Live) -> None:
    data = b"0123456789" * 300_000
    upload = create(alice, len(data))
    wrong = send_patch(live, upload, data, patch_headers(alice, 0, **{"Upload-Checksum": checksum(b"other")}))
    assert wrong.status == 460
    assert settled(upload).offset == 0
    with live.connect() as sock:  # the same chunk, cut short: it cannot be verified, so it is not kept
        sock.sendall(request_head("PATCH", f"/api/v1/uploads/{upload.pk}",
                                  {"Content-Length": str(len(data)),
                                   **patch_headers(alice, 0, **{"Upload-Checksum": checksum(data)})}))
        sock.sendall(data[:2_000_000])
    time.sleep(0.3)
    assert settled(upload).offset == 0
    right = send_patch(live, upload, data, patch_headers(alice, 0, **{"Upload-Checksum": checksum(data)}))
    assert right.status == 204
    assert stored(settled(upload)) == data


def test_it_takes_the_same_access_rules_as_the_api(alice: Person, bob: Person, charlie: Person, live: Live) -> None:
    upload = create(alice, 10)
    assert send_patch(live, upload, b"x", patch_headers(charlie, 0)).status == 404
    anonymous = send_patch(live, upload, b"x", patch_headers(None, 0))
    assert anonymous.status == 401
    assert anonymous.headers["www-authenticate"] == 'Bearer realm="modelport"'
    forged = send_patch(live, upload, b"x", patch_headers(None, 0, Authorization="Bearer mp_forged"))
    assert forged.status == 401
    assert "invalid, expired or revoked" in forged.body.decode()
    assert settled(upload).offset == 0
    assert send_patch(live, upload, b"x", patch_headers(bob, 0)).status == 204  # same team


def test_a_browser_session_needs_its_csrf_token(alice: Person, live: Live) -> None:
    from django.middleware.csrf import _get_new_csrf_string
    from django.test import Client

    upload = create(alice, 10)
    browser = Client()
    browser.force_login(alice.user)
    session = browser.cookies[settings.SESSION_COOKIE_NAME].value
    csrf = _get_new_csrf_string()
    cookies = f"{settings.SESSION_COOKIE_NAME}={session}; {settings.CSRF_COOKIE_NAME}={csrf}"
    refused = send_patch(live, upload, b"x" * 5, patch_headers(None, 0, Cookie=cookies))
    assert refused.status == 403
    assert "CSRF" in refused.body.decode()
    accepted = send_patch(live, upload, b"x" * 5, patch_headers(None, 0, Cookie=cookies, **{"X-CSRFToken": csrf}))
    assert accepted.status == 204, accepted.body
    assert settled(upload).offset == 5


@pytest.mark.parametrize(("headers", "status", "message"), [
    ({"Upload-Offset": "²"}, 400, "Upload-Offset must be a non-negative integer"),
    ({"Upload-Offset": "-1"}, 400, "Upload-Offset must be a non-negative integer"),
    ({"Upload-Offset": "9" * 5000}, 400, "at most 19 digits"),
    ({"Upload-Offset": "5"}, 409, "resume from 0"),
    ({"Content-Type": "application/json"}, 415, "application/offset+octet-stream"),
    ({"Tus-Resumable": "0.2.2"}, 412, "only tus 1.0.0 is supported"),
    ({"Upload-Checksum": "sha256 é"}, 400, "not valid base64"),
    ({"Upload-Checksum": "md5 AAAA"}, 400, "use sha256"),
])
def test_hostile_headers_get_a_clear_4xx(alice: Person, live: Live, headers: dict[str, str], status: int,
                                         message: str) -> None:
    upload = create(alice, 10)
    answer = send_patch(live, upload, b"x", patch_headers(alice, 0, **headers))
    assert answer.status == status, answer.body
    assert message in answer.body.decode("utf-8")
    assert settled(upload).offset == 0


def test_an_unknown_or_malformed_upload_id_is_404(alice: Person, live: Live) -> None:
    for path in ("/api/v1/uploads/not-a-uuid", "/api/v1/uploads/00000000-0000-0000-0000-000000000000/"):
        with live.connect() as sock:
            sock.sendall(request_head("PATCH", path, {"Content-Length": "1", **patch_headers(alice, 0)}) + b"x")
            assert read_answer(sock).status == 404


def test_two_patches_at_once_cannot_interleave(alice: Person, live: Live) -> None:
    upload = create(alice, 2000)
    first = live.connect()
    try:
        first.sendall(request_head("PATCH", f"/api/v1/uploads/{upload.pk}",
                                   {"Content-Length": "1000", **patch_headers(alice, 0)}) + b"a" * 500)
        deadline = time.monotonic() + 5
        while Upload.objects.get(pk=upload.pk).busy_until is None and time.monotonic() < deadline:
            time.sleep(0.02)
        second = send_patch(live, upload, b"b" * 1000, patch_headers(alice, 0))
        assert second.status == 409
        assert "Another request is writing to this upload" in second.body.decode()
        first.sendall(b"a" * 500)
        assert read_answer(first).status == 204
    finally:
        first.close()
    assert stored(settled(upload)) == b"a" * 1000


def test_the_stock_tuspy_client_uploads_and_resumes_through_the_thin_path(alice: Person, live: Live,
                                                                         tmp_path: Path) -> None:
    from tusclient import client as tus_client

    data = bytes(range(256)) * 1000
    source = tmp_path / "model.onnx"
    source.write_bytes(data)
    tus = tus_client.TusClient(f"http://{live.host}:{live.port}/api/v1/uploads/",
                               headers={"Authorization": f"Bearer {alice.token}"})
    uploader = tus.uploader(str(source), chunk_size=100_000, metadata={"filename": "model.onnx"})
    uploader.upload_chunk()
    assert Upload.objects.get().offset == 100_000
    resumed = tus.uploader(str(source), chunk_size=100_000, url=uploader.url)
    assert resumed.offset == 100_000
    resumed.upload()
    assert stored(settled(Upload.objects.get())) == data


def test_the_event_loop_keeps_serving_while_a_large_patch_streams(alice: Person, live: Live) -> None:
    """Storage writes run in threads: a request to the gateway on the same loop is answered during the upload."""
    size = 48 * 1024 * 1024
    upload = create(alice, size)
    done = threading.Event()

    def upload_all() -> None:
        with live.connect(timeout=60) as sock:
            sock.sendall(request_head("PATCH", f"/api/v1/uploads/{upload.pk}",
                                      {"Content-Length": str(size), **patch_headers(alice, 0)}))
            block = bytes(1024 * 1024)
            for _ in range(size // len(block)):
                sock.sendall(block)
            assert read_answer(sock).status == 204
        done.set()

    sender = threading.Thread(target=upload_all)
    sender.start()
    answered = 0
    try:
        while not done.is_set():
            with live.connect() as sock:
                sock.sendall(request_head("GET", "/serve/nothing/v2/health/ready", {}))
                assert read_answer(sock).status == 401  # answered by the gateway, on the same event loop
            answered += 1
    finally:
        sender.join(timeout=120)
    assert done.is_set()
    assert answered >= 3
    assert settled(upload).offset == size


def test_a_short_request_does_not_wait_for_a_silent_client_forever(alice: Person, live: Live, settings: Any) -> None:
    """Headers sent, not one byte of the body: the timeout applies from the start."""
    settings.UPLOAD_IDLE_TIMEOUT_SECONDS = 1
    upload = create(alice, 10)
    with live.connect() as sock:
        sock.sendall(request_head("PATCH", f"/api/v1/uploads/{upload.pk}", {"Content-Length": "10",
                                                                            **patch_headers(alice, 0)}))
        sock.settimeout(5)
        try:
            answer = read_answer(sock)
        except TimeoutError:
            pytest.fail("no answer within 5 s")
    assert answer.status == 408
    assert settled(upload).offset == 0


def test_a_storage_failure_mid_body_is_a_503_that_keeps_the_upload_as_it_was(alice: Person, live: Live,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from models_registry import storage

    data = bytes(3 * 1024 * 1024)
    upload = create(alice, len(data))
    original = storage._FileAppender.write

    def disk_full_after_a_megabyte(self: Any, chunk: Any) -> None:
        if self.written >= 1024 * 1024:
            raise OSError(28, "No space left on device")
        original(self, chunk)

    monkeypatch.setattr(storage._FileAppender, "write", disk_full_after_a_megabyte)
    answer = send_patch(live, upload, data, patch_headers(alice, 0))
    assert answer.status == 503
    assert answer.headers["retry-after"] == "5"
    assert "could not be stored; nothing of it was kept" in answer.body.decode()
    upload = settled(upload)
    assert upload.offset == 0
    monkeypatch.setattr(storage._FileAppender, "write", original)
    assert send_patch(live, upload, data, patch_headers(alice, 0)).status == 204  # the retry works


def test_the_claim_is_a_lease_renewed_while_bytes_flow_and_a_lost_one_keeps_nothing(
        alice: Person, live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from models_registry import tus_asgi

    monkeypatch.setattr(tus_asgi, "RENEW_EVERY_SECONDS", 0.0)  # renew on every message
    upload = create(alice, 2000)
    with live.connect() as sock:
        sock.sendall(request_head("PATCH", f"/api/v1/uploads/{upload.pk}",
                                  {"Content-Length": "2000", **patch_headers(alice, 0)}) + b"a" * 1000)
        deadline = time.monotonic() + 5
        while Upload.objects.get(pk=upload.pk).busy_until is None and time.monotonic() < deadline:
            time.sleep(0.02)
        claimed = Upload.objects.get(pk=upload.pk).busy_until
        assert claimed is not None and claimed > timezone.now() + timedelta(seconds=60)  # a lease, not an hour
        # The lease expired while the process was stuck, say, and another request claimed the upload:
        Upload.objects.filter(pk=upload.pk).update(busy_until=timezone.now() + timedelta(minutes=5))
        sock.sendall(b"a" * 1000)
        answer = read_answer(sock)
    assert answer.status == 409
    assert "Another request took over this upload" in answer.body.decode()
    upload.refresh_from_db()
    assert upload.offset == 0


def test_a_host_the_portal_does_not_serve_is_refused_as_django_does(alice: Person, live: Live) -> None:
    upload = create(alice, 10)
    with live.connect() as sock:
        head = request_head("PATCH", f"/api/v1/uploads/{upload.pk}", {"Content-Length": "1", **patch_headers(alice, 0)})
        sock.sendall(head.replace(b"Host: 127.0.0.1", b"Host: evil.example") + b"x")
        answer = read_answer(sock)
    assert answer.status == 400
    assert "no host this portal serves" in answer.body.decode()
    assert settled(upload).offset == 0
