"""Resumable uploads (tus 1.0): the actions behind the protocol views."""

from __future__ import annotations

import base64
import hashlib
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Sum
from django.utils import timezone

from accounts.models import Team
from models_registry import quota
from models_registry.models import Upload
from models_registry.storage import Readable, best_effort, get_store

# A PATCH holds its claim at most this long; a client that died mid-request frees the upload after it.
CLAIM_DURATION = timedelta(hours=1)
# Header values are ASCII digits only: str.isdigit() is also true for "²" and "٣", which int() then refuses or
# reads, and int() of a 5,000-digit value raises. 19 digits hold any size a signed 64-bit column can.
_MAX_DIGITS = 19


class UploadProblem(Exception):
    """A request the client must change; carries the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_uint(name: str, raw: str | None) -> int | None:
    """A header holding a non-negative integer (Upload-Length, Upload-Offset, Content-Length), or None if absent."""
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > _MAX_DIGITS:
        shown = raw if len(raw) <= 40 else raw[:40] + "…"
        raise UploadProblem(400,
                            f"{name} must be a non-negative integer of at most {_MAX_DIGITS} digits, got {shown!r}")
    return int(raw)


# Upload-Metadata is stored with the upload and sent back on every HEAD; clients send a file name and type.
MAX_METADATA_CHARS = 16 * 1024


def parse_metadata(header: str | None) -> dict[str, str]:
    """Upload-Metadata: comma-separated `key base64value` pairs (the value may be absent)."""
    result: dict[str, str] = {}
    if not header:
        return result
    if len(header) > MAX_METADATA_CHARS:
        raise UploadProblem(400,
                            f"Upload-Metadata is {len(header)} characters; at most {MAX_METADATA_CHARS} are accepted.")
    for pair in header.split(","):
        pair = pair.strip()
        if not pair:
            continue
        key, _, encoded = pair.partition(" ")
        try:
            value = base64.b64decode(encoded.strip(), validate=True).decode("utf-8") if encoded.strip() else ""
        except ValueError:  # binascii.Error, UnicodeDecodeError, and b64decode's "only ASCII characters"
            raise UploadProblem(400, f"Upload-Metadata value for {key!r} is not valid base64 of UTF-8 text") from None
        result[key] = value
    return result


def encode_metadata(metadata: dict[str, str]) -> str:
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" if v else k for k, v in metadata.items())


def expiry(upload: Upload, now: datetime, *, completed: bool) -> datetime:
    """When `upload` expires, seen at `now`: a finished one UPLOAD_EXPIRY_HOURS after it was created (time to make
    it a version); an unfinished one UPLOAD_STALL_EXPIRY_SECONDS after bytes last arrived, and never later than
    that. A reservation that sends nothing so holds its team's quota for minutes, not a day."""
    deadline = upload.created_at + timedelta(hours=settings.UPLOAD_EXPIRY_HOURS)
    if completed:
        return deadline
    return min(deadline, now + timedelta(seconds=settings.UPLOAD_STALL_EXPIRY_SECONDS))


def stall_text() -> str:
    """UPLOAD_STALL_EXPIRY_SECONDS as a message says it: "10 minutes", "90 s"."""
    seconds = settings.UPLOAD_STALL_EXPIRY_SECONDS
    return f"{seconds // 60} minutes" if seconds % 60 == 0 and seconds >= 120 else f"{seconds} s"


def check_open_uploads(team: Team, length: int) -> None:
    """UploadProblem unless the team may open one more unfinished upload of `length` bytes: at most
    UPLOAD_MAX_OPEN_PER_TEAM of them, with at most UPLOAD_MAX_OPEN_BYTES_PER_TEAM still to come. Under the team's
    lock, as the quota's check."""
    open_uploads = quota.live_uploads(team).filter(completed_at__isnull=True)
    count = open_uploads.count()
    free_them = (f"Finish them, or end the ones you no longer need (DELETE /api/v1/uploads/<id>); one that receives "
                 f"no bytes for {stall_text()} expires by itself.")
    if count >= settings.UPLOAD_MAX_OPEN_PER_TEAM:
        raise UploadProblem(429, f"Team {team.name!r} has {count} unfinished uploads, the most it may have open at "
                                 f"once (UPLOAD_MAX_OPEN_PER_TEAM = {settings.UPLOAD_MAX_OPEN_PER_TEAM}). {free_them}")
    pending = int(open_uploads.aggregate(total=Sum(F("length") - F("offset")))["total"] or 0)
    cap = settings.UPLOAD_MAX_OPEN_BYTES_PER_TEAM
    if pending + length > cap:
        raise UploadProblem(413, f"The upload is {quota.size_text(length)}, but the unfinished uploads of team "
                                 f"{team.name!r} have {quota.size_text(pending)} still to come, and may have at most "
                                 f"{quota.size_text(cap)} together (UPLOAD_MAX_OPEN_BYTES_PER_TEAM). {free_them}")


