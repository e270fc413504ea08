"""Where a model sits in an archive: the one set of helpers that detection, inspection and rendering share."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from modelport.core import archives


def test_a_marker_at_the_top_level_is_found_there() -> None:
    names = ["model.py", "helpers/util.py"]
    assert archives.model_root(names, "model.py") == ""
    assert archives.marker_path(names, "model.py") == "model.py"


def test_a_marker_in_the_single_top_folder_is_found_there() -> None:
    names = ["m/model.py", "m/requirements.txt"]
    assert archives.single_top_folder(names) == "m"
    assert archives.model_root(names, "model.py") == "m"
    assert archives.marker_path(names, "model.py") == "m/model.py"


def test_a_marker_deeper_or_beside_another_folder_is_not_found() -> None:
    assert archives.model_root(["a/b/model.py"], "model.py") is None
    assert archives.model_root(["a/model.py", "b/other.py"], "model.py") is None
    assert archives.single_top_folder(["a/x", "top.txt"]) is None


def test_finder_clutter_is_not_part_of_the_model() -> None:
    names = ["m/model.py", "__MACOSX/m/._model.py", "m/.DS_Store", ".DS_Store"]
    kept = archives.model_names(names)
    assert kept == ["m/model.py"]
    assert archives.marker_path(kept, "model.py") == "m/model.py"
    assert not archives.is_os_clutter("m/__MACOSX_notes.txt")


def test_an_extracted_archive_finds_its_root_past_the_macos_folder(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.py").write_text("x = 1\n")
    (tmp_path / "__MACOSX").mkdir()
    assert archives.extracted_root(tmp_path, "model.py") == tmp_path / "m"
    (tmp_path / "other").mkdir()
    assert archives.extracted_root(tmp_path, "model.py") is None


def test_a_small_entry_over_its_limit_is_refused_not_truncated(tmp_path: Path) -> None:
    path = tmp_path / "a.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("model.py", b"x" * 100)
    assert archives.read_small_entry(path, "model.py", 100) == b"x" * 100
    with pytest.raises(archives.ArchiveError, match="model.py is larger than 99 bytes"):
        archives.read_small_entry(path, "model.py", 99)
