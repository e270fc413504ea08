"""Inspection of an uploaded artifact, run by a Celery worker: hash and de-duplicate the bytes, read or check the
signature, and mark the version ready or invalid with a message the user can act on."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from models_registry import formats
from models_registry.formats.base import InspectionError
from models_registry.models import Blob, ModelVersion
from models_registry.signature import Signature, signature_from_json
from models_registry.storage import get_store, sha256_of
from models_registry.validation import ArtifactRejected, archive_limits, quick_check

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Findings:
    signature: Signature
    max_batch_size: int
    # Stored as the version's `definition`: {"requirements": [...]} for python models (installed at deploy time).
    definition: dict[str, Any] | None = None


def _findings(version: ModelVersion, path_format: str, path: Path) -> Findings:
    declared = signature_from_json(version.declared_signature) if version.declared_signature else None
    inspect = formats.get(path_format).inspect
    assert inspect is not None  # quick_check detects uploadable formats only
    try:
        inspected = inspect(path, declared, archive_limits())
    except InspectionError as exc:
        raise ArtifactRejected(str(exc)) from None
    signature, definition = inspected.signature, inspected.definition
    batchable = inspected.batchable
    hint = inspected.max_batch_size_hint or formats.DEFAULT_MAX_BATCH_SIZE
    requested = version.declared_max_batch_size
    if requested is not None and requested > 0 and not batchable:
        raise ArtifactRejected(
            f"max_batch_size={requested} needs a batch dimension: the first dimension of every input and output "
            "must be dynamic (-1). Send max_batch_size=0 for a model without one."
        )
    max_batch_size = requested if requested is not None else (hint if batchable else 0)
    return Findings(signature=signature, max_batch_size=max_batch_size, definition=definition)


def inspect_version(version_id: int) -> None:
    version = ModelVersion.objects.select_related("model").filter(pk=version_id).first()
    if version is None or version.status != ModelVersion.Status.VALIDATING:
        log.info("version %s is gone or already inspected", version_id)
        return
    store = get_store()
    key = version.artifact_key
    try:
        with store.local_copy(key) as path:
            with open(path, "rb") as stream:
                sha256, size = sha256_of(stream)
            fmt = quick_check(path, version.original_filename, version.declared_format,
                              signature_from_json(version.declared_signature) if version.declared_signature else None).format
            findings = _findings(version, fmt, path)
    except ArtifactRejected as exc:
        _mark_invalid(version, str(exc))
        return
    except FileNotFoundError:
        _mark_invalid(version, "The uploaded bytes are missing from storage; upload the file again.")
        return

    blob_key = Blob.key_for(sha256)
    if not Blob.objects.filter(pk=sha256).exists():
        if key != blob_key:
            store.move(key, blob_key)
        try:
            Blob.objects.create(sha256=sha256, size=size, key=blob_key)
        except IntegrityError:
            pass  # the same bytes were stored by a concurrent inspection
    elif key != blob_key:
        store.delete(key)  # identical content is stored once
    with transaction.atomic():
        updated = ModelVersion.objects.filter(pk=version.pk, status=ModelVersion.Status.VALIDATING).update(
            blob_id=sha256,
            staged_key="",
            sha256=sha256,
            size=size,
            format=fmt,
            signature=findings.signature.to_json(),
            max_batch_size=findings.max_batch_size,
            definition=findings.definition,
            status=ModelVersion.Status.READY,
            error="",
            validated_at=timezone.now(),
        )
    log.info("version %s ready (%s, %s bytes, updated=%s)", version, fmt, size, updated)


def _mark_invalid(version: ModelVersion, message: str) -> None:
    ModelVersion.objects.filter(pk=version.pk, status=ModelVersion.Status.VALIDATING).update(
        status=ModelVersion.Status.INVALID, error=message, validated_at=timezone.now()
    )
    if version.staged_key:
        get_store().delete(version.staged_key)
    log.info("version %s invalid: %s", version, message)