def create_upload(team: Team, user: Any, length: int, metadata: dict[str, str]) -> Upload:
    if length < 0:
        raise UploadProblem(400, "Upload-Length must be a non-negative integer")
    if length > settings.MAX_UPLOAD_SIZE:
        raise UploadProblem(413, f"The upload is {length} bytes; the limit is {settings.MAX_UPLOAD_SIZE} bytes.")
    now = timezone.now()
    upload = Upload(team=team, created_by=user, length=length, metadata=metadata, created_at=now)
    upload.expires_at = expiry(upload, now, completed=length == 0)
    with transaction.atomic():
        # The declared length is reserved by the row itself: checked and inserted under the team's lock, so that
        # two creations of one team at once cannot both pass the quota or the caps on open uploads.
        quota.lock_team(team)
        if length > 0:
            check_open_uploads(team, length)
        try:
            quota.check_room(team, length)
        except quota.NoRoom as exc:
            raise UploadProblem(413, str(exc)) from None
        upload.storage_state = get_store().begin_upload(upload.key)
        if length == 0:
            upload.completed_at = now
        upload.save()
    if length == 0:
        get_store().finish_upload(upload.key, upload.storage_state)
    return upload


def expired_message(upload: Upload) -> str:
    """Why an unfinished upload past its expiry is gone, for the 410 its client gets."""
    if upload.expires_at < upload.created_at + timedelta(hours=settings.UPLOAD_EXPIRY_HOURS):
        why = (f"it received no bytes for {stall_text()} (UPLOAD_STALL_EXPIRY_SECONDS), so its reservation was "
               "given back")
    else:
        why = f"it was not finished within {settings.UPLOAD_EXPIRY_HOURS} hours (UPLOAD_EXPIRY_HOURS)"
    return f"This upload expired: {why}. Start a new upload."


def parse_checksum(header: str | None) -> bytes | None:
    """Upload-Checksum: `sha256 <base64 digest>`. Only sha256 is offered."""
    if not header:
        return None
    algorithm, _, encoded = header.strip().partition(" ")
    if algorithm.lower() != "sha256":
        raise UploadProblem(400, f"Upload-Checksum algorithm {algorithm!r} is not supported: use sha256")
    try:
        digest = base64.b64decode(encoded.strip(), validate=True)
    except ValueError:  # binascii.Error, and b64decode's "only ASCII characters" for "sha256 é"
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


def check_chunk(upload: Upload, offset: int, content_length: int | None) -> int:
    """The most bytes this PATCH may bring (what remains of the upload), or UploadProblem."""
    if upload.completed_at is not None:
        raise UploadProblem(409, "This upload is already complete.")
    if offset != upload.offset:
        raise UploadProblem(409,
                            f"Upload-Offset is {offset} but the server has {upload.offset} bytes: resume from "
                            f"{upload.offset}.")
    remaining = upload.length - upload.offset
    if content_length is not None and content_length > remaining:
        raise UploadProblem(413,
                            f"The chunk is {content_length} bytes but only {remaining} bytes remain in this upload.")
    return remaining


def claim(upload: Upload, offset: int, duration: timedelta = CLAIM_DURATION) -> datetime:
    """Claim the upload for one PATCH; the returned time is the claim's token (see renew_claim and commit_chunk)."""
    now = timezone.now()
    until = now + duration
    # Not an expired one: the sweep may be removing it (it deletes only what no request holds).
    claimed = (
        Upload.objects.filter(pk=upload.pk, offset=offset, completed_at__isnull=True, expires_at__gte=now)
        .filter(Q(busy_until__isnull=True) | Q(busy_until__lt=now))
        .update(busy_until=until)
    )
    if claimed != 1:
        raise UploadProblem(409,
                            "Another request is writing to this upload, or its offset changed: send HEAD and resume.")
    return until


def renew_claim(upload: Upload, token: datetime, duration: timedelta) -> datetime | None:
    """Extend a claim that is still ours; None when it is not (it expired and another request took it)."""
    now = timezone.now()
    until = now + duration
    # Bytes are arriving: the upload is not stalled, though none of them is committed before the request ends.
    renewed = (Upload.objects.filter(pk=upload.pk, busy_until=token)
               .update(busy_until=until, expires_at=expiry(upload, now, completed=False)))
    return until if renewed == 1 else None


def release(upload: Upload, token: datetime | None = None) -> None:
    uploads = Upload.objects.filter(pk=upload.pk)
    (uploads.filter(busy_until=token) if token is not None else uploads).update(busy_until=None)


