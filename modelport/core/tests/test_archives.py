"""Untrusted archives: everything that could escape the destination, or fill the disk, is refused."""

from __future__ import annotations

import io
import random
import stat
import struct
import tarfile
import warnings
import zipfile
from pathlib import Path
from typing import Literal

import pytest

from modelport.core.archives import (
    ArchiveEntry,
    ArchiveError,
    ArchiveLimits,
    _copy_limited,
    _Tally,
    archive_kind,
    check_archive,
    is_archive,
    read_entry,
    safe_extract,
)

LIMITS = ArchiveLimits(max_entries=50, max_total_size=8 * 1024 * 1024, max_ratio=100)
MiB = 1024 * 1024


def make_zip(path: Path, entries: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return path


def make_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: Literal["w", "w:gz"] = "w") -> Path:
    with tarfile.open(path, mode) as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
            else:
                archive.addfile(info)
    return path


def tar_member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = mode
    return info


def test_a_good_zip_is_listed_and_extracted(tmp_path: Path) -> None:
    archive = make_zip(
        tmp_path / "model.zip",
        {"my_model/saved_model.pb": b"graph", "my_model/variables/variables.index": b"index", "my_model/": b""},
    )
    entries = check_archive(archive, LIMITS)
    assert ArchiveEntry("my_model/saved_model.pb", 5) in entries
    safe_extract(archive, tmp_path / "out", LIMITS)
    assert (tmp_path / "out/my_model/saved_model.pb").read_bytes() == b"graph"
    assert (tmp_path / "out/my_model/variables/variables.index").read_bytes() == b"index"


def test_a_good_tar_gz_made_with_tar_c_dot_is_extracted(tmp_path: Path) -> None:
    archive = make_tar(
        tmp_path / "model.tar.gz",
        [
            (tar_member("./", tarfile.DIRTYPE, mode=0o755), None),
            (tar_member("./model.py"), b"class TritonPythonModel: pass\n"),
            (tar_member("./lib/helpers.py"), b"X = 1\n"),
        ],
        mode="w:gz",
    )
    assert [e.name for e in check_archive(archive, LIMITS)] == ["model.py", "lib/helpers.py"]
    safe_extract(archive, tmp_path / "out", LIMITS)
    assert (tmp_path / "out/model.py").read_text().startswith("class TritonPythonModel")
    assert (tmp_path / "out/lib/helpers.py").read_text() == "X = 1\n"


def test_extracted_files_get_plain_permissions_whatever_the_archive_says(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "m.tar", [(tar_member("run.sh", mode=0o6777), b"#!/bin/sh\n")])
    safe_extract(archive, tmp_path / "out", LIMITS)
    assert stat.S_IMODE((tmp_path / "out/run.sh").stat().st_mode) == 0o644


@pytest.mark.parametrize("name", ["../../evil.py", "model/../../evil.py", "a/./../../evil.py"])
def test_it_rejects_zip_slip(tmp_path: Path, name: str) -> None:
    archive = make_zip(tmp_path / "m.zip", {"model.py": b"", name: b"owned"})
    with pytest.raises(ArchiveError, match="outside the archive"):
        check_archive(archive, LIMITS)
    with pytest.raises(ArchiveError):
        safe_extract(archive, tmp_path / "out", LIMITS)
    assert not (tmp_path / "evil.py").exists()


def test_it_rejects_path_traversal_in_a_tar(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "m.tar", [(tar_member("../evil.py"), b"owned")])
    with pytest.raises(ArchiveError, match="outside the archive"):
        check_archive(archive, LIMITS)


@pytest.mark.parametrize("name", ["/etc/cron.d/evil", "//server/share/evil"])
def test_it_rejects_absolute_paths(tmp_path: Path, name: str) -> None:
    # zipfile strips a leading "/" when writing, so the entry is written with a ZipInfo that keeps it.
    zip_path = tmp_path / "m.zip"
    with zipfile.ZipFile(zip_path, "w") as archive:
        info = zipfile.ZipInfo("placeholder")
        info.filename = name
        archive.writestr(info, b"owned")
    with pytest.raises(ArchiveError, match="absolute path"):
        check_archive(zip_path, LIMITS)
    tar_path = make_tar(tmp_path / "m.tar", [(tar_member(name), b"owned")])
    with pytest.raises(ArchiveError, match="absolute path"):
        check_archive(tar_path, LIMITS)


