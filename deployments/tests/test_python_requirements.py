"""Which requirements of a python model a serving environment can import: names mapped to modules, and the real
runtime env asked (its own python and importlib.util.find_spec), once per environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from deployments import python_requirements as pr


@pytest.mark.parametrize(("distribution", "module"), [
    ("pillow", "PIL"), ("Pillow", "PIL"), ("scikit-learn", "sklearn"), ("scikit_learn", "sklearn"),
    ("opencv-python", "cv2"), ("opencv-python-headless", "cv2"), ("PyYAML", "yaml"), ("numpy", "numpy"),
    ("my-package", "my_package"), ("onnxruntime", "onnxruntime"), ("zope.interface", "zope.interface"),
])
def test_a_distribution_maps_to_its_import_name(distribution: str, module: str) -> None:
    assert pr.import_name(distribution) == module


def test_requirement_lines_are_parsed_into_name_module_and_marker() -> None:
    parsed = pr.parse_requirement('scikit-learn[alldeps]>=1.3; python_version >= "3.9"')
    assert parsed == pr.Requirement(line='scikit-learn[alldeps]>=1.3; python_version >= "3.9"',
                                    distribution="scikit-learn", module="sklearn", marker='python_version >= "3.9"')


def test_the_current_interpreter_answers_which_modules_are_missing(tmp_path: Path) -> None:
    pr.clear_cache()
    missing = pr.missing_requirements(Path(sys.executable), tmp_path, [
        "numpy>=1", "no-such-package-here", 'another-missing; python_version < "3.0"', "pillow"])
    assert [r.line for r in missing] == ["no-such-package-here"]


def test_answers_are_cached_until_the_environment_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pr.clear_cache()
    calls: list[Any] = []
    real_run = subprocess.run

    def counting_run(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(pr.subprocess, "run", counting_run)
    site = tmp_path / "site-packages"
    site.mkdir()
    assert pr.missing_requirements(Path(sys.executable), site, ["numpy", "nope-nope"])[0].module == "nope_nope"
    assert pr.missing_requirements(Path(sys.executable), site, ["numpy", "nope-nope"])[0].module == "nope_nope"
    assert len(calls) == 1
    (site / "nope_nope").mkdir()  # a pip install changes the directory
    pr.missing_requirements(Path(sys.executable), site, ["numpy"])
    assert len(calls) == 2


def test_an_interpreter_that_cannot_run_is_reported(tmp_path: Path) -> None:
    with pytest.raises(pr.CheckFailed, match="could not run"):
        pr.missing_requirements(tmp_path / "no-python", tmp_path, ["numpy"])


@pytest.mark.skipif(not (Path(settings.MODELPORT_RUNTIME_ENV) / "bin" / "python").exists(), reason="no runtime env")
def test_the_runtime_env_has_what_the_sample_pipeline_needs_and_not_opencv() -> None:
    from deployments.runtimes.local.runtime import missing_requirements

    pr.clear_cache()
    assert missing_requirements(["numpy", "pillow", "onnxruntime"]) == []
    assert [r.module for r in missing_requirements(["opencv-python>=4", "scikit-learn"])] == ["cv2", "sklearn"]
