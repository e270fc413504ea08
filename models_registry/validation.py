"""Checks on an artifact's content, shared by the upload request (fast checks, answered with a 400) and the
inspection task (everything, including parsing the model)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from models_registry.archives import ArchiveError, ArchiveLimits, check_archive, is_archive
from models_registry.formats import FormatError, check_declared_format, detect_format
from models_registry.models import FORMATS_NEEDING_SIGNATURE, Format
from models_registry.signature import Signature


class ArtifactRejected(ValueError):
    """The artifact cannot become a model version; the message tells the user what to fix."""


def archive_limits() -> ArchiveLimits:
    return ArchiveLimits(
        max_entries=settings.ARCHIVE_MAX_ENTRIES,
        max_total_size=settings.ARCHIVE_MAX_TOTAL_SIZE,
        max_ratio=settings.ARCHIVE_MAX_RATIO,
    )


@dataclass(frozen=True)
class QuickCheck:
    format: str


def quick_check(path: Path, filename: str, declared_format: str, declared_signature: Signature | None) -> QuickCheck:
    """Format from content (or refusal), archive safety, and a signature where the format carries none."""
    if path.stat().st_size == 0:
        raise ArtifactRejected("The file is empty.")
    # Archives are checked before anything looks inside them (format detection opens them).
    if is_archive(path):
        try:
            check_archive(path, archive_limits())
        except ArchiveError as exc:
            raise ArtifactRejected(f"Unsafe archive: {exc}") from None
    detected = detect_format(path, filename, limits=archive_limits())
    if detected is None:
        if declared_format == Format.ONNX:
            raise ArtifactRejected("The file is not a valid ONNX model (its content could not be read as ONNX).")
        if declared_format:
            raise ArtifactRejected(f"The file does not look like a {Format(declared_format).label} artifact.")
        allowed = ", ".join(f.value for f in Format if f != Format.ENSEMBLE)
        raise ArtifactRejected(f"Could not detect the model format from the file's content; formats accepted: {allowed}.")
    if declared_format:
        try:
            check_declared_format(declared_format, detected)
        except FormatError as exc:
            raise ArtifactRejected(str(exc)) from None
    if detected in FORMATS_NEEDING_SIGNATURE and (declared_signature is None or declared_signature.is_empty):
        raise ArtifactRejected(
            f"A {Format(detected).label} artifact carries no readable signature: send 'signature' as JSON "
            '{"inputs": [{"name", "datatype", "dims"}], "outputs": [...]}.'
        )
    return QuickCheck(format=detected)