@pytest.mark.parametrize(
    ("name", "reason"),
    [("C:/Windows/evil.dll", "drive letter"), ("c:evil.dll", "drive letter"), ("..\\..\\evil.py", "backslash")],
)
def test_it_rejects_drive_letters_and_backslash_tricks(tmp_path: Path, name: str, reason: str) -> None:
    zip_path = tmp_path / "m.zip"
    with zipfile.ZipFile(zip_path, "w") as archive:
        info = zipfile.ZipInfo("placeholder")
        info.filename = name
        archive.writestr(info, b"owned")
    with pytest.raises(ArchiveError, match=reason):
        check_archive(zip_path, LIMITS)


def test_it_rejects_a_symlink_in_a_zip(tmp_path: Path) -> None:
    zip_path = tmp_path / "m.zip"
    with zipfile.ZipFile(zip_path, "w") as archive:
        archive.writestr("model.py", b"")
        link = zipfile.ZipInfo("secrets")
        link.create_system = 3  # Unix: st_mode in the high bits of external_attr
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, b"/etc/passwd")
    with pytest.raises(ArchiveError, match="symbolic link"):
        check_archive(zip_path, LIMITS)
    with pytest.raises(ArchiveError, match="symbolic link"):
        safe_extract(zip_path, tmp_path / "out", LIMITS)
    assert not (tmp_path / "out/secrets").exists()


def test_it_rejects_a_symlink_in_a_tar(tmp_path: Path) -> None:
    archive = make_tar(
        tmp_path / "m.tar",
        [(tar_member("model.py"), b""), (tar_member("secrets", tarfile.SYMTYPE, linkname="/etc/passwd"), None)],
    )
    with pytest.raises(ArchiveError, match="symbolic link"):
        check_archive(archive, LIMITS)


def test_it_rejects_a_hard_link_in_a_tar(tmp_path: Path) -> None:
    archive = make_tar(
        tmp_path / "m.tar",
        [(tar_member("model.py"), b""), (tar_member("passwd", tarfile.LNKTYPE, linkname="/etc/passwd"), None)],
    )
    with pytest.raises(ArchiveError, match="hard link"):
        check_archive(archive, LIMITS)


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_it_rejects_device_files_and_fifos_in_a_tar(tmp_path: Path, kind: bytes) -> None:
    archive = make_tar(tmp_path / "m.tar", [(tar_member("model.py"), b""), (tar_member("dev/sda", kind), None)])
    with pytest.raises(ArchiveError, match="device or fifo"):
        check_archive(archive, LIMITS)


def test_it_rejects_a_device_file_in_a_zip(tmp_path: Path) -> None:
    zip_path = tmp_path / "m.zip"
    with zipfile.ZipFile(zip_path, "w") as archive:
        device = zipfile.ZipInfo("dev/sda")
        device.create_system = 3
        device.external_attr = (stat.S_IFBLK | 0o600) << 16
        archive.writestr(device, b"")
    with pytest.raises(ArchiveError, match="device"):
        check_archive(zip_path, LIMITS)


def test_it_rejects_too_many_entries(tmp_path: Path) -> None:
    names = {f"f{i}.txt": b"x" for i in range(LIMITS.max_entries + 1)}
    with pytest.raises(ArchiveError, match="more than 50 entries"):
        check_archive(make_zip(tmp_path / "m.zip", names), LIMITS)
    members: list[tuple[tarfile.TarInfo, bytes | None]] = [(tar_member(name), data) for name, data in names.items()]
    with pytest.raises(ArchiveError, match="more than 50 entries"):
        check_archive(make_tar(tmp_path / "m.tar", members), LIMITS)


def test_it_rejects_an_archive_bigger_than_the_total_size_limit(tmp_path: Path) -> None:
    # Stored, not compressed: the ratio is 1, only the total is too big.
    entries = {"a.bin": bytes(5 * MiB), "b.bin": bytes(4 * MiB)}
    archive = make_zip(tmp_path / "m.zip", entries, compression=zipfile.ZIP_STORED)
    with pytest.raises(ArchiveError, match="expands to more than 8388608 bytes"):
        check_archive(archive, LIMITS)


def test_it_rejects_a_zip_bomb_by_its_compression_ratio(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "m.zip", {"model.py": b"", "weights.bin": bytes(4 * MiB)})
    assert archive.stat().st_size < 40 * 1024  # deflate squeezes zeros about 1000:1
    with pytest.raises(ArchiveError, match="zip bomb"):
        check_archive(archive, LIMITS)


