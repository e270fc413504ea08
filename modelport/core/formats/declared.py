"""Inspection for formats whose artifact carries no signature the portal reads: the declared one stands."""

from __future__ import annotations

from pathlib import Path

from modelport.core import archives
from modelport.core.formats.base import Inspected
from modelport.core.signature import Signature


def inspect_declared(path: Path, declared: Signature | None, limits: archives.ArchiveLimits) -> Inspected:
    signature = declared or Signature()
    return Inspected(signature=signature, batchable=signature.has_batch_dim)
