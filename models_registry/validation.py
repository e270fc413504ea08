"""Checks on an artifact's content, shared by the upload request (fast checks, answered with a 400) and the
inspection task (everything, including parsing the model)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from modelport.core.archives import ArchiveError, ArchiveLimits, check_archive, is_archive
from modelport.core.errors import ArtifactRejected
from modelport.core.formats import FormatError, check_declared_format, detect_format, what_to_upload
from modelport.core.formats.unrecognised import describe_unrecognised
from modelport.core.signature import Signature
from models_registry.models import FORMATS_NEEDING_SIGNATURE, Format


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
        # What the file is instead: a declared format has been contradicted already, so the name is left out.
        found = describe_unrecognised(path, "" if declared_format else filename, archive_limits())
        if declared_format == Format.ONNX:
            raise ArtifactRejected(f"The file is not a valid ONNX model: it is {found}. Upload "
                                   f"{what_to_upload(declared_format)}.")
        if declared_format:
            raise ArtifactRejected(f"The file does not look like a {Format(declared_format).label} artifact: it is "
                                   f"{found}. Upload {what_to_upload(declared_format)}.")
        raise ArtifactRejected(f"The file is {found}. Upload one of: {what_to_upload()}.")
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
