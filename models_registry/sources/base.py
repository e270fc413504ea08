"""The protocol every source kind's fetcher follows, and the helpers they share to keep what they write safe.

A fetch runs on a worker (never in the web process), into an empty working directory of its own, and produces one
file exactly as an upload would have been: a `.onnx`, a `.pt`, or a `.tar` of a directory tree (a SavedModel, a
python model). That file then goes through the same inspection, archive rules and sandbox as an upload: a fetcher
never opens, unpickles or runs what it fetched, it only moves bytes and reads small metadata (an MLmodel file with
yaml.safe_load, a JSON listing).

Everything a source lists is hostile: remote file names may climb out (`../`, absolute paths), a local artifact
tree may hold symlinks or device files, sizes may be declared small and turn out large. `target_path` and
`pack_tree` are the one front door for names and trees; `FetchContext.progress` is the one for sizes and time.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from modelport.core.archives import ArchiveError, normalize_entry_name
from modelport.core.errors import ArtifactRejected
from modelport.core.signature import Signature


class SourceRefused(ArtifactRejected):
    """A source the team must change (HTTP 400 at the API, the version's error on a worker): malformed, not
    allowed to the team, not found, too large. The message says what to fix."""


class SourceForbidden(SourceRefused):
    """A source the operator has not allowed this team (HTTP 403 at the API); the message names the setting."""


class TransientFetchError(Exception):
    """A fault worth retrying (a connection reset, a 5xx, a timeout of one request): the import task retries it with
    backoff, a bounded number of times, then marks the version invalid with this message."""


class FetchCancelled(Exception):
    """The version was cancelled (or deleted) while its bytes were being fetched: stop and write nothing more."""


@dataclass
class FetchContext:
    """What a fetch may use. `progress(done, total)` must be called as bytes arrive (at least every few MiB) and
    whenever the total becomes known: it records progress on the version, reserves the team's quota for `total`
    (raising SourceRefused when the quota or MAX_UPLOAD_SIZE cannot hold it: refused early, before the bytes), and
    raises FetchCancelled once the version is cancelled. `deadline` is a time.monotonic() value: past it the fetch
    raises SourceRefused (IMPORT_TIME_LIMIT_SECONDS)."""

    team_id: int
    team_name: str
    workdir: Path
    max_bytes: int
    progress: Callable[[int, int | None], None]
    deadline: float

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise SourceRefused("The import took longer than the operator's limit (IMPORT_TIME_LIMIT_SECONDS); "
                                "try a smaller model, or ask an operator to raise it.")


@dataclass(frozen=True)
class Fetched:
    """What a fetch produced: one file inside the working directory, and what the version learns from the source."""

    path: Path
    filename: str  # the name format detection reads, as an upload's file name ("model.onnx", "model.tar")
    declared_format: str = ""  # "" : detected from the bytes, as for an upload
    signature: Signature | None = None  # from the source's metadata (an MLflow signature), where it has one
    max_batch_size: int | None = None
    # Joins the version's `source` JSON: e.g. {"uri": ..., "registry_version": "3", "run_id": ...,
    # "files": {"MLmodel": "<sha256>", ...}}. Never a credential.
    record: dict[str, Any] = field(default_factory=dict)


# A moving reference's lookup at the API is on the request's path: a source slower than this makes the import a
# version of its own rather than a slow answer.
PIN_TIMEOUT_SECONDS = 3.0


class Fetcher(Protocol):
    kind: str

    def validate(self, source: dict[str, Any], team_id: int) -> dict[str, Any]:
        """At the API, before a version exists: the source's fields checked for shape and for what the operator
        allowed this team (SourceRefused / SourceForbidden), returned canonical (what is stored and fetched). Makes
        no network call that the team can make slow."""
        ...

    def identity(self, source: dict[str, Any]) -> str | None:
        """A canonical text of a validated source that names fixed bytes (an MLflow registry version, a commit): two
        imports of one identity into one model are the same import. None for a moving reference (an alias, a branch
        or a tag, an object under a key or a URL that can be replaced), which `pinned` keys by what it names now
        (models_registry/import_identity.py)."""
        ...

    def pinned(self, source: dict[str, Any], team_id: int) -> dict[str, Any] | None:
        """At the API, for a moving reference: the pinned source it names now (an alias's registry version, a
        branch's commit), asked of the source in one short call (PIN_TIMEOUT_SECONDS; TransientFetchError or
        SourceRefused when it does not say). None when there is nothing to ask (an object under a key)."""
        ...

    def pinned_from(self, source: dict[str, Any], record: dict[str, Any]) -> dict[str, Any] | None:
        """On the worker, for a moving reference: the pinned source of what was fetched, from the fetch's record."""
        ...

    def fetch(self, source: dict[str, Any], ctx: FetchContext) -> Fetched:
        """Fetch into ctx.workdir (on a worker). Raises SourceRefused, SourceForbidden, TransientFetchError or
        FetchCancelled; anything else is a bug (the version is marked invalid with a generic message)."""
        ...


def target_path(root: Path, remote_name: str) -> Path:
    """Where a file a source lists as `remote_name` is written under `root`: the archive rules' name check (no
    `..`, no absolute path, no drive letter, no control characters), so that no listing writes outside `root`."""
    try:
        name = normalize_entry_name(remote_name)
    except ArchiveError as exc:
        raise SourceRefused(f"The source lists a file the archive rules refuse: {exc}") from None
    if not name:
        raise SourceRefused(f"The source lists a file with an empty name ({remote_name[:80]!r}).")
    path = root / name
    if not path.resolve().is_relative_to(root.resolve()):
        raise SourceRefused(f"The source lists a file outside its model: {remote_name[:80]!r}.")
    return path


CHUNK = 1024 * 1024


def copy_counted(src: IO[bytes], dst: Path, ctx: FetchContext, done: int, total: int | None) -> tuple[int, str]:
    """Copy a stream into `dst`, reporting progress after every chunk; (bytes written, sha256 hex)."""
    digest = hashlib.sha256()
    dst.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(dst, "xb") as out:
        while chunk := src.read(CHUNK):
            out.write(chunk)
            digest.update(chunk)
            written += len(chunk)
            ctx.progress(done + written, total)
            ctx.check_time()
    return written, digest.hexdigest()


def pack_tree(root: Path, dest: Path, *, max_entries: int, max_total_size: int) -> dict[str, str]:
    """A directory tree (an MLflow artifact folder, a downloaded repository) as a `.tar` at `dest`, with only
    regular files and directories: a symlink (wherever it points), a device, a FIFO or a socket anywhere in it is
    refused, naming it. Nothing is followed (lstat only). Returns each file's sha256 by its path in the tar."""
    hashes: dict[str, str] = {}
    total = 0
    entries = 0
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            here = Path(dirpath)
            for name in sorted(dirnames) + sorted(filenames):
                path = here / name
                relative = path.relative_to(root).as_posix()
                mode = os.lstat(path).st_mode
                entries += 1
                if entries > max_entries:
                    raise SourceRefused(f"The model holds more than {max_entries} files and folders "
                                        "(ARCHIVE_MAX_ENTRIES).")
                if stat.S_ISLNK(mode):
                    raise SourceRefused(f"The model's files hold a symbolic link, {relative!r} -> "
                                        f"{os.readlink(path)[:120]!r}: links are refused (they could point anywhere "
                                        "on the server). Replace it with the file itself.")
                if stat.S_ISDIR(mode):
                    tar.addfile(_info(relative, tarfile.DIRTYPE, 0))
                    continue
                if not stat.S_ISREG(mode):
                    raise SourceRefused(f"The model's files hold {relative!r}, which is not a regular file (a device, "
                                        "a pipe or a socket): only files and folders are accepted.")
                size = os.lstat(path).st_size
                total += size
                if total > max_total_size:
                    raise SourceRefused(f"The model's files come to more than {max_total_size} bytes "
                                        "(ARCHIVE_MAX_TOTAL_SIZE).")
                digest = hashlib.sha256()
                # O_NOFOLLOW: a file swapped for a link between the lstat and the open is refused, not followed.
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as stream:
                    for chunk in iter(lambda s=stream: s.read(CHUNK), b""):  # type: ignore[misc]
                        digest.update(chunk)
                    stream.seek(0)
                    tar.addfile(_info(relative, tarfile.REGTYPE, size), stream)
                hashes[relative] = digest.hexdigest()
    return hashes


def _info(name: str, kind: bytes, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info
