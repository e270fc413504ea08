"""What an upload refused must leave behind: nothing (a fixture module: nothing here is collected)."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from models_registry.models import Blob, ModelVersion


def stored_files() -> list[Path]:
    root = Path(settings.ARTIFACT_ROOT)
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def assert_nothing_stored() -> None:
    assert not ModelVersion.objects.exists()
    assert not Blob.objects.exists()
    assert stored_files() == []
