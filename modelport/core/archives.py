"""Untrusted zip and tar(.gz) archives: check them, then extract only regular files and directories.

Uploaded archives (SavedModel folders, python models, TNN pairs) come from users, so everything in them is
hostile until checked: entry names may climb out of the destination (`../`, absolute paths, drive letters,
backslashes), entries may be links or device files, and the declared sizes may be a zip bomb or simply lie.

`check_archive` reads only the archive's directory (zip) or headers (tar) and rejects anything suspicious before a
byte is written. Tar headers are parsed here, not by the standard library's tarfile: tarfile reads the whole declared
payload of a PAX or GNU long-name header into memory (a 16 KB .tar.gz reached 37 MiB inside tarfile.is_tarfile), and
the PAX parser of Python 3.11.7 backtracks quadratically on crafted records (CVE-2024-6232). `_TarReader` reads one
512-byte block at a time, bounds every extended header, parses PAX records in one linear pass and never holds more
than one header's payload. `safe_extract` checks again and then writes each file itself, counting the bytes it actually
writes, so an archive whose headers lie is stopped by the same limits. Nothing here follows a link or applies the
archive's permission bits.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import os
import re
import stat
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

# Small archives of text (a model.py, a config) can legitimately compress far better than max_ratio, and they
# cannot hurt anyone: the ratio limit only applies once the archive expands past this many bytes.
RATIO_CHECK_MIN_SIZE = 1024 * 1024

_CHUNK = 1024 * 1024
_DRIVE_LETTER = re.compile(r"^[A-Za-z]:")
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_NAME_SHOWN_MAX = 120


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


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
    """The kind of archive: "zip", "tar" (plain, gzip, bzip2 or xz) or None for any other file."""
    try:
        if zipfile.is_zipfile(path):
            return "zip"
        with _tar_stream(Path(path)) as stream:
            block = stream.read(_BLOCK)
        if len(block) == _BLOCK and block != _ZERO_BLOCK:
            _parse_header(block)
            return "tar"
    except (OSError, EOFError, zlib.error, lzma.LZMAError, ArchiveError):
        return None
    return None


def is_archive(path: Path | str) -> bool:
    return archive_kind(path) is not None


# --- Tar, read with bounded reads ------------------------------------------------------------------------------

_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
# GNU tar's own limit for a name is PATH_MAX (4096); these leave room and still cost nothing to hold.
MAX_LONG_NAME_BYTES = 64 * 1024
MAX_PAX_HEADER_BYTES = 1024 * 1024
# Extended headers (PAX, GNU long name and link) before one member: real archives have one to three.
MAX_EXTENDED_HEADERS = 16

_FILE_TYPES = {b"0", b"\0", b"7"}  # regular, old-style regular, contiguous (a regular file for everyone but Masscomp)
_DIR_TYPE = b"5"
_LINK_TYPES = {b"1": "hard link", b"2": "symbolic link"}
_DEVICE_TYPES = {b"3", b"4", b"6"}  # character device, block device, fifo
_PAX_TYPES = {b"x", b"X", b"g"}  # per-file (POSIX, Solaris), global
_GNU_LONG_TYPES = {b"L": "path", b"K": "linkpath"}
_SPARSE_TYPE = b"S"
_OCTAL_DIGITS = frozenset(b"01234567")
_DECIMAL_DIGITS = frozenset(b"0123456789")


@dataclass(frozen=True)
class TarMember:
    """One tar member as its headers describe it (extended headers applied); `name` is as stored, unchecked."""

    name: str
    type: bytes
    size: int
    linkname: str = ""

    @property
    def is_file(self) -> bool:
        return self.type in _FILE_TYPES and not self.name.endswith("/")

    @property
    def is_dir(self) -> bool:
        # Old (v7) tars mark a directory by a trailing slash on a regular entry.
        return self.type == _DIR_TYPE or (self.type in _FILE_TYPES and self.name.endswith("/"))

    @property
    def data_size(self) -> int:
        """Bytes of data after the header (directories, links and devices have none, whatever `size` says)."""
        return self.size if self.type in _FILE_TYPES and not self.is_dir else 0


def _header_number(field: bytes, what: str) -> int:
    """A numeric header field: octal text (NUL- or space-terminated), or GNU's base-256 for large values."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    if field[:1] == b"\xff":
        raise ArchiveError(f"a tar header has a negative {what}")
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    if not set(text) <= _OCTAL_DIGITS:
        raise ArchiveError(f"a tar header has an invalid {what} field")
    return int(text, 8)


def _header_text(field: bytes, what: str = "entry name") -> str:
    raw = field.split(b"\0", 1)[0]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ArchiveError(f"a tar {what} is not UTF-8: {_shown(raw.decode('utf-8', 'replace'))}") from None


