"""Untrusted zip and tar(.gz) archives: check them, then extract only regular files and directories.

Uploaded archives (SavedModel folders, python models, TNN pairs) come from users, so everything in them is
hostile until checked: entry names may climb out of the destination (`../`, absolute paths, drive letters,
backslashes), entries may be links or device files, and the declared sizes may be a zip bomb or simply lie.

`check_archive` reads only the archive's directory (zip) or headers (tar) and rejects anything suspicious before a
byte is written. `safe_extract` checks again and then writes each file itself, counting the bytes it actually
writes, so an archive whose headers lie is stopped by the same limits. Nothing here follows a link or applies the
archive's permission bits.
"""

from __future__ import annotations

import os
import re
import stat
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

# Small archives of text (a model.py, a config) can legitimately compress far better than max_ratio, and they
# cannot hurt anyone: the ratio limit only applies once the archive expands past this many bytes.
RATIO_CHECK_MIN_SIZE = 1024 * 1024

_CHUNK = 1024 * 1024
_DRIVE_LETTER = re.compile(r"^[A-Za-z]:")
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_NAME_SHOWN_MAX = 120


class ArchiveError(ValueError):
    """An archive that is refused; the message is shown to the uploader as is."""


@dataclass(frozen=True)
class ArchiveLimits:
    max_entries: int
    max_total_size: int  # bytes, all files uncompressed
    max_ratio: int  # uncompressed size / archive file size


@dataclass(frozen=True)
class ArchiveEntry:
    name: str  # normalised: forward slashes, no "." components, no leading or trailing slash
    size: int
    is_dir: bool = False


def _shown(name: str) -> str:
    text = name if len(name) <= _NAME_SHOWN_MAX else name[:_NAME_SHOWN_MAX] + "…"
    return repr(text)


