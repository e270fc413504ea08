"""The registry of formats: each format is registered once by its own module, says how each target serves it, and
detects, inspects and lays out the sample models; hostile archives are refused the same way through it."""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

import pytest

from modelport.core import archives, formats
from modelport.core.definitions import PythonDefinition
from modelport.core.formats import base
from models_registry.samples import sample_artifacts
from models_registry.tests.format_artifacts import TRITON_MODEL_PY, torchscript_entries, zip_of

NO_LIMITS = archives.DEFAULT_LIMITS


def test_every_format_is_registered_once_by_its_module() -> None:
    assert formats.REGISTRY == base.REGISTERED
    assert list(formats.REGISTRY) == ["onnx", "torchscript", "tensorflow_savedmodel", "tensorrt_plan", "python",
                                      "tnn", "ensemble"]
    for name, fmt in formats.REGISTRY.items():
        assert fmt.name == name
    for column in ("label", "short_label", "plural", "description"):
        values = [getattr(f, column) for f in formats.REGISTRY.values()]
        assert len(values) == len(set(values)), column


def test_registering_a_name_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="'onnx' is registered twice"):
        base.register(formats.get("onnx"))
    assert formats.REGISTRY == base.REGISTERED


def test_every_uploadable_format_can_be_inspected_and_rendered() -> None:
    for fmt in formats.REGISTRY.values():
        if fmt.name == formats.ENSEMBLE:
            assert not fmt.uploadable and fmt.write_artifact is None and fmt.inspect is None
            continue
        assert fmt.uploadable and fmt.inspect is not None and fmt.write_artifact is not None, fmt.name


def test_every_format_says_how_each_target_serves_it() -> None:
    for fmt in formats.REGISTRY.values():
        # Kubernetes: a platform or backend of the official image, or the operator's custom backend.
        assert fmt.native.platform or fmt.native.backend or fmt.native.custom, fmt.name
        # Local: a python-backend wrapper, the python backend itself, a pipeline, or a reason it cannot.
        local = fmt.local
        assert (local.wrapper is not None) + bool(local.refused) <= 1, fmt.name
        if local.wrapper is not None:
            assert local.wrapper.is_file() and all(m.is_file() for m in local.modules)
        else:
            assert local.refused or fmt.native.backend == "python" or fmt.native.platform == "ensemble", fmt.name


def test_single_files_are_tried_most_specific_first() -> None:
    assert [f.name for f in formats._FILE_DETECTORS] == ["tensorrt_plan", "onnx"]
    assert [f.name for f in formats._ARCHIVE_DETECTORS] == ["torchscript", "python", "tensorflow_savedmodel", "tnn"]


@pytest.mark.parametrize("which", ["digits", "pipeline"])
def test_the_sample_models_are_detected_as_what_they_are(tmp_path: Path, which: str) -> None:
    for sample in sample_artifacts(which):
        path = tmp_path / sample.filename
        path.write_bytes(sample.data)
        assert formats.detect_format(path) == sample.format
        formats.check_declared_format(sample.format, formats.detect_format(path))


def test_a_sample_round_trips_through_detect_inspect_and_layout(tmp_path: Path) -> None:
    """The python sample: detected, inspected (requirements read) and laid out as Triton wants it."""
    preprocess = next(s for s in sample_artifacts("pipeline") if s.name == "preprocess")
    path = tmp_path / preprocess.filename
    path.write_bytes(preprocess.data)
    fmt = formats.get(formats.detect_format(path) or "")
    assert fmt.inspect is not None and fmt.write_artifact is not None
    inspected = fmt.inspect(path, preprocess.signature, NO_LIMITS)
    assert inspected.signature == preprocess.signature
    assert isinstance(inspected.definition, PythonDefinition)
    version_dir = tmp_path / "repo" / "preprocess" / "1"
    version_dir.mkdir(parents=True)
    fmt.write_artifact(path, version_dir, tmp_path / "scratch", NO_LIMITS)
    assert (version_dir / "model.py").is_file()


def test_the_digits_sample_is_inspected_through_its_format(tmp_path: Path) -> None:
    digits = sample_artifacts("digits")[0]
    path = tmp_path / digits.filename
    path.write_bytes(digits.data)
    inspected = formats.get("onnx").inspect(path, None, NO_LIMITS)  # type: ignore[misc]
    assert inspected.batchable
    assert [t.name for t in inspected.signature.inputs] == ["input"]


def test_a_hostile_archive_is_refused_the_same_way_by_detection_and_layout(tmp_path: Path) -> None:
    climbing = zip_of(tmp_path / "climb.zip", {"model.py": TRITON_MODEL_PY, "../evil.py": b""})
    with pytest.raises(archives.ArchiveError) as detected:
        formats.detect_format(climbing)
    with pytest.raises(archives.ArchiveError) as checked:
        archives.check_archive(climbing, NO_LIMITS)
    assert str(detected.value) == str(checked.value)
    assert "outside the archive" in str(detected.value)
    python_layout = formats.get("python").write_artifact
    assert python_layout is not None
    with pytest.raises(formats.LayoutError, match="the archive cannot be extracted: .*outside the archive"):
        python_layout(climbing, tmp_path / "v", tmp_path / "scratch", NO_LIMITS)
    assert not (tmp_path / "evil.py").exists()


def test_a_link_in_a_tar_is_refused_by_detection(tmp_path: Path) -> None:
    path = tmp_path / "link.tar"
    with tarfile.open(path, "w") as archive:
        info = tarfile.TarInfo("model.py")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        archive.addfile(info)
    with pytest.raises(archives.ArchiveError, match="link"):
        formats.detect_format(path)


def test_a_torchscript_zip_holding_a_model_py_is_still_torchscript(tmp_path: Path) -> None:
    entries = {**torchscript_entries(), "model/code/model.py": TRITON_MODEL_PY}
    assert formats.detect_format(zip_of(tmp_path / "ts.zip", entries)) == formats.TORCHSCRIPT


def test_a_bomb_is_refused_by_detection_with_the_real_limits(tmp_path: Path) -> None:
    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("m/saved_model.pb", bytes(4 * 1024 * 1024))
    small = archives.ArchiveLimits(max_entries=10, max_total_size=1024 * 1024, max_ratio=10)
    with pytest.raises(archives.ArchiveError):
        formats.detect_format(path, limits=small)
    assert formats.detect_format(path) == formats.SAVEDMODEL  # listing alone does not decompress anything