def _parse_header(block: bytes) -> TarMember:
    """A 512-byte header block (checksum verified); ArchiveError when it is not one."""
    checksum = _header_number(block[148:156], "checksum")
    # The checksum field counts as spaces (8 × 32 = 256); some old tars summed signed bytes.
    unsigned = 256 + sum(struct.unpack_from("148B8x356B", block))
    signed = 256 + sum(struct.unpack_from("148b8x356b", block))
    if checksum not in (unsigned, signed):
        raise ArchiveError("the archive has a tar header with a bad checksum: it is corrupt or not a tar archive")
    name = _header_text(block[0:100])
    # The POSIX ustar prefix field; GNU tar's own format keeps times there instead.
    if block[257:263] == b"ustar\0":
        prefix = _header_text(block[345:500])
        if prefix:
            name = f"{prefix}/{name}"
    return TarMember(name=name, type=block[156:157], size=_header_number(block[124:136], "size"),
                     linkname=_header_text(block[157:257], "link target"))


def _parse_pax_records(payload: bytes) -> dict[bytes, bytes]:
    """`<length> <keyword>=<value>\n` records, parsed in one pass (no regular expression to backtrack)."""
    records: dict[bytes, bytes] = {}
    pos = 0
    end = len(payload)
    while pos < end:
        if payload[pos] == 0:  # NUL padding after the last record
            if payload.count(0, pos) != end - pos:
                raise ArchiveError("a PAX header of the archive is malformed")
            break
        space = payload.find(b" ", pos, min(end, pos + 21))
        digits = payload[pos:space] if space > pos else b""
        if not digits or not set(digits) <= _DECIMAL_DIGITS:
            raise ArchiveError("a PAX header of the archive is malformed (a record without its length)")
        length = int(digits)
        record_end = pos + length
        if length <= len(digits) + 2 or record_end > end or payload[record_end - 1] != 0x0A:
            raise ArchiveError("a PAX header of the archive is malformed (a record's length is wrong)")
        keyword, equals, value = payload[space + 1 : record_end - 1].partition(b"=")
        if not equals or not keyword:
            raise ArchiveError("a PAX header of the archive is malformed (a record without a keyword)")
        records[keyword] = value
        pos = record_end
    return records


def _pax_text(records: dict[bytes, bytes], keyword: bytes) -> str | None:
    value = records.get(keyword)
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ArchiveError(f"a tar {keyword.decode()} is not UTF-8: "
                           f"{_shown(value.decode('utf-8', 'replace'))}") from None


def _pax_size(records: dict[bytes, bytes]) -> int | None:
    value = records.get(b"size")
    if value is None:
        return None
    if not value or len(value) > 20 or not set(value) <= _DECIMAL_DIGITS:
        raise ArchiveError("a PAX header of the archive has an invalid size")
    return int(value)


def _override(overrides: dict[str, str], keyword: str, value: str) -> None:
    # Tar readers disagree on which of two extended headers wins (tarfile: the first; others: the last), so an
    # entry named twice could be checked under one name and extracted under the other: refuse it.
    if keyword in overrides:
        raise ArchiveError(f"the archive gives one entry two {'names' if keyword == 'path' else 'link targets'}")
    overrides[keyword] = value


@contextlib.contextmanager
def _tar_stream(path: Path) -> Iterator[_Readable]:
    """The file's bytes, decompressed on the fly (gzip, bzip2, xz by their magic numbers), or as they are."""
    with open(path, "rb") as raw:
        magic = raw.read(6)
        raw.seek(0)
        stream: gzip.GzipFile | bz2.BZ2File | lzma.LZMAFile
        if magic[:2] == b"\x1f\x8b":
            stream = gzip.GzipFile(fileobj=raw, mode="rb")
        elif magic[:3] == b"BZh":
            stream = bz2.BZ2File(raw, "rb")
        elif magic == b"\xfd7zXZ\x00":
            stream = lzma.LZMAFile(raw, "rb")
        else:
            yield raw
            return
        with stream:
            yield stream