def normalize_entry_name(raw: str) -> str:
    """The entry's path inside the destination, or ArchiveError when it could land anywhere else.

    Returns "" for the archive's root itself ("./" in tars made with `tar -C dir .`).
    """
    if not raw:
        raise ArchiveError("the archive has an entry with an empty name")
    if _CONTROL_CHARS.search(raw):
        raise ArchiveError(f"archive entry {_shown(raw)} has control characters in its name")
    # Zip and tar both use "/"; a backslash is only there to become a separator on some other machine.
    if "\\" in raw:
        raise ArchiveError(f"archive entry {_shown(raw)} has a backslash in its name: use '/' as the separator")
    if raw.startswith("/"):
        raise ArchiveError(f"archive entry {_shown(raw)} has an absolute path")
    if _DRIVE_LETTER.match(raw):
        raise ArchiveError(f"archive entry {_shown(raw)} starts with a drive letter")
    parts = [part for part in raw.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ArchiveError(f"archive entry {_shown(raw)} points outside the archive (path traversal with '..')")
    return "/".join(parts)


def archive_kind(path: Path | str) -> str | None:
    """The kind of archive: "zip", "tar" (plain or compressed) or None for any other file."""
    try:
        if zipfile.is_zipfile(path):
            return "zip"
        if tarfile.is_tarfile(path):
            return "tar"
    except (OSError, EOFError, zlib.error, tarfile.TarError):
        return None
    return None


def is_archive(path: Path | str) -> bool:
    return archive_kind(path) is not None


# --- Listing ---------------------------------------------------------------------------------------------------


def _zip_declared_entry_count(path: Path) -> int | None:
    """The entry count from the zip's end-of-central-directory record, read without parsing the directory.

    zipfile.ZipFile builds one object per entry as it opens, so a zip that declares millions of entries would eat
    memory before any limit could be applied. None when the record cannot be read (zipfile will then complain).
    """
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        tail_len = min(size, 22 + 0xFFFF)  # fixed record + the longest possible comment
        fh.seek(size - tail_len)
        tail = fh.read(tail_len)
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or at + 22 > len(tail):
            return None
        count = struct.unpack("<H", tail[at + 10 : at + 12])[0]
        if count != 0xFFFF:
            return count
        # Zip64: the locator sits just before the classic record and points at the zip64 record.
        if at < 20 or tail[at - 20 : at - 16] != b"PK\x06\x07":
            return None
        zip64_offset = struct.unpack("<Q", tail[at - 12 : at - 4])[0]
        fh.seek(zip64_offset)
        record = fh.read(56)
        if len(record) < 56 or record[:4] != b"PK\x06\x06":
            return None
        return int(struct.unpack("<Q", record[32:40])[0])


def _zip_entry(info: zipfile.ZipInfo) -> ArchiveEntry | None:
    name = normalize_entry_name(info.filename)
    if info.flag_bits & 0x1:
        raise ArchiveError(f"archive entry {_shown(info.filename)} is encrypted: upload an archive without a password")
    # Unix tools keep the st_mode in the high 16 bits of external_attr; that is the only place a zip says
    # "this is a symlink" (or a device), and extractors that honour it would create one.
    mode = info.external_attr >> 16
    file_type = stat.S_IFMT(mode)
    if file_type == stat.S_IFLNK:
        raise ArchiveError(f"archive entry {_shown(info.filename)} is a symbolic link: links are not allowed")
    if file_type not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise ArchiveError(f"archive entry {_shown(info.filename)} is a device, fifo or socket: only files allowed")
    is_dir = info.is_dir() or file_type == stat.S_IFDIR
    if is_dir and info.file_size:
        raise ArchiveError(f"archive entry {_shown(info.filename)} is a directory with content")
    return None if not name else ArchiveEntry(name=name, size=0 if is_dir else info.file_size, is_dir=is_dir)


def _tar_entry(member: tarfile.TarInfo) -> ArchiveEntry | None:
    name = normalize_entry_name(member.name)
    if member.issym() or member.islnk():
        kind = "symbolic link" if member.issym() else "hard link"
        raise ArchiveError(f"archive entry {_shown(member.name)} is a {kind}: links are not allowed")
    if member.ischr() or member.isblk() or member.isfifo():
        raise ArchiveError(f"archive entry {_shown(member.name)} is a device or fifo: only files are allowed")
    if not (member.isreg() or member.isdir()):
        raise ArchiveError(f"archive entry {_shown(member.name)} is not a regular file or directory")
    if not name:
        return None
    return ArchiveEntry(name=name, size=member.size if member.isreg() else 0, is_dir=member.isdir())


class _Tally:
    """Running checks shared by listing (declared sizes) and extraction (bytes actually written)."""

    def __init__(self, archive_size: int, limits: ArchiveLimits) -> None:
        self.limits = limits
        self.archive_size = max(archive_size, 1)
        self.entries = 0
        self.total = 0

    def add_entry(self) -> None:
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise ArchiveError(f"the archive has more than {self.limits.max_entries} entries")

    def add_bytes(self, count: int) -> None:
        self.total += count
        if self.total > self.limits.max_total_size:
            raise ArchiveError(f"the archive expands to more than {self.limits.max_total_size} bytes, the most allowed")
        if self.total > RATIO_CHECK_MIN_SIZE and self.total > self.limits.max_ratio * self.archive_size:
            raise ArchiveError(
                f"the archive expands to more than {self.limits.max_ratio} times its own size "
                f"({self.archive_size} bytes): refused as a possible zip bomb"
            )


def _check_tree(entries: list[ArchiveEntry]) -> None:
    seen: dict[str, bool] = {}
    for entry in entries:
        if entry.name in seen and not (entry.is_dir and seen[entry.name]):
            raise ArchiveError(f"the archive has more than one entry named {_shown(entry.name)}")
        seen[entry.name] = entry.is_dir
    # A file that is also the parent of another entry cannot be extracted, and some extractors resolve the
    # clash by replacing one with the other: refuse it rather than pick a winner.
    for name in seen:
        parent = name.rpartition("/")[0]
        while parent:
            if seen.get(parent) is False:
                raise ArchiveError(f"archive entry {_shown(parent)} is a file but also the folder of {_shown(name)}")
            parent = parent.rpartition("/")[0]


def _open_tar(path: Path) -> tarfile.TarFile:
    return tarfile.open(path, "r:*")


def _iter_checked(path: Path, limits: ArchiveLimits) -> Iterator[ArchiveEntry]:
    """Yield the entries in archive order, enforcing type, count and declared-size limits as it goes."""
    kind = archive_kind(path)
    tally = _Tally(path.stat().st_size, limits)
    if kind == "zip":
        declared = _zip_declared_entry_count(path)
        if declared is not None and declared > limits.max_entries:
            raise ArchiveError(f"the archive has more than {limits.max_entries} entries")
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                tally.add_entry()
                entry = _zip_entry(info)
                if entry is not None:
                    tally.add_bytes(entry.size)
                    yield entry
    elif kind == "tar":
        with _open_tar(path) as tf:
            # tf.next() rather than getmembers(): stop at the first entry over a limit instead of decompressing
            # a bomb to the end first.
            while (member := tf.next()) is not None:
                tally.add_entry()
                entry = _tar_entry(member)
                if entry is not None:
                    tally.add_bytes(entry.size)
                    yield entry
    else:
        raise ArchiveError("the file is not a zip or tar archive")


def check_archive(path: Path | str, limits: ArchiveLimits) -> list[ArchiveEntry]:
    """Every entry of a zip or tar(.gz), or ArchiveError saying why the archive is refused. Writes nothing."""
    path = Path(path)
    try:
        entries = list(_iter_checked(path, limits))
    except ArchiveError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise ArchiveError(f"the archive is corrupt or truncated ({exc})") from None
    _check_tree(entries)
    return entries


def list_names(path: Path | str, limits: ArchiveLimits) -> list[str]:
    """Names of the files (not directories) in a checked archive."""
    return [entry.name for entry in check_archive(path, limits) if not entry.is_dir]


# --- Extraction ------------------------------------------------------------------------------------------------


def _copy_limited(src: IO[bytes], dst: IO[bytes], declared: int, name: str, tally: _Tally) -> int:
    """Copy at most `declared` bytes, counting them against the archive's limits as they are written.

    Reads one byte past the declared size so that an entry whose header understates its size is caught here,
    whatever the archive library does about it.
    """
    written = 0
    while True:
        chunk = src.read(min(_CHUNK, declared - written + 1))
        if not chunk:
            break
        if written + len(chunk) > declared:
            raise ArchiveError(
                f"archive entry {_shown(name)} holds more data than its header declares ({declared} bytes): "
                "refused as a possible zip bomb"
            )
        tally.add_bytes(len(chunk))
        dst.write(chunk)
        written += len(chunk)
    return written


def _inside(root: Path, target: Path) -> bool:
    return target == root or root in target.parents


def _make_dir(root: Path, name: str) -> Path:
    target = root / name
    target.mkdir(mode=0o755, parents=True, exist_ok=True)
    # Checked after creation: resolve() follows any link already on disk, so this catches a destination that
    # was tampered with between the check and the write.
    if not _inside(root, target.resolve()):
        raise ArchiveError(f"archive entry {_shown(name)} resolves outside the destination")
    return target


def _write_file(root: Path, entry: ArchiveEntry, src: IO[bytes], tally: _Tally) -> None:
    parent_name = entry.name.rpartition("/")[0]
    parent = _make_dir(root, parent_name) if parent_name else root
    target = parent / entry.name.rpartition("/")[2]
    # O_EXCL|O_NOFOLLOW: never write through an existing file or link, whatever is in the destination.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(target, flags, 0o644)
    with os.fdopen(fd, "wb") as dst:
        written = _copy_limited(src, dst, entry.size, entry.name, tally)
    if written != entry.size:
        raise ArchiveError(f"archive entry {_shown(entry.name)} is truncated ({written} of {entry.size} bytes)")


def safe_extract(path: Path | str, dest: Path | str, limits: ArchiveLimits) -> list[ArchiveEntry]:
    """Check the archive, then extract its regular files and directories into `dest` (created, or empty).

    Files get mode 0644 and directories 0755 whatever the archive says: nothing extracted is executable, setuid
    or a link. On ArchiveError `dest` may hold a partial extraction: extract into a scratch directory and delete
    it on failure.
    """
    path = Path(path)
    dest = Path(dest)
    entries = check_archive(path, limits)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise ValueError(f"extraction destination {dest} must be empty")
    root = dest.resolve()
    tally = _Tally(path.stat().st_size, limits)
    try:
        if archive_kind(path) == "zip":
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    entry = _zip_entry(info)
                    if entry is not None and _start_entry(root, entry, tally):
                        with zf.open(info) as src:
                            _write_file(root, entry, src, tally)
        else:
            with _open_tar(path) as tf:
                while (member := tf.next()) is not None:
                    entry = _tar_entry(member)
                    if entry is not None and _start_entry(root, entry, tally):
                        tar_src = tf.extractfile(member)
                        if tar_src is None:
                            raise ArchiveError(f"archive entry {_shown(entry.name)} cannot be read")
                        with tar_src:
                            _write_file(root, entry, tar_src, tally)
    except ArchiveError:
        raise
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as exc:
        raise ArchiveError(f"the archive is corrupt or truncated ({exc})") from None
    except OSError as exc:
        raise ArchiveError(f"the archive could not be extracted ({exc.strerror or exc})") from None
    return entries


def _start_entry(root: Path, entry: ArchiveEntry, tally: _Tally) -> bool:
    """Count the entry and create it if it is a directory; True when it is a file still to be written."""
    tally.add_entry()
    if entry.is_dir:
        _make_dir(root, entry.name)
        return False
    return True
