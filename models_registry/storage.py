"""Artifact storage: the local filesystem under var/ by default, S3 (through boto3) when S3_BUCKET is set.

Keys are relative paths such as `uploads/<id>` or `blobs/sha256/ab/<sha>`; a store never writes outside its root
(filesystem) or prefix (S3). Resumable uploads append to a partial object: a file on disk, an S3 multipart upload.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Collection, Iterator
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import IO, Any, Protocol

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024
# S3 parts must be at least 5 MiB except the last; we send 8 MiB parts.
S3_PART_SIZE = 8 * 1024 * 1024


class StorageError(Exception):
    pass


@contextlib.contextmanager
def best_effort(action: str, key: str) -> Iterator[None]:
    """Clean-up that must not fail what it follows (an upload's abort, a delete after a move), but that is logged
    with what was left behind where: a swallowed error hid objects nobody would ever remove."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - any storage error: logged, the caller carries on
        log.warning("storage: could not %s %s (%s: %s); it is left behind", action, key, type(exc).__name__, exc)


class Readable(Protocol):
    """What an upload's bytes are read from: a file, a request body (HttpRequest.read), a wrapper that hashes."""

    def read(self, size: int = -1, /) -> bytes: ...


class Appender(Protocol):
    """Bytes appended to a partial upload, pushed in pieces (the tus PATCH path receives them from the network).
    Blocking: call from a worker thread. `close` returns the bytes written and the upload's new storage state;
    `abort` drops the attempt (the upload stays at its old state)."""

    def write(self, data: bytes | bytearray) -> None: ...
    def close(self) -> tuple[int, dict[str, Any]]: ...
    def abort(self) -> None: ...


class ArtifactStore(Protocol):
    def begin_upload(self, key: str) -> dict[str, Any]: ...
    def open_append(self, key: str, state: dict[str, Any], offset: int) -> Appender: ...
    def append(self, key: str, state: dict[str, Any], offset: int, stream: Readable,
               limit: int) -> tuple[int, dict[str, Any]]: ...
    def commit(self, key: str, old: dict[str, Any], new: dict[str, Any]) -> None: ...
    def rollback(self, key: str, old: dict[str, Any], new: dict[str, Any]) -> None: ...
    def finish_upload(self, key: str, state: dict[str, Any]) -> None: ...
    def abort_upload(self, key: str, state: dict[str, Any]) -> None: ...
    def save(self, key: str, stream: IO[bytes]) -> int: ...
    def open(self, key: str) -> IO[bytes]: ...
    def exists(self, key: str) -> bool: ...
    def size(self, key: str) -> int: ...
    def move(self, src: str, dst: str) -> None: ...
    def delete(self, key: str) -> None: ...
    def local_copy(self, key: str) -> contextlib.AbstractContextManager[Path]: ...
    def abort_stale_multipart_uploads(self, started_before: datetime, keep: Collection[str]) -> list[str]: ...


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StorageError(f"invalid storage key {key!r}")
    return key


def sha256_of(stream: IO[bytes]) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def copy_limited(stream: Readable, out: IO[bytes], limit: int) -> int:
    """Copy at most `limit` bytes, chunk by chunk (never the whole body in memory)."""
    written = 0
    while written < limit:
        chunk = stream.read(min(CHUNK, limit - written))
        if not chunk:
            break
        out.write(chunk)
        written += len(chunk)
    return written


def append_stream(appender: Appender, stream: Readable, limit: int) -> tuple[int, dict[str, Any]]:
    """Pull at most `limit` bytes from `stream` into `appender`, chunk by chunk."""
    try:
        received = 0
        while received < limit:
            chunk = stream.read(min(CHUNK, limit - received))
            if not chunk:
                break
            appender.write(chunk)
            received += len(chunk)
    except BaseException:
        appender.abort()
        raise
    return appender.close()


class _FileAppender:
    def __init__(self, path: Path, state: dict[str, Any], offset: int) -> None:
        self.state = state
        self.offset = offset
        self.written = 0
        self.out = open(path, "r+b")  # noqa: SIM115 - closed by close() or abort()
        # Whatever a broken earlier request wrote past the committed offset is overwritten.
        self.out.seek(offset)

    def write(self, data: bytes | bytearray) -> None:
        self.out.write(data)
        self.written += len(data)

    def close(self) -> tuple[int, dict[str, Any]]:
        with self.out:
            self.out.truncate(self.offset + self.written)
        return self.written, self.state

    def abort(self) -> None:
        self.out.close()


class FilesystemStore:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def path(self, key: str) -> Path:
        path = (self.root / _check_key(key)).resolve()
        if not path.is_relative_to(self.root):
            raise StorageError(f"invalid storage key {key!r}")
        return path

    def begin_upload(self, key: str) -> dict[str, Any]:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        return {}

    def open_append(self, key: str, state: dict[str, Any], offset: int) -> Appender:
        return _FileAppender(self.path(key), state, offset)

    def append(self, key: str, state: dict[str, Any], offset: int, stream: Readable,
               limit: int) -> tuple[int, dict[str, Any]]:
        return append_stream(self.open_append(key, state, offset), stream, limit)

    def commit(self, key: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        return None

    def rollback(self, key: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        return None  # the next append seeks to the committed offset and truncates

    def finish_upload(self, key: str, state: dict[str, Any]) -> None:
        return None

    def abort_upload(self, key: str, state: dict[str, Any]) -> None:
        self.delete(key)

    def save(self, key: str, stream: IO[bytes]) -> int:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                size = copy_limited(stream, out, 1 << 62)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return size

    def open(self, key: str) -> IO[bytes]:
        return open(self.path(key), "rb")

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def size(self, key: str) -> int:
        return self.path(key).stat().st_size

    def move(self, src: str, dst: str) -> None:
        target = self.path(dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.path(src), target)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(key).unlink()

    def abort_stale_multipart_uploads(self, started_before: datetime, keep: Collection[str]) -> list[str]:
        return []  # a partial upload is a file under its Upload's key, removed with the row

    @contextlib.contextmanager
    def local_copy(self, key: str) -> Iterator[Path]:
        # Already local: no copy needed.
        yield self.path(key)


class S3Store:
    def __init__(self, bucket: str, prefix: str, client: Any) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client

    def object_key(self, key: str) -> str:
        key = _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def begin_upload(self, key: str) -> dict[str, Any]:
        response = self.client.create_multipart_upload(Bucket=self.bucket, Key=self.object_key(key))
        return {"upload_id": response["UploadId"], "parts": [], "tail": 0}

    def _tail_key(self, key: str, parts: int, tail: int) -> str:
        # Named after the state it belongs to, so that a rejected chunk (checksum mismatch) leaves the previous
        # state's tail untouched and the upload can be rolled back to it.
        return f"{self.object_key(key)}.tail-{parts}-{tail}"

    def open_append(self, key: str, state: dict[str, Any], offset: int) -> Appender:
        """Bytes go out in 8 MiB parts. Bytes that do not fill a part are kept in a small `.tail` object so that the
        next request (or the end of the upload) can send them: S3 refuses parts under 5 MiB."""
        return _S3Appender(self, key, state)

    def append(self, key: str, state: dict[str, Any], offset: int, stream: Readable,
               limit: int) -> tuple[int, dict[str, Any]]:
        return append_stream(self.open_append(key, state, offset), stream, limit)

    def _upload_part(self, key: str, state: dict[str, Any], data: bytes) -> None:
        number = len(state["parts"]) + 1
        response = self.client.upload_part(
            Bucket=self.bucket, Key=self.object_key(key), UploadId=state["upload_id"], PartNumber=number, Body=data
        )
        state["parts"].append({"PartNumber": number, "ETag": response["ETag"]})

    def _save_tail(self, key: str, state: dict[str, Any], data: bytes) -> None:
        if data:
            self.client.put_object(Bucket=self.bucket, Key=self._tail_key(key, len(state["parts"]), len(data)),
                                   Body=data)
        state["tail"] = len(data)

    def commit(self, key: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        """The new state is recorded: drop the previous state's tail object."""
        if old.get("tail") and (len(old["parts"]), old["tail"]) != (len(new["parts"]), new["tail"]):
            tail_key = self._tail_key(key, len(old["parts"]), old["tail"])
            with best_effort("delete the previous tail object", f"s3://{self.bucket}/{tail_key}"):
                self.client.delete_object(Bucket=self.bucket, Key=tail_key)

    def rollback(self, key: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        """The new state is rejected: parts past the old count are overwritten by later uploads of the same numbers."""
        if new.get("tail") and (len(old["parts"]), old.get("tail")) != (len(new["parts"]), new["tail"]):
            tail_key = self._tail_key(key, len(new["parts"]), new["tail"])
            with best_effort("delete a rejected tail object", f"s3://{self.bucket}/{tail_key}"):
                self.client.delete_object(Bucket=self.bucket, Key=tail_key)

    def finish_upload(self, key: str, state: dict[str, Any]) -> None:
        state = {**state, "parts": list(state["parts"])}
        if state["tail"]:
            tail_key = self._tail_key(key, len(state["parts"]), state["tail"])
            data = self.client.get_object(Bucket=self.bucket, Key=tail_key)["Body"].read()
            self._upload_part(key, state, data)
            self.client.delete_object(Bucket=self.bucket, Key=tail_key)
        if not state["parts"]:
            # An empty upload: S3 needs at least one part.
            self._upload_part(key, state, b"")
        self.client.complete_multipart_upload(
            Bucket=self.bucket, Key=self.object_key(key), UploadId=state["upload_id"],
            MultipartUpload={"Parts": state["parts"]},
        )

    def abort_upload(self, key: str, state: dict[str, Any]) -> None:
        object_key = self.object_key(key)
        # Left behind, the upload is aborted later by the periodic clean-up (abort_stale_multipart_uploads).
        with best_effort(f"abort multipart upload {state.get('upload_id')} of", f"s3://{self.bucket}/{object_key}"):
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=object_key, UploadId=state["upload_id"])
        if state.get("tail"):
            tail_key = self._tail_key(key, len(state["parts"]), state["tail"])
            with best_effort("delete the tail object", f"s3://{self.bucket}/{tail_key}"):
                self.client.delete_object(Bucket=self.bucket, Key=tail_key)
        self.delete(key)

    def save(self, key: str, stream: IO[bytes]) -> int:
        counter = _CountingReader(stream)
        self.client.upload_fileobj(counter, self.bucket, self.object_key(key))
        return counter.count

    def open(self, key: str) -> IO[bytes]:
        body = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key))["Body"]
        return body  # type: ignore[no-any-return]

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self.object_key(key))
        except self.client.exceptions.ClientError:
            return False
        return True

    def size(self, key: str) -> int:
        return int(self.client.head_object(Bucket=self.bucket, Key=self.object_key(key))["ContentLength"])

    def move(self, src: str, dst: str) -> None:
        self.client.copy({"Bucket": self.bucket, "Key": self.object_key(src)}, self.bucket, self.object_key(dst))
        self.delete(src)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.object_key(key))

    def abort_stale_multipart_uploads(self, started_before: datetime, keep: Collection[str]) -> list[str]:
        """Incomplete multipart uploads under this store's prefix begun before `started_before`, except the upload
        ids in `keep` (those of live uploads): aborted, so that their parts stop costing storage. They are left
        behind when an abort failed, or a process died during an upload (upload_fileobj of a large blob). The object
        keys of those aborted."""
        prefix = f"{self.prefix}/" if self.prefix else ""
        aborted = []
        for page in self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix):
            for upload in page.get("Uploads", []):
                if upload["UploadId"] in keep or upload["Initiated"] >= started_before:
                    continue
                try:
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"],
                                                       UploadId=upload["UploadId"])
                except Exception as exc:  # noqa: BLE001 - the next run tries again
                    log.warning("storage: could not abort stale multipart upload %s of s3://%s/%s (%s: %s)",
                                upload["UploadId"], self.bucket, upload["Key"], type(exc).__name__, exc)
                    continue
                log.info("storage: aborted multipart upload %s of s3://%s/%s, begun %s", upload["UploadId"],
                         self.bucket, upload["Key"], upload["Initiated"].isoformat())
                aborted.append(upload["Key"])
        return aborted

    @contextlib.contextmanager
    def local_copy(self, key: str) -> Iterator[Path]:
        with tempfile.TemporaryDirectory(prefix="modelport-") as tmp:
            path = Path(tmp) / "artifact"
            self.client.download_file(self.bucket, self.object_key(key), str(path))
            yield path