class _TarReader:
    """Members of a tar stream, in order, holding at most one extended header's payload in memory.

    `next()` returns the next member (skipping the rest of the previous one's data); `read()` reads the current
    member's data.
    """

    def __init__(self, stream: _Readable) -> None:
        self.stream = stream
        self.left = 0  # data bytes of the current member not read yet
        self.padding = 0  # zero bytes after them, up to the next block

    def _read_exactly(self, count: int) -> bytes:
        data = self.stream.read(count)
        while len(data) < count:
            more = self.stream.read(count - len(data))
            if not more:
                raise ArchiveError("the archive is truncated")
            data += more
        return data

    def _skip(self, count: int) -> None:
        while count:
            chunk = self.stream.read(min(_CHUNK, count))
            if not chunk:
                raise ArchiveError("the archive is truncated")
            count -= len(chunk)

    def _payload(self, size: int, limit: int, what: str) -> bytes:
        if size > limit:
            raise ArchiveError(f"the archive has a {what} of {size} bytes; at most {limit} bytes are accepted")
        data = self._read_exactly(size)
        self._skip(-size % _BLOCK)
        return data

    def next(self) -> TarMember | None:
        self._skip(self.left + self.padding)
        self.left = self.padding = 0
        overrides: dict[str, str] = {}
        size_override: int | None = None
        for _ in range(MAX_EXTENDED_HEADERS + 1):
            block = self.stream.read(_BLOCK)
            if len(block) < _BLOCK:
                if block:
                    block += self._read_exactly(_BLOCK - len(block))
                elif overrides or size_override is not None:
                    raise ArchiveError("the archive is truncated (it ends after an extended header)")
                else:
                    return None  # no end-of-archive blocks: tolerated, as by every tar
            if block == _ZERO_BLOCK:
                if overrides or size_override is not None:
                    raise ArchiveError("the archive is truncated (it ends after an extended header)")
                return None
            header = _parse_header(block)
            if header.type in _PAX_TYPES:
                records = _parse_pax_records(self._payload(header.size, MAX_PAX_HEADER_BYTES, "PAX header"))
                if any(key.startswith(b"GNU.sparse.") for key in records):
                    raise ArchiveError("the archive has a sparse file: make it without --sparse")
                if header.type == b"g":
                    # Global headers (git archive writes one with the commit id) may not rename or resize members.
                    if {b"path", b"linkpath", b"size"} & records.keys():
                        raise ArchiveError("the archive has a global PAX header that sets a path or size: "
                                           "make it with plain tar or zip")
                    continue
                for keyword in ("path", "linkpath"):
                    text = _pax_text(records, keyword.encode())
                    if text is not None:
                        _override(overrides, keyword, text)
                found = _pax_size(records)
                if found is not None:
                    if size_override is not None:
                        raise ArchiveError("the archive gives one entry two sizes in its extended headers")
                    size_override = found
                continue
            if header.type in _GNU_LONG_TYPES:
                payload = self._payload(header.size, MAX_LONG_NAME_BYTES, "GNU long name")
                _override(overrides, _GNU_LONG_TYPES[header.type], _header_text(payload))
                continue
            if header.type == _SPARSE_TYPE:
                raise ArchiveError(f"archive entry {_shown(header.name)} is a sparse file: "
                                   "make the archive without --sparse")
            member = TarMember(
                name=overrides.get("path", header.name),
                type=header.type,
                size=size_override if size_override is not None else header.size,
                linkname=overrides.get("linkpath", header.linkname),
            )
            self.left = member.data_size
            self.padding = -self.left % _BLOCK
            return member
        raise ArchiveError(f"the archive has more than {MAX_EXTENDED_HEADERS} extended headers in a row")

    def read(self, size: int = -1) -> bytes:
        """The current member's data: at most `size` bytes, b"" at its end."""
        if size < 0 or size > self.left:
            size = self.left
        if not size:
            return b""
        data = self.stream.read(size)
        if not data:
            raise ArchiveError("the archive is truncated")
        self.left -= len(data)
        return data


@contextlib.contextmanager
def _open_tar(path: Path) -> Iterator[_TarReader]:
    with _tar_stream(path) as stream:
        yield _TarReader(stream)


def _tar_members(reader: _TarReader) -> Iterator[TarMember]:
    while (member := reader.next()) is not None:
        yield member


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
        count: int = struct.unpack("<H", tail[at + 10 : at + 12])[0]
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


def _tar_entry(member: TarMember) -> ArchiveEntry | None:
    name = normalize_entry_name(member.name)
    if member.type in _LINK_TYPES:
        raise ArchiveError(f"archive entry {_shown(member.name)} is a {_LINK_TYPES[member.type]}: "
                           "links are not allowed")
    if member.type in _DEVICE_TYPES:
        raise ArchiveError(f"archive entry {_shown(member.name)} is a device or fifo: only files are allowed")
    if not (member.is_file or member.is_dir):
        raise ArchiveError(f"archive entry {_shown(member.name)} is not a regular file or directory")
    if member.type == _DIR_TYPE and member.size:
        # Its "content" would be read as the next headers by some tar readers and skipped by others.
        raise ArchiveError(f"archive entry {_shown(member.name)} is a directory with content")
    if not name:
        return None
    return ArchiveEntry(name=name, size=member.data_size, is_dir=member.is_dir)


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
        with _open_tar(path) as reader:
            # One member at a time: stop at the first entry over a limit instead of decompressing a bomb first.
            for member in _tar_members(reader):
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
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error, lzma.LZMAError, OSError) as exc:
        raise ArchiveError(f"the archive is corrupt or truncated ({exc})") from None
    _check_tree(entries)
    return entries


