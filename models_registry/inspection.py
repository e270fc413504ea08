"""Inspection of an uploaded artifact, run by a Celery worker: hash and de-duplicate the bytes, read or check the
signature, and mark the version ready or invalid with a message the user can act on."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from models_registry.models import Blob, Format, ModelVersion
from models_registry.onnx_inspect import (
    InspectionError,
    inspect_onnx,
    inspect_python_archive,
    inspect_torchscript_archive,
    validate_declared_signature,
)
from models_registry.savedmodel_inspect import savedmodel_findings
from models_registry.signature import Signature, signature_from_json
from models_registry.storage import get_store, sha256_of
from models_registry.trial_run import torchscript_findings
from models_registry.validation import ArtifactRejected, archive_limits, quick_check

log = logging.getLogger(__name__)

# A dynamic batch dimension has no upper bound in the model itself; this is the default Triton limit we offer.
DEFAULT_MAX_BATCH_SIZE = 64


@dataclass(frozen=True)
class Findings:
    signature: Signature
    max_batch_size: int
    # Stored as the version's `definition`: {"requirements": [...]} for python models (installed at deploy time).
    definition: dict[str, Any] | None = None


def _findings(version: ModelVersion, path_format: str, path: object) -> Findings:
    declared = signature_from_json(version.declared_signature) if version.declared_signature else None
    definition: dict[str, Any] | None = None
    if path_format == Format.ONNX:
        try:
            result = inspect_onnx(path)  # type: ignore[arg-type]
        except InspectionError as exc:
            raise ArtifactRejected(str(exc)) from None
        if result.problems:
            raise ArtifactRejected("onnx.checker found problems: " + "; ".join(result.problems))
        signature = result.signature
        if declared is not None and not declared.is_empty:
            mismatches = validate_declared_signature(declared, signature)
            if mismatches:
                raise ArtifactRejected("The declared signature does not match the model: " + "; ".join(mismatches))
        batchable = result.has_batch_dim
        hint = result.max_batch_size_hint or DEFAULT_MAX_BATCH_SIZE
    elif path_format == Format.SAVEDMODEL:
        signature, definition = savedmodel_findings(path, declared)  # type: ignore[arg-type]
        batchable, hint = signature.has_batch_dim, DEFAULT_MAX_BATCH_SIZE
    else:
        try:
            if path_format == Format.PYTHON:
                info = inspect_python_archive(path, archive_limits())  # type: ignore[arg-type]
                definition = {"requirements": info.requirements}
            elif path_format == Format.TORCHSCRIPT:
                inspect_torchscript_archive(path, archive_limits())  # type: ignore[arg-type]
        except InspectionError as exc:
            raise ArtifactRejected(str(exc)) from None
        signature = declared or Signature()
        if path_format == Format.TORCHSCRIPT:
            definition = torchscript_findings(path, signature)  # type: ignore[arg-type]
        batchable = signature.has_batch_dim
        hint = DEFAULT_MAX_BATCH_SIZE
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
