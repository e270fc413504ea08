"""The stored artifacts of a revision as local files, for the renderer: shared by every runtime (the local one
renders into var/, the Kubernetes one renders into a scratch directory before it uploads to S3)."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from django.conf import settings

from models_registry.models import Blob
from models_registry.storage import FilesystemStore, get_store


def artifact_path(sha256: str) -> Path:
    """A local file holding the blob: the store's own file, or a cached download from S3."""
    store = get_store()
    key = Blob.key_for(sha256)
    if isinstance(store, FilesystemStore):
        return store.path(key)
    cached = Path(settings.VAR_DIR) / "cache" / "blobs" / sha256
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        # A name of its own: two workers may render revisions of the same model at once.
        tmp = cached.with_name(f".{sha256}.{os.getpid()}-{secrets.token_hex(4)}.part")
        try:
            with store.open(key) as source, open(tmp, "wb") as out:
                shutil.copyfileobj(source, out, 1024 * 1024)
            tmp.replace(cached)
        finally:
            tmp.unlink(missing_ok=True)
    return cached