def list_names(path: Path | str, limits: ArchiveLimits) -> list[str]:
    """Names of the files (not directories) in a checked archive."""
    return [entry.name for entry in check_archive(path, limits) if not entry.is_dir]


def read_entry(path: Path | str, name: str, limit: int) -> bytes:
    """At most `limit` bytes of the file entry `name` (normalised, as check_archive lists it), decompressing no more
    than that; KeyError when the archive has no such file. Call on a checked archive."""
    path = Path(path)
    if archive_kind(path) == "zip":
        with zipfile.ZipFile(path) as zf:
            stored = {normalize_entry_name(info.filename): info for info in zf.infolist() if not info.is_dir()}
            with zf.open(stored[name]) as fh:
                return fh.read(limit)
    with _open_tar(path) as reader:
        for member in _tar_members(reader):
            if member.is_file and normalize_entry_name(member.name) == name:
                data = b""
                while len(data) < limit and (chunk := reader.read(min(_CHUNK, limit - len(data)))):
                    data += chunk
                return data
    raise KeyError(name)


# --- Extraction ------------------------------------------------------------------------------------------------


def _copy_limited(src: _Readable, dst: IO[bytes], declared: int, name: str, tally: _Tally) -> int:
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


def _write_file(root: Path, entry: ArchiveEntry, src: _Readable, tally: _Tally) -> None:
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
            with _open_tar(path) as reader:
                for member in _tar_members(reader):
                    entry = _tar_entry(member)
                    if entry is not None and _start_entry(root, entry, tally):
                        _write_file(root, entry, reader, tally)
    except ArchiveError:
        raise
    except (zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError) as exc:
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


# --- Where a model sits in an archive ----------------------------------------------------------------------------
# Shared by format detection, inspection and rendering (modelport.core.formats), so "the model is at the top level
# or inside the archive's one folder" and "Finder's clutter is not part of the model" mean the same everywhere.

# For listing an archive that is being recognised or inspected, not extracted: sizes do not matter yet (the upload
# was checked against the configured limits, validation.archive_limits()); the entry bound keeps a hostile archive
# from costing much.
LISTING_LIMITS = ArchiveLimits(max_entries=100_000, max_total_size=2**62, max_ratio=2**62)
# The settings' defaults (ARCHIVE_MAX_*), a backstop for extracting callers that pass no limits.
DEFAULT_LIMITS = ArchiveLimits(max_entries=10_000, max_total_size=50 * 1024**3, max_ratio=200)

MACOS_FOLDER = "__MACOSX"


def is_os_clutter(name: str) -> bool:
    """Whether an entry is what Finder adds to every zip it makes (`__MACOSX/`, `.DS_Store`): not the model's."""
    return name.startswith(f"{MACOS_FOLDER}/") or name.rsplit("/", 1)[-1] == ".DS_Store"


def model_names(names: list[str]) -> list[str]:
    """`names` without the OS clutter."""
    return [name for name in names if not is_os_clutter(name)]


def single_top_folder(names: list[str]) -> str | None:
    """The one folder every name is inside; None when names sit at the top level or in several folders."""
    tops = {name.split("/", 1)[0] for name in names}
    if len(tops) == 1 and all("/" in name for name in names):
        return tops.pop()
    return None


def model_root(names: list[str], marker: str) -> str | None:
    """Where the model whose `marker` file (model.py, saved_model.pb) is in `names` lives: "" for the top level,
    the folder's name when it is inside the archive's single top folder, None when it is in neither."""
    if marker in names:
        return ""
    top = single_top_folder(names)
    if top is not None and f"{top}/{marker}" in names:
        return top
    return None


def marker_path(names: list[str], marker: str) -> str | None:
    """The entry name of `marker` at the top level or inside the archive's single top folder, or None."""
    root = model_root(names, marker)
    if root is None:
        return None
    return f"{root}/{marker}" if root else marker


def extracted_root(extracted: Path, marker: str) -> Path | None:
    """model_root for an extracted archive: the directory holding `marker`, at the top or in the only folder."""
    if (extracted / marker).is_file():
        return extracted
    children = [c for c in extracted.iterdir() if c.name != MACOS_FOLDER]
    if len(children) == 1 and children[0].is_dir() and (children[0] / marker).is_file():
        return children[0]
    return None


def read_small_entry(path: Path | str, name: str, limit: int) -> bytes:
    """The bytes of a small entry (a model.py, a version record), refusing (not truncating) one over `limit`."""
    data = read_entry(path, name, limit + 1)
    if len(data) > limit:
        raise ArchiveError(f"{name} is larger than {limit} bytes")
    return data
