"""Inspection of an uploaded artifact, run by a Celery worker: hash and de-duplicate the bytes, read or check the
signature, and mark the version ready or invalid with a message the user can act on."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from modelport.core import formats
from modelport.core.definitions import Definition, definition_to_json
from modelport.core.example_request import ExampleRequest, ExampleRequestError, parse_example_request
from modelport.core.formats.base import InspectionError
from modelport.core.signature import Signature, signature_from_json
from models_registry import dispatch, python_trial, trial
from models_registry.models import Blob, ModelVersion
from models_registry.storage import get_store, sha256_of
from models_registry.validation import ArtifactRejected, archive_limits, quick_check

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Findings:
    signature: Signature
    max_batch_size: int
    # Stored as the version's `definition` (modelport/core/definitions.py): a python model's requirements (installed
    # at deploy time), a SavedModel's SignatureDef, a trial's note.
    definition: Definition | None = None
    memory_bytes: int = 0  # what the model's own processes took at its trial call (0: not measured)


def _trial_findings(path_format: str, path: Path, signature: Signature,
                    example: ExampleRequest | None, decoupled: bool = False) -> python_trial.TrialFindings:
    """The run a format asked for (Inspected.needs_trial_run), with the operator's settings; ArtifactRejected when the
    model does not run as declared (a streaming one: any of its pieces)."""
    if path_format == formats.PYTHON:
        return python_trial.python_trial(path, signature, has_requirements=False, example=example,
                                         decoupled=decoupled)
    return python_trial.TrialFindings(*trial.torchscript_findings(path, signature))


def _findings(version: ModelVersion, path_format: str, path: Path) -> Findings:
    declared = signature_from_json(version.declared_signature) if version.declared_signature else None
    if declared is not None and declared.optional_inputs and path_format != formats.PYTHON:
        # A python model reads None for an input left out; the generated models that serve the other formats (and
        # their native backends) need every input the file declares.
        raise ArtifactRejected(f"Only a python model's inputs can be optional; this {formats.get(path_format).label} "
                               f"model's {', '.join(declared.optional_inputs)} must be sent on every request: leave "
                               "'optional' out.")
    inspect = formats.get(path_format).inspect
    assert inspect is not None  # quick_check detects uploadable formats only
    try:
        inspected = inspect(path, declared, archive_limits())
    except InspectionError as exc:
        raise ArtifactRejected(str(exc)) from None
    signature, definition = inspected.signature, inspected.definition
    example = _example(version, signature)
    memory = 0
    if inspected.needs_trial_run:
        # The trial's note joins what inspection found, in the format's own definition.
        found = _trial_findings(path_format, path, signature, example, version.decoupled)
        memory = found.memory_bytes
        definition = formats.definition_from_json(path_format,
                                                  {**(definition_to_json(definition) or {}), **found.definition})
    batchable = inspected.batchable
    hint = inspected.max_batch_size_hint or formats.DEFAULT_MAX_BATCH_SIZE
    requested = version.declared_max_batch_size
    if requested is not None and requested > 0 and not batchable:
        raise ArtifactRejected(
            f"max_batch_size={requested} needs a batch dimension: the first dimension of every input and output "
            "must be dynamic (-1). Send max_batch_size=0 for a model without one."
        )
    max_batch_size = requested if requested is not None else (hint if batchable else 0)
    return Findings(signature=signature, max_batch_size=max_batch_size, definition=definition, memory_bytes=memory)


def _example(version: ModelVersion, signature: Signature) -> ExampleRequest | None:
    """The version's example request against the signature inspection found (checked at upload against a declared
    one; a format that reads its own signature is checked here); ArtifactRejected naming what does not fit."""
    if version.example_request is None:
        return None
    from django.conf import settings

    try:
        return parse_example_request(version.example_request, signature, settings.EXAMPLE_REQUEST_MAX_BYTES)
    except ExampleRequestError as exc:
        raise ArtifactRejected(f"example_request: {exc}") from None


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
            declared = signature_from_json(version.declared_signature) if version.declared_signature else None
            fmt = quick_check(path, version.original_filename, version.declared_format, declared).format
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
            definition=definition_to_json(findings.definition),
            status=ModelVersion.Status.READY,
            error="",
            validated_at=timezone.now(),
            **_measured(findings.memory_bytes),
        )
    log.info("version %s ready (%s, %s bytes, updated=%s)", version, fmt, size, updated)


def _measured(memory_bytes: int) -> dict[str, Any]:
    """The version's measured memory from its trial call, where it was measured."""
    if memory_bytes <= 0:
        return {}
    return {"measured_memory_bytes": memory_bytes, "measured_memory_by": "its trial call at inspection"}


def inspect_here(version_id: int, wait_seconds: float = 60.0) -> ModelVersion:
    """Inspect a version in this process (a sample the portal installs, a test) rather than wait for a worker; when a
    worker has claimed it already (its task is queued after the commit that created the version, so it can be
    first), wait up to `wait_seconds` for that inspection instead of racing it. The version as it is then."""
    if dispatch.started(version_id):
        inspect_version(version_id)
    deadline = time.monotonic() + wait_seconds
    version = ModelVersion.objects.get(pk=version_id)
    while version.status == ModelVersion.Status.VALIDATING and time.monotonic() < deadline:
        time.sleep(0.1)
        version.refresh_from_db()
    return version


def _mark_invalid(version: ModelVersion, message: str) -> None:
    ModelVersion.objects.filter(pk=version.pk, status=ModelVersion.Status.VALIDATING).update(
        status=ModelVersion.Status.INVALID, error=message, validated_at=timezone.now()
    )
    if version.staged_key:
        get_store().delete(version.staged_key)
    log.info("version %s invalid: %s", version, message)
