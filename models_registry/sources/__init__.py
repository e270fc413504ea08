"""Imported versions (issue 35): where a version's bytes come from when they are not uploaded.

One module per source kind, each exposing `fetcher`, an object of the `Fetcher` protocol (sources/base.py):
`mlflow` (the operator's MLflow model registry), `huggingface` (a Hugging Face repository through
huggingface_hub), `uri` (s3:// and https:// objects). The worker that runs an import (models_registry/imports.py)
knows only the protocol; the API validates a `source` through `fetcher_for(kind).validate`.
"""

from __future__ import annotations

import importlib
import logging
import os

from django.conf import settings

from models_registry.sources.base import Fetcher, SourceRefused

log = logging.getLogger(__name__)

# The kinds the API accepts, and the module holding each one's fetcher.
KINDS: dict[str, str] = {
    "mlflow": "models_registry.sources.mlflow",
    "huggingface": "models_registry.sources.huggingface",
    "uri": "models_registry.sources.uri",
}


def kinds() -> dict[str, str]:
    """KINDS, and under the test settings only (portal/settings_test.py IMPORT_TEST_KINDS) the tests' fake kinds, as
    real modules, so that a worker process started by a test finds them too."""
    # Production settings never define IMPORT_TEST_KINDS; the module check keeps a stray one out of them anyway.
    module = settings.SETTINGS_MODULE or os.environ.get("DJANGO_SETTINGS_MODULE", "")
    extra = getattr(settings, "IMPORT_TEST_KINDS", None) if module == "portal.settings_test" else None
    return {**KINDS, **(extra or {})}


def fetcher_for(kind: str) -> Fetcher:
    """The fetcher of a source kind; SourceRefused naming the kinds for any other, or for one whose module this
    server cannot load (a 400 at the API, never a 500)."""
    known = kinds()
    module = known.get(kind) if isinstance(kind, str) else None
    if module is None:
        raise SourceRefused(f"source.kind must be one of {', '.join(sorted(known))}, got {str(kind)[:80]!r}.")
    try:
        return importlib.import_module(module).fetcher  # type: ignore[no-any-return]
    except (ImportError, AttributeError):
        log.exception("the fetcher of source kind %r could not be loaded", kind)
        raise SourceRefused(f"Imports from {kind!r} are not available on this server (its fetcher could not be "
                            "loaded; the operators' logs say why): upload the model's file instead.") from None