def test_it_rejects_a_tar_gz_bomb_by_its_compression_ratio(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "m.tar.gz", [(tar_member("weights.bin"), bytes(4 * MiB))], mode="w:gz")
    with pytest.raises(ArchiveError, match="zip bomb"):
        check_archive(archive, LIMITS)


def test_small_archives_of_text_may_compress_well(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "m.zip", {"model.py": b"# " + b"=" * 500_000})
    assert check_archive(archive, LIMITS) == [ArchiveEntry("model.py", 500_002)]


def test_an_entry_whose_header_understates_its_size_is_stopped_during_extraction(tmp_path: Path) -> None:
    """The zip's headers claim 100 bytes for an entry that inflates to 4 MiB."""
    archive = make_zip(tmp_path / "m.zip", {"weights.bin": bytes(4 * MiB)})
    data = bytearray(archive.read_bytes())
    local, central = data.find(b"PK\x03\x04"), data.find(b"PK\x01\x02")
    struct.pack_into("<I", data, local + 22, 100)  # local header: uncompressed size
    struct.pack_into("<I", data, central + 24, 100)  # central directory: uncompressed size
    archive.write_bytes(bytes(data))

    assert check_archive(archive, LIMITS) == [ArchiveEntry("weights.bin", 100)]
    with pytest.raises(ArchiveError):
        safe_extract(archive, tmp_path / "out", LIMITS)
    written = tmp_path / "out/weights.bin"
    assert not written.exists() or written.stat().st_size <= 100


def test_the_extraction_guard_counts_the_bytes_actually_written() -> None:
    tally = _Tally(archive_size=1000, limits=LIMITS)
    with pytest.raises(ArchiveError, match="more data than its header declares"):
        _copy_limited(io.BytesIO(bytes(10_000)), io.BytesIO(), declared=100, name="weights.bin", tally=tally)
    tally = _Tally(archive_size=10 * MiB, limits=ArchiveLimits(max_entries=5, max_total_size=MiB, max_ratio=100))
    with pytest.raises(ArchiveError, match="expands to more than"):
        _copy_limited(io.BytesIO(bytes(2 * MiB)), io.BytesIO(), declared=2 * MiB, name="weights.bin", tally=tally)


def test_it_rejects_duplicate_entries(tmp_path: Path) -> None:
    zip_path = tmp_path / "m.zip"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate it is asked to write
        with zipfile.ZipFile(zip_path, "w") as archive:
            archive.writestr("model.py", b"class TritonPythonModel: pass\n")
            archive.writestr("./model.py", b"import os; os.system('evil')\n")
    with pytest.raises(ArchiveError, match="more than one entry named 'model.py'"):
        check_archive(zip_path, LIMITS)
    tar_path = make_tar(tmp_path / "m.tar", [(tar_member("model.py"), b"a"), (tar_member("model.py"), b"b")])
    with pytest.raises(ArchiveError, match="more than one entry"):
        check_archive(tar_path, LIMITS)


def test_it_rejects_a_file_that_is_also_a_folder(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "m.zip", {"model": b"file", "model/model.py": b""})
    with pytest.raises(ArchiveError, match="is a file but also the folder"):
        check_archive(archive, LIMITS)


def test_a_corrupt_archive_is_refused_with_a_message(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "m.zip", {"weights.bin": random.Random(0).randbytes(10_000)})
    data = bytearray(archive.read_bytes())
    data[100:200] = bytes(100)  # inside the entry's compressed data
    archive.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match="corrupt"):
        safe_extract(archive, tmp_path / "out", LIMITS)


def test_it_extracts_only_into_an_empty_destination(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "m.zip", {"model.py": b""})
    (tmp_path / "out").mkdir()
    (tmp_path / "out/model.py").symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match="must be empty"):
        safe_extract(archive, tmp_path / "out", LIMITS)


def test_it_tells_archives_from_other_files(tmp_path: Path) -> None:
    assert is_archive(make_zip(tmp_path / "m.zip", {"a": b"b"}))
    assert is_archive(make_tar(tmp_path / "m.tar.gz", [(tar_member("a"), b"b")], mode="w:gz"))
    plain = tmp_path / "model.onnx"
    plain.write_bytes(b"\x08\x08\x12\x07pytorch" + bytes(600))
    assert not is_archive(plain)