class _S3Appender:
    def __init__(self, store: S3Store, key: str, state: dict[str, Any]) -> None:
        self.store = store
        self.key = key
        self.state = {**state, "parts": list(state["parts"])}
        self.buffer = bytearray()
        if state["tail"]:
            old_tail = store._tail_key(key, len(state["parts"]), state["tail"])
            self.buffer += store.client.get_object(Bucket=store.bucket, Key=old_tail)["Body"].read()
        self.received = 0

    def write(self, data: bytes | bytearray) -> None:
        self.buffer += data
        self.received += len(data)
        while len(self.buffer) >= S3_PART_SIZE:
            self.store._upload_part(self.key, self.state, bytes(self.buffer[:S3_PART_SIZE]))
            del self.buffer[:S3_PART_SIZE]

    def close(self) -> tuple[int, dict[str, Any]]:
        self.store._save_tail(self.key, self.state, bytes(self.buffer))
        self.buffer = bytearray()
        return self.received, self.state

    def abort(self) -> None:
        # Parts uploaded past the old state's count are overwritten by the next request's parts of the same numbers.
        self.buffer = bytearray()


class _CountingReader:
    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.count += len(data)
        return data


def s3_client() -> Any:
    import boto3
    from django.conf import settings

    return boto3.client(
        "s3",
        endpoint_url=settings.S3_ENDPOINT_URL or None,
        region_name=settings.S3_REGION,
        aws_access_key_id=settings.S3_ACCESS_KEY_ID or None,
        aws_secret_access_key=settings.S3_SECRET_ACCESS_KEY or None,
    )


@lru_cache(maxsize=1)
def get_store() -> ArtifactStore:
    from django.conf import settings

    if settings.S3_BUCKET:
        return S3Store(settings.S3_BUCKET, settings.S3_PREFIX, s3_client())
    return FilesystemStore(Path(settings.ARTIFACT_ROOT))
