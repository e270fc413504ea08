"""A tus 1.0 client (core protocol, creation and checksum extensions), written here so that the CLI needs nothing
but `requests`.

The file is sent in chunks read one at a time (never the whole file in memory), each with its sha256 in
Upload-Checksum. After a network error, a 5xx or a 409 the client asks the server (HEAD) how many bytes it kept
and goes on from there; after a 460 it sends the chunk again. The upload URL is remembered per file in a small
state file, so that running the same command again after a crash resumes the upload instead of starting over.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import requests

from modelport_cli.client import Client, NetworkError, api_error
from modelport_cli.errors import CliError

TUS_VERSION = "1.0.0"
CHUNK_SIZE = 8 * 1024 * 1024
# Delays before each new attempt after a failure; the upload gives up after this many failures in a row without
# a chunk getting through (about 30 s in all: a portal restart fits in it).
RETRY_DELAYS: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
# A remembered upload URL outlives the server's own expiry (UPLOAD_EXPIRY_HOURS) at most by this much.
STATE_MAX_AGE_SECONDS = 7 * 24 * 3600

Progress = Callable[[int], None]
Notify = Callable[[str], None]


@dataclass(frozen=True)
class UploadResult:
    url: str
    state_key: str
    resumed_from: int  # bytes the server already had when this run started

    @property
    def upload_id(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]


class UploadGone(CliError):
    """The server no longer knows the upload (expired or removed)."""


def default_state_dir() -> Path:
    if os.environ.get("MODELPORT_CACHE_DIR"):
        return Path(os.environ["MODELPORT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "modelport"


class UploadState:
    """{file key: upload URL} in <dir>/uploads.json. Best effort: a read-only home directory only costs resuming."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "uploads.json"

    @staticmethod
    def key_for(base_url: str, path: Path) -> str:
        # The size and mtime make an edited file a new upload: resuming would glue old and new bytes together.
        stat = path.stat()
        raw = f"{base_url}|{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
        return hashlib.sha256(raw.encode()).hexdigest()

    def get(self, key: str) -> str | None:
        entry = self._read().get(key)
        return str(entry["url"]) if isinstance(entry, dict) and entry.get("url") else None

    def put(self, key: str, url: str, path: Path) -> None:
        entries = self._read()
        entries[key] = {"url": url, "file": str(path.resolve()), "saved": time.time()}
        self._write(entries)

    def forget(self, key: str) -> None:
        entries = self._read()
        if entries.pop(key, None) is not None:
            self._write(entries)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, entries: dict[str, Any]) -> None:
        now = time.time()
        fresh = {k: v for k, v in entries.items()
                 if isinstance(v, dict) and now - float(v.get("saved", 0)) < STATE_MAX_AGE_SECONDS}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Write and rename, so that a crash or a parallel job never leaves half a file.
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(fresh, indent=1))
            os.replace(tmp, self.path)
        except OSError:
            pass


def upload_file(client: Client, path: Path, *, create_path: str = "/api/v1/uploads/", chunk_size: int | None = None,
                state: UploadState | None = None, progress: Progress | None = None,
                notify: Notify | None = None) -> UploadResult:
    """Upload `path` (or finish its remembered upload) and return the upload's URL. `progress` gets the bytes the
    server has; `notify` a line about each failed attempt, so that a CI log shows why an upload was slow."""
    chunk_size = chunk_size or CHUNK_SIZE
    size = path.stat().st_size
    key = UploadState.key_for(client.base_url, path)
    url = state.get(key) if state else None
    offset: int | None = None
    if url is not None:
        try:
            offset = _server_offset(client, url, expected_length=size)
        except UploadGone:
            offset = None
        if offset is None:
            if state:
                state.forget(key)
            url = None
    if url is None:
        url = _create(client, create_path, path.name, size)
        offset = 0
        if state:
            state.put(key, url, path)
    assert offset is not None
    resumed_from = offset
    try:
        _send(client, url, path, offset, size, chunk_size, progress, notify)
    except UploadGone:
        if state:
            state.forget(key)
        raise
    return UploadResult(url=url, state_key=key, resumed_from=resumed_from)


def _tus_headers(**extra: str) -> dict[str, str]:
    return {"Tus-Resumable": TUS_VERSION, **extra}


