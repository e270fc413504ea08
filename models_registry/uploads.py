"""Resumable uploads (tus 1.0): the actions behind the protocol views."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from accounts.models import Team
from models_registry.models import Upload
from models_registry.storage import Readable, get_store

# A PATCH holds its claim at most this long; a client that died mid-request frees the upload after it.
CLAIM_DURATION = timedelta(hours=1)


class UploadProblem(Exception):
    """A request the client must change; carries the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_metadata(header: str | None) -> dict[str, str]:
    """Upload-Metadata: comma-separated `key base64value` pairs (the value may be absent)."""
    result: dict[str, str] = {}
    if not header:
        return result
    for pair in header.split(","):
        pair = pair.strip()
        if not pair:
            continue
        key, _, encoded = pair.partition(" ")
        try:
            value = base64.b64decode(encoded.strip(), validate=True).decode("utf-8") if encoded.strip() else ""
        except (binascii.Error, UnicodeDecodeError):
            raise UploadProblem(400, f"Upload-Metadata value for {key!r} is not valid base64 of UTF-8 text") from None
        result[key] = value
    return result


def encode_metadata(metadata: dict[str, str]) -> str:
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" if v else k for k, v in metadata.items())


def create_upload(team: Team, user: Any, length: int, metadata: dict[str, str]) -> Upload:
    if length < 0:
        raise UploadProblem(400, "Upload-Length must be a non-negative integer")
    if length > settings.MAX_UPLOAD_SIZE:
        raise UploadProblem(413, f"The upload is {length} bytes; the limit is {settings.MAX_UPLOAD_SIZE} bytes.")
    upload = Upload(
        team=team,
        created_by=user,
        length=length,
        metadata=metadata,
        expires_at=timezone.now() + timedelta(hours=settings.UPLOAD_EXPIRY_HOURS),
    )
    upload.storage_state = get_store().begin_upload(upload.key)
    if length == 0:
        upload.completed_at = timezone.now()
    upload.save()
    if length == 0:
        get_store().finish_upload(upload.key, upload.storage_state)
    return upload


def parse_checksum(header: str | None) -> bytes | None:
    """Upload-Checksum: `sha256 <base64 digest>`. Only sha256 is offered."""
    if not header:
        return None
    algorithm, _, encoded = header.strip().partition(" ")
    if algorithm.lower() != "sha256":
        raise UploadProblem(400, f"Upload-Checksum algorithm {algorithm!r} is not supported: use sha256")
    try:
        digest = base64.b64decode(encoded.strip(), validate=True)
    except binascii.Error:
        raise UploadProblem(400, "Upload-Checksum digest is not valid base64") from None
    if len(digest) != 32:
        raise UploadProblem(400, "Upload-Checksum digest must be a 32-byte sha256 digest")
    return digest


class _HashingReader:
    def __init__(self, stream: Readable) -> None:
        self.stream = stream
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.digest.update(data)
        return data


def append_chunk(upload: Upload, offset: int, stream: Readable, content_length: int | None,
                 checksum: bytes | None) -> Upload:
    """Write the body at `offset`. The offset is committed only for bytes that fully arrived (and match the
    checksum), so an interrupted request leaves a resumable upload, never a corrupt one."""
    if upload.completed_at is not None:
        raise UploadProblem(409, "This upload is already complete.")
    if offset != upload.offset:
        raise UploadProblem(409, f"Upload-Offset is {offset} but the server has {upload.offset} bytes: resume from {upload.offset}.")
    remaining = upload.length - upload.offset
    if content_length is not None and content_length > remaining:
        raise UploadProblem(413, f"The chunk is {content_length} bytes but only {remaining} bytes remain in this upload.")
    now = timezone.now()
    claimed = (
        Upload.objects.filter(pk=upload.pk, offset=offset, completed_at__isnull=True)
        .filter(Q(busy_until__isnull=True) | Q(busy_until__lt=now))
        .update(busy_until=now + CLAIM_DURATION)
    )
    if claimed != 1:
        raise UploadProblem(409, "Another request is writing to this upload, or its offset changed: send HEAD and resume.")
    store = get_store()
    old_state = upload.storage_state
    # Hash only when the client sent a checksum: sha256 is a third of the server's CPU time on a large PATCH.
    hasher = _HashingReader(stream) if checksum is not None else None
    limit = remaining if content_length is None else content_length
    try:
        written, new_state = store.append(upload.key, old_state, offset, hasher or stream, limit)
    except BaseException:
        Upload.objects.filter(pk=upload.pk).update(busy_until=None)
        raise
    if hasher is not None and hasher.digest.digest() != checksum:
        store.rollback(upload.key, old_state, new_state)
        Upload.objects.filter(pk=upload.pk).update(busy_until=None)
        raise UploadProblem(460, "Checksum mismatch: the chunk's sha256 differs from Upload-Checksum; it was discarded.")
    new_offset = offset + written
    completed = new_offset == upload.length
    if completed:
        try:
            store.finish_upload(upload.key, new_state)
        except BaseException:
            # E.g. S3 failing CompleteMultipartUpload: the client sends the last chunk again, now, not after the claim.
            store.rollback(upload.key, old_state, new_state)
            Upload.objects.filter(pk=upload.pk).update(busy_until=None)
            raise
    Upload.objects.filter(pk=upload.pk).update(
        offset=new_offset, storage_state=new_state, busy_until=None, completed_at=timezone.now() if completed else None
    )
    store.commit(upload.key, old_state, new_state)
    upload.refresh_from_db()
    return upload


def terminate(upload: Upload) -> None:
    get_store().abort_upload(upload.key, upload.storage_state)
    upload.delete()


def delete_expired_uploads(now: Any = None) -> int:
    """Partial uploads past their expiry, and finished ones never turned into a version, are removed."""
    now = now or timezone.now()
    count = 0
    for upload in Upload.objects.filter(expires_at__lt=now):
        with contextlib.suppress(Exception):
            get_store().abort_upload(upload.key, upload.storage_state)
        upload.delete()
        count += 1
    return count
