"""What a file that is no model the portal knows is instead, in words the uploader can act on: "named model.onnx
but it is text", "an ONNX file cut off after 4,096 bytes", "a zip with no model.py; it holds README.md, data.csv".
One message for every bad file told nobody what to fix.

Only the bytes count, as in detection (the name proves nothing); the name is quoted where it promised a format the
bytes do not have. Reads at most a few kilobytes, and an archive's listing (already bounded by its limits).
"""

from __future__ import annotations

from pathlib import Path

from modelport.core import archives
from modelport.core.formats import onnx, python
from modelport.core.formats.base import ArchiveListing

_SNIFF_BYTES = 8192
_LISTED_NAMES = 8  # an archive's names quoted; the rest are counted
# Files that are models of a framework the portal serves only once converted, and what to push instead.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (a Keras .h5 model?): export it as a SavedModel or to ONNX"),
    (b"\x1f\x8b", "a gzip file that holds no tar archive"),
    (b"BZh", "a bzip2 file that holds no tar archive"),
    (b"\xfd7zXZ\x00", "an xz file that holds no tar archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive: pack the model as .zip or .tar.gz"),
    (b"Rar!", "a RAR archive: pack the model as .zip or .tar.gz"),
    (b"\x7fELF", "a Linux executable"),
    (b"%PDF", "a PDF document"),
)
# Pickle protocols 2 to 5 start with 0x80 and the protocol number: torch.save of a whole module before 1.6 wrote one.
_PICKLE = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
# What each archive format looks for, as said to the uploader.
_ARCHIVE_MARKERS = ("no model.py (a Triton python model), saved_model.pb (a TensorFlow SavedModel), data.pkl (a "
                    "TorchScript archive) or a .tnnproto with its .tnnmodel (a TNN model)")


def describe_unrecognised(path: Path, filename: str = "", limits: archives.ArchiveLimits | None = None) -> str:
    """What the file at `path` is, for a file no format recognised: a phrase that fits after "The file is "."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(_SNIFF_BYTES)
    named = _named(filename)
    kind = archives.archive_kind(path)
    if kind is not None:
        return _archive(path, kind, limits or archives.LISTING_LIMITS)
    cut = onnx.cut_off_onnx(path)
    if cut is not None:
        at, missing = cut
        return (f"an ONNX file cut off after {at:,} bytes (its last field needs {missing:,} bytes more): upload the "
                "whole file" if missing else f"an ONNX file cut off after {at:,} bytes: upload the whole file")
    if _is_text(head):
        start = _quoted_start(head)
        return _but(named, f"text, not a model (it starts {start})")
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return _but(named, what)
    if head.startswith(_PICKLE):
        return _but(named, "a Python pickle (torch.save of a module?): push TorchScript (torch.jit.save) or ONNX "
                           "instead")
    return _but(named, f"{_size(size)} with no header of a format the portal reads (not an ONNX "
                       "ModelProto, a TensorRT plan, a zip or a tar archive)")


def _named(filename: str) -> str:
    name = Path(filename).name[:80]
    return f"named {name!r}" if name else ""


def _but(named: str, what: str) -> str:
    """"named 'model.onnx' but it is text ...", or "text ..." when there is no name to contradict."""
    return f"{named} but it is {what}" if named else what


def _size(size: int) -> str:
    if size >= 1024 * 1024:
        return f"{size / (1024 * 1024):.1f} MB"
    if size >= 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size} bytes"


def _is_text(head: bytes) -> bool:
    if not head or b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # The sniffed block may end inside a character; a failure before its last few bytes is binary.
        if exc.start < len(head) - 3:
            return False
    return True


def _quoted_start(head: bytes) -> str:
    """The first line's first characters, printable only: quoted back to the uploader, who sent them."""
    line = head.decode("utf-8", errors="replace").strip().splitlines()[0] if head.strip() else ""
    shown = "".join(ch if ch.isprintable() else "?" for ch in line[:40])
    return f"with {shown!r}" + ("..." if len(line) > 40 else "") if shown else "with blank lines"


def _archive(path: Path, kind: str, limits: archives.ArchiveLimits) -> str:
    try:
        entries = archives.check_archive(path, limits)
    except archives.ArchiveError as exc:
        return f"a {kind} archive that cannot be read: {exc}"
    files = archives.model_names([e.name for e in entries if not e.is_dir])
    if not files:
        return f"an empty {kind} archive"
    model_py = archives.marker_path(files, "model.py")
    if model_py is not None:
        return (f"a {kind} archive whose {model_py} defines no class TritonPythonModel (a python model's model.py "
                "must)") if not python.detect_archive(_listing(path, kind, files)) else f"a {kind} archive"
    shown = ", ".join(files[:_LISTED_NAMES]) + (f" and {len(files) - _LISTED_NAMES} more" if len(files) > _LISTED_NAMES
                                                else "")
    return f"a {kind} archive with no model in it: {_ARCHIVE_MARKERS}; it holds {shown}"


def _listing(path: Path, kind: str, files: list[str]) -> ArchiveListing:
    return ArchiveListing(path=path, kind=kind, files=files, entries=files)
