"""Imported versions (issue 35): where a version's bytes come from when they are not uploaded.

One module per source kind, each exposing `fetcher`, an object of the `Fetcher` protocol (sources/base.py):
`mlflow` (the operator's MLflow model registry), `huggingface` (a Hugging Face repository through
huggingface_hub), `uri` (s3:// and https:// objects). The worker that runs an import (models_registry/imports.py)
knows only the protocol; the API validates a `source` through `fetcher_for(kind).validate`.
"""

from __future__ import annotations

import importlib

from models_registry.sources.base import Fetcher, SourceForbidden, SourceRefused

# The kinds the API accepts, and the module holding each one's fetcher.
KINDS: dict[str, str] = {
    "mlflow": "models_registry.sources.mlflow",
    "huggingface": "models_registry.sources.huggingface",
    "uri": "models_registry.sources.uri",
}


def fetcher_for(kind: object) -> Fetcher:
    """The fetcher of a source kind; SourceRefused naming the kinds for any other."""
    module = KINDS.get(kind) if isinstance(kind, str) else None
    if module is None:
        shown = repr(kind)[:80]
        raise SourceRefused(f"source.kind must be one of {', '.join(sorted(KINDS))}, got {shown}.")
    try:
        return importlib.import_module(module).fetcher  # type: ignore[no-any-return]
    except ImportError:  # a kind whose fetcher this installation lacks (huggingface_hub not installed)
        raise SourceForbidden(f"Imports of kind {kind!r} are not available on this server.") from None