def commit_chunk(upload: Upload, offset: int, written: int, old_state: dict[str, Any], new_state: dict[str, Any],
                 token: datetime | None = None) -> Upload:
    """Record `written` more bytes at `offset` (finishing the stored object when the upload is complete) and release
    the claim. A claim lost meanwhile (the request outlived it) discards the bytes: UploadProblem 409."""
    store = get_store()
    new_offset = offset + written
    completed = new_offset == upload.length
    if completed:
        try:
            store.finish_upload(upload.key, new_state)
        except BaseException:
            # E.g. S3 failing CompleteMultipartUpload: the client sends the last chunk again, now, not after the claim.
            store.rollback(upload.key, old_state, new_state)
            release(upload, token)
            raise
    rows = Upload.objects.filter(pk=upload.pk, offset=offset)
    if token is not None:
        rows = rows.filter(busy_until=token)
    now = timezone.now()
    updated = rows.update(offset=new_offset, storage_state=new_state, busy_until=None,
                          completed_at=now if completed else None, expires_at=expiry(upload, now, completed=completed))
    if updated != 1:
        store.rollback(upload.key, old_state, new_state)
        raise UploadProblem(409, "This request took longer than its claim on the upload; send HEAD and resume.")
    store.commit(upload.key, old_state, new_state)
    upload.refresh_from_db()
    return upload


def discard_chunk(upload: Upload, old_state: dict[str, Any], new_state: dict[str, Any] | None,
                  token: datetime | None = None) -> None:
    """Forget what a PATCH wrote (a checksum mismatch, a body too long): the upload stays where it was."""
    if new_state is not None:
        get_store().rollback(upload.key, old_state, new_state)
    release(upload, token)


def append_chunk(upload: Upload, offset: int, stream: Readable, content_length: int | None,
                 checksum: bytes | None) -> Upload:
    """Write the body at `offset`. The offset is committed only for bytes that fully arrived (and match the
    checksum), so an interrupted request leaves a resumable upload, never a corrupt one."""
    remaining = check_chunk(upload, offset, content_length)
    claim(upload, offset)
    store = get_store()
    old_state = upload.storage_state
    # Hash only when the client sent a checksum: sha256 is a third of the server's CPU time on a large PATCH.
    hasher = _HashingReader(stream) if checksum is not None else None
    limit = remaining if content_length is None else content_length
    try:
        written, new_state = store.append(upload.key, old_state, offset, hasher or stream, limit)
    except BaseException:
        release(upload)
        raise
    if content_length is None and written == remaining and stream.read(1):
        # A body of unknown length (chunked) that goes on past the upload's end: refused whole, never cut.
        discard_chunk(upload, old_state, new_state)
        raise UploadProblem(413, f"The body is longer than the {remaining} bytes that remain in this upload; nothing "
                                 "of it was kept.")
    if hasher is not None and hasher.digest.digest() != checksum:
        discard_chunk(upload, old_state, new_state)
        raise UploadProblem(460,
                            "Checksum mismatch: the chunk's sha256 differs from Upload-Checksum; it was discarded.")
    return commit_chunk(upload, offset, written, old_state, new_state)


def terminate(upload: Upload) -> None:
    get_store().abort_upload(upload.key, upload.storage_state)
    upload.delete()


def abort_stale_multipart_uploads(now: datetime | None = None) -> int:
    """S3 multipart uploads that no live upload holds and that began before any upload could still be running (its
    expiry, and an hour's margin) are aborted; the count. Nothing to do on the filesystem."""
    now = now or timezone.now()
    started_before = now - timedelta(hours=settings.UPLOAD_EXPIRY_HOURS + 1)
    keep = {str(state["upload_id"]) for state in Upload.objects.values_list("storage_state", flat=True)
            if isinstance(state, dict) and state.get("upload_id")}
    return len(get_store().abort_stale_multipart_uploads(started_before, keep))


def delete_expired_uploads(now: Any = None) -> int:
    """Uploads past their expiry (unfinished ones that stalled or outlived UPLOAD_EXPIRY_HOURS, finished ones never
    turned into a version) are removed; the count. Not one a request holds: its bytes are arriving (the claim's
    renewal moves its expiry on), and the row goes first, so that no request can claim what is being removed."""
    now = now or timezone.now()
    count = 0
    idle = Q(busy_until__isnull=True) | Q(busy_until__lt=now)
    for upload in Upload.objects.filter(idle, expires_at__lt=now):
        deleted, _ = Upload.objects.filter(idle, pk=upload.pk, expires_at__lt=now).delete()
        if not deleted:
            continue
        with best_effort(f"abort expired upload {upload.pk} at", upload.key):
            get_store().abort_upload(upload.key, upload.storage_state)
        count += 1
    return count