# --- Tar headers are read with bounded reads (issue 12: tarfile read whole extended headers, CVE-2024-6232) -------


def raw_header(name: str, kind: bytes, size: int, fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    return info.tobuf(format=fmt)


def extended(kind: bytes, payload: bytes) -> bytes:
    """An extended header (PAX "x"/"g", GNU "L"/"K") with its payload, padded to whole blocks."""
    name = "././@LongLink" if kind in (b"L", b"K") else "PaxHeader"
    return raw_header(name, kind, len(payload)) + payload + bytes(-len(payload) % 512)


def pax_record(keyword: str, value: str) -> bytes:
    body = f" {keyword}={value}\n".encode()
    length = len(body) + len(str(len(body)))
    length = len(body) + len(str(length))
    return str(length).encode() + body


def member(name: str, data: bytes) -> bytes:
    return raw_header(name, tarfile.REGTYPE, len(data)) + data + bytes(-len(data) % 512)


def write_tar(path: Path, *parts: bytes, gz: bool = False) -> Path:
    import gzip

    data = b"".join(parts) + bytes(1024)
    path.write_bytes(gzip.compress(data, 6) if gz else data)
    return path


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_it_lists_and_extracts_what_tarfile_writes_in_every_format(tmp_path: Path, fmt: int, mode: str) -> None:
    long_names = fmt != tarfile.USTAR_FORMAT  # ustar holds 100 + 155 characters, ASCII only in practice
    files = {"model.py": b"class TritonPythonModel: pass\n", "a" * 90 + "/" + "b" * 90 + ".bin": bytes(700)}
    if long_names:
        files["lib/" + "x" * 150 + ".py"] = b"X = 1\n"
        files["données/modèle.py"] = "é".encode() * 300
    archive = tmp_path / "m.tar"
    with tarfile.open(archive, mode, format=fmt) as tf:  # type: ignore[call-overload]
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        folder = tarfile.TarInfo("empty")
        folder.type = tarfile.DIRTYPE
        tf.addfile(folder)
    assert is_archive(archive)
    entries = check_archive(archive, LIMITS)
    with tarfile.open(archive) as tf:
        assert [(e.name, e.size, e.is_dir) for e in entries] == [(m.name, m.size, m.isdir()) for m in tf]
    safe_extract(archive, tmp_path / "out", LIMITS)
    for name, data in files.items():
        assert (tmp_path / "out" / name).read_bytes() == data
        assert read_entry(archive, name, 10) == data[:10]
    assert (tmp_path / "out/empty").is_dir()


def test_a_gnu_long_name_bomb_is_refused_without_reading_it_into_memory(tmp_path: Path) -> None:
    """A 32 KB .tar.gz whose long-name header declares 32 MiB: tarfile.is_tarfile held all of it (53 MiB peak)."""
    import tracemalloc

    name = b"a" * (32 * MiB)
    archive = write_tar(tmp_path / "bomb.tar.gz", extended(b"L", name), member("model.py", b""), gz=True)
    assert archive.stat().st_size < 64 * 1024
    tracemalloc.start()
    try:
        assert archive_kind(archive) == "tar"
        with pytest.raises(ArchiveError, match="GNU long name of 33554432 bytes; at most 65536"):
            check_archive(archive, LIMITS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MiB


def test_a_pax_header_too_large_to_hold_is_refused(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "bomb.tar.gz", extended(b"x", b"9" * (2 * MiB)), member("model.py", b""), gz=True)
    with pytest.raises(ArchiveError, match="PAX header of 2097152 bytes"):
        check_archive(archive, LIMITS)


def test_a_pax_header_made_to_backtrack_is_refused_at_once(tmp_path: Path) -> None:
    """CVE-2024-6232: Python 3.11.7's tarfile takes quadratic time over a PAX header of digits (about 5 s for these
    60,000; minutes for a megabyte of them)."""
    import time

    archive = write_tar(tmp_path / "redos.tar", extended(b"x", b"1" * 60_000), member("model.py", b""))
    started = time.process_time()  # CPU time: the check's own cost, not the waits of a loaded machine
    with pytest.raises(ArchiveError, match="PAX header of the archive is malformed"):
        check_archive(archive, LIMITS)
    assert time.process_time() - started < 0.5


def test_a_pax_path_is_checked_like_any_name(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "m.tar", extended(b"x", pax_record("path", "../../evil.py")),
                        member("model.py", b"owned"))
    with pytest.raises(ArchiveError, match="outside the archive"):
        check_archive(archive, LIMITS)
    with pytest.raises(ArchiveError, match="outside the archive"):
        safe_extract(archive, tmp_path / "out", LIMITS)
    assert not (tmp_path / "evil.py").exists()


def test_a_gnu_long_link_to_a_secret_is_still_a_link(tmp_path: Path) -> None:
    link = raw_header("secrets", tarfile.SYMTYPE, 0)
    archive = write_tar(tmp_path / "m.tar", extended(b"K", b"/etc/" + b"x" * 200), link)
    with pytest.raises(ArchiveError, match="symbolic link"):
        check_archive(archive, LIMITS)


def test_an_entry_named_twice_by_its_extended_headers_is_refused(tmp_path: Path) -> None:
    """tarfile keeps the first name, other readers the last: one name would be checked, the other extracted."""
    archive = write_tar(tmp_path / "m.tar", extended(b"x", pax_record("path", "model.py")),
                        extended(b"L", b"../evil.py"), member("x", b""))
    with pytest.raises(ArchiveError, match="two names"):
        check_archive(archive, LIMITS)


def test_a_pax_size_is_what_counts_against_the_limits(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "m.tar", extended(b"x", pax_record("size", str(9 * MiB))), member("big.bin", b""))
    with pytest.raises(ArchiveError, match="expands to more than 8388608 bytes"):
        check_archive(archive, LIMITS)
    bad = write_tar(tmp_path / "bad.tar", extended(b"x", pax_record("size", "²")), member("big.bin", b""))
    with pytest.raises(ArchiveError, match="invalid size"):
        check_archive(bad, LIMITS)


def test_a_global_header_with_a_comment_is_fine_but_one_that_renames_is_not(tmp_path: Path) -> None:
    # What `git archive` writes first.
    ok = write_tar(tmp_path / "ok.tar", extended(b"g", pax_record("comment", "0" * 40)), member("model.py", b"x"))
    assert check_archive(ok, LIMITS) == [ArchiveEntry("model.py", 1)]
    renames = write_tar(tmp_path / "g.tar", extended(b"g", pax_record("path", "../evil.py")), member("model.py", b"x"))
    with pytest.raises(ArchiveError, match="global PAX header"):
        check_archive(renames, LIMITS)


def test_it_refuses_sparse_files_and_names_that_are_not_utf8(tmp_path: Path) -> None:
    sparse = write_tar(tmp_path / "s.tar", extended(b"x", pax_record("GNU.sparse.map", "0,10")), member("w.bin", b""))
    with pytest.raises(ArchiveError, match="sparse"):
        check_archive(sparse, LIMITS)
    old_sparse = write_tar(tmp_path / "s2.tar", raw_header("w.bin", tarfile.GNUTYPE_SPARSE, 0, tarfile.GNU_FORMAT))
    with pytest.raises(ArchiveError, match="sparse"):
        check_archive(old_sparse, LIMITS)
    latin1 = write_tar(tmp_path / "l.tar", extended(b"L", "modèle.py".encode("latin-1")), member("x", b""))
    with pytest.raises(ArchiveError, match="not UTF-8"):
        check_archive(latin1, LIMITS)


def test_a_truncated_tar_and_a_directory_with_content_are_refused(tmp_path: Path) -> None:
    whole = member("weights.bin", bytes(5000))
    truncated = tmp_path / "t.tar"
    truncated.write_bytes(whole[:3000])
    with pytest.raises(ArchiveError, match="truncated"):
        check_archive(truncated, LIMITS)
    after_header = write_tar(tmp_path / "t2.tar", extended(b"x", pax_record("path", "a.py")))
    with pytest.raises(ArchiveError, match="truncated"):
        check_archive(after_header, LIMITS)
    folder = write_tar(tmp_path / "d.tar", raw_header("dir", tarfile.DIRTYPE, 512) + bytes(512))
    with pytest.raises(ArchiveError, match="directory with content"):
        check_archive(folder, LIMITS)


def test_a_bad_checksum_is_not_a_tar(tmp_path: Path) -> None:
    data = bytearray(write_tar(tmp_path / "m.tar", member("model.py", b"x")).read_bytes())
    data[0] ^= 1
    (tmp_path / "m.tar").write_bytes(bytes(data))
    assert not is_archive(tmp_path / "m.tar")