def _create(client: Client, create_path: str, filename: str, size: int) -> str:
    metadata = "filename " + base64.b64encode(filename.encode()).decode()
    headers = _tus_headers(**{"Upload-Length": str(size), "Upload-Metadata": metadata})
    # Not retried: a repeated POST would only leave an empty upload behind, and the caller reports the error.
    response = client.send("POST", create_path, headers=headers)
    if response.status_code != 201:
        raise api_error(response)
    location = response.headers.get("Location")
    if not location:
        raise CliError("the portal created the upload but sent no Location header")
    return urljoin(client.url(create_path), location)


def _server_offset(client: Client, url: str, expected_length: int | None = None) -> int | None:
    """How many bytes the server has (HEAD). None when it is a different file's upload; UploadGone when unknown."""
    response = client.send("HEAD", url, headers=_tus_headers())
    if response.status_code in (404, 410):
        raise UploadGone("the upload expired or was removed on the portal; run the command again to start over")
    if response.status_code >= 500:
        raise _Retryable(f"HEAD {url} answered {response.status_code} ({api_error(response).reason})")
    if response.status_code >= 400:
        raise api_error(response)
    try:
        offset = int(response.headers["Upload-Offset"])
    except (KeyError, ValueError):
        raise CliError(f"the portal's answer to HEAD {url} has no valid Upload-Offset") from None
    length = response.headers.get("Upload-Length")
    if expected_length is not None and length is not None and length != str(expected_length):
        return None
    return offset


class _Retryable(CliError):
    """A 5xx: worth another attempt within an upload; the command's error when it happens at its start."""


def _send(client: Client, url: str, path: Path, offset: int, size: int, chunk_size: int,
          progress: Progress | None, notify: Notify | None) -> None:
    report = progress or (lambda done: None)
    report(offset)
    failures = 0
    offset_known = True
    with path.open("rb") as file:
        while True:
            try:
                if not offset_known:
                    server_offset = _server_offset(client, url)
                    assert server_offset is not None
                    offset = server_offset
                    offset_known = True
                    report(offset)
                if offset >= size:
                    return
                file.seek(offset)
                chunk = file.read(min(chunk_size, size - offset))
                if not chunk:
                    raise CliError(f"{path} became shorter while it was being uploaded")
                response = client.send("PATCH", url, headers=_chunk_headers(offset, chunk),
                                       data=_ChunkBody(chunk, offset, report))
                if response.status_code in (200, 204):
                    offset = _offset_after(response, offset + len(chunk))
                    report(offset)
                    failures = 0
                    continue
                if response.status_code in (404, 410):
                    raise UploadGone("the upload expired or was removed on the portal; "
                                     "run the command again to start over")
                if response.status_code == 460:
                    # The server discarded the chunk; its offset did not move, so send the same bytes again.
                    problem = "the chunk arrived corrupted (checksum mismatch)"
                    report(offset)
                elif response.status_code == 409 or response.status_code >= 500:
                    problem = f"PATCH answered {response.status_code} ({api_error(response).reason})"
                    offset_known = False
                else:
                    raise api_error(response)
            except (NetworkError, _Retryable) as exc:
                problem = str(exc)
                offset_known = False
            failures += 1
            if failures > len(RETRY_DELAYS):
                raise CliError(f"upload of {path.name} failed after {failures} attempts in a row: {problem}")
            delay = RETRY_DELAYS[failures - 1]
            if notify:
                notify(f"{problem}; trying again in {delay:g} s ({failures} of {len(RETRY_DELAYS)})")
            time.sleep(delay)


def _chunk_headers(offset: int, chunk: bytes) -> dict[str, str]:
    digest = base64.b64encode(hashlib.sha256(chunk).digest()).decode()
    return _tus_headers(**{
        "Content-Type": "application/offset+octet-stream",
        "Upload-Offset": str(offset),
        "Upload-Checksum": f"sha256 {digest}",
    })


def _offset_after(response: requests.Response, fallback: int) -> int:
    try:
        return int(response.headers["Upload-Offset"])
    except (KeyError, ValueError):
        return fallback


class _ChunkBody:
    """A chunk as a file-like body with a length: requests sends it with Content-Length (not chunked encoding),
    reading it in small blocks, so that the progress bar moves while an 8 MiB chunk is on its way."""

    def __init__(self, data: bytes, offset: int, report: Progress) -> None:
        self.data = memoryview(data)
        self.position = 0
        self.offset = offset
        self.report = report

    def __len__(self) -> int:
        return len(self.data)

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size is None or size < 0 else min(self.position + size, len(self.data))
        block = self.data[self.position:end].tobytes()
        self.position = end
        self.report(self.offset + self.position)
        return block
