"""The sample models are real: the digits classifier predicts what scikit-learn predicts, the ResNet runs."""

from __future__ import annotations

import importlib
import io
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from modelport.core.formats.onnx_inspect import inspect_onnx
from modelport.core.formats.python import inspect_python_archive
from modelport.core.signature import parse_signature
from models_registry.samples import (
    DIGITS_SIGNATURE,
    POSTPROCESS_SIGNATURE,
    PREPROCESS_SIGNATURE,
    RESNET_SIGNATURE,
    SAMPLE_CODE_DIR,
    build_digits_onnx,
    build_preprocess_zip,
    build_resnet_onnx,
    digits_holdout,
    digits_png,
    make_digits_onnx,
    make_digits_pipeline_json,
    make_postprocess_zip,
    make_preprocess_zip,
    make_resnet_onnx,
    train_digits_classifier,
    write_samples,
)


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_digits_onnx_predicts_what_sklearn_predicts_on_the_holdout(tmp_path: Path) -> None:
    sample = make_digits_onnx(tmp_path / "digits.onnx")
    X, y = digits_holdout()
    assert X.shape == (360, 64) and X.dtype == np.float32
    label, probabilities = session(tmp_path / "digits.onnx").run(["label", "probabilities"], {"input": X})
    pipeline = train_digits_classifier()
    np.testing.assert_array_equal(label, pipeline.predict(X))
    np.testing.assert_allclose(probabilities, pipeline.predict_proba(X), atol=1e-5)
    accuracy = float((label == y).mean())
    assert accuracy > 0.9
    assert sample.details["holdout_accuracy"] == round(accuracy, 4)


def test_digits_onnx_answers_a_single_image(tmp_path: Path) -> None:
    make_digits_onnx(tmp_path / "digits.onnx")
    X, _ = digits_holdout()
    label, probabilities = session(tmp_path / "digits.onnx").run(None, {"input": X[:1]})
    assert label.shape == (1,) and label.dtype == np.int64
    assert probabilities.shape == (1, 10) and abs(float(probabilities.sum()) - 1.0) < 1e-5


def test_resnet_runs_with_batch_1_and_4(tmp_path: Path) -> None:
    sample = make_resnet_onnx(tmp_path / "resnet.onnx")
    images = np.random.default_rng(0).random((4, 3, 64, 64), dtype=np.float32)
    resnet = session(tmp_path / "resnet.onnx")
    (batch_of_4,) = resnet.run(["logits"], {"input": images})
    (batch_of_1,) = resnet.run(["logits"], {"input": images[:1]})
    assert batch_of_4.shape == (4, 10) and batch_of_1.shape == (1, 10)
    assert np.isfinite(batch_of_4).all()
    np.testing.assert_allclose(batch_of_1[0], batch_of_4[0], rtol=1e-4, atol=1e-5)
    assert not np.allclose(batch_of_4[0], batch_of_4[1])  # different images, different answers
    assert 5_000_000 < sample.details["flops_per_image"] < 100_000_000


def test_the_samples_are_reproducible_byte_for_byte() -> None:
    # Content-addressed storage keeps identical uploads once: the same sample must be the same bytes.
    first = build_digits_onnx().SerializeToString()
    train_digits_classifier.cache_clear()  # train again, not just convert again
    assert build_digits_onnx().SerializeToString() == first
    assert build_resnet_onnx()[0].SerializeToString() == build_resnet_onnx()[0].SerializeToString()


def test_write_samples_lists_what_it_wrote_with_signatures(tmp_path: Path) -> None:
    samples = write_samples(tmp_path / "samples")
    listed = json.loads((tmp_path / "samples/samples.json").read_text())
    assert [entry["filename"] for entry in listed] == [
        "digits.onnx", "resnet.onnx", "preprocess.zip", "postprocess.zip", "digits-pipeline.json", "textgen.zip"]
    assert listed[0]["signature"] == DIGITS_SIGNATURE.to_json()
    assert listed[1]["signature"] == RESNET_SIGNATURE.to_json()
    readme = (tmp_path / "samples/README.md").read_text()
    assert "`probabilities`: FP32 [-1, 10]" in readme
    for sample in samples:
        path = tmp_path / "samples" / sample.filename
        assert path.stat().st_size == sample.size
        if sample.format != "onnx":
            continue  # the pipeline's samples: tests below
        # What the portal reads from each file is what the sample says it is.
        inspection = inspect_onnx(path)
        assert inspection.signature == sample.signature
        assert inspection.has_batch_dim
        assert inspection.problems == []


# --- the digits pipeline's samples -----------------------------------------------------------------------------


def _sample_module(name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A python-backend sample module imported in this process, with a stand-in for Triton's utils module."""
    monkeypatch.syspath_prepend(str(SAMPLE_CODE_DIR))
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)


def test_png_digits_preprocessed_give_the_classifiers_predictions_on_the_raw_features(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    digit_image = _sample_module("digit_image", monkeypatch)
    X, y = digits_holdout()
    images = digits_png(X)
    assert all(png.startswith(b"\x89PNG") for png in images)
    features = np.stack([digit_image.digit_features(png) for png in images])
    assert features.shape == (360, 64) and features.dtype == np.float32
    assert np.abs(features - X).max() < 0.05  # 8-bit grey levels: within 16/255 of the dataset's counts
    classifier = train_digits_classifier()
    agreement = float((classifier.predict(features) == classifier.predict(X)).mean())
    assert agreement >= 0.99
    assert float((classifier.predict(features) == y).mean()) >= 0.9


def test_preprocess_reads_light_ink_on_dark_jpegs_and_transparent_pngs(monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    digit_image = _sample_module("digit_image", monkeypatch)
    X, _ = digits_holdout()
    ink = np.kron(X[0].reshape(8, 8) / 16.0, np.ones((8, 8)))  # 64x64
    light_on_dark = Image.fromarray(np.round(ink * 255).astype(np.uint8)).convert("RGB")
    jpeg = io.BytesIO()
    light_on_dark.save(jpeg, format="JPEG", quality=95)
    assert np.abs(digit_image.digit_features(jpeg.getvalue()) - X[0]).max() < 1.0
    alpha = Image.new("LA", (64, 64))
    alpha.putdata([(0, int(round(v * 255))) for v in ink.reshape(-1)])  # black ink, transparency as paper
    png = io.BytesIO()
    alpha.save(png, format="PNG")
    assert np.abs(digit_image.digit_features(png.getvalue()) - X[0]).max() < 0.05
    # The caller's mistake, in words about their input (the step answers it with INVALID_ARG: a 400), never
    # Pillow's "cannot identify image file <_io.BytesIO object at 0x...>".
    with pytest.raises(digit_image.NotAnImage,
                       match=r"^the input 'image' is not an image file \(PNG, JPEG, \.\.\.\): 12 bytes") as bad:
        digit_image.digit_features(b"not an image")
    assert "0x" not in str(bad.value) and "BytesIO" not in str(bad.value)
    with pytest.raises(digit_image.NotAnImage, match="truncated or corrupt"):
        digit_image.digit_features(png.getvalue()[:80])


def test_postprocess_gives_the_top_3_labels_as_strings_with_their_probabilities(
        monkeypatch: pytest.MonkeyPatch) -> None:
    postprocess = _sample_module("postprocess_model", monkeypatch)
    probabilities = np.array([[0.05, 0.1, 0.6, 0.05, 0, 0, 0, 0, 0.2, 0]], dtype=np.float32)
    labels, scores = postprocess.top_k(probabilities)
    assert labels.tolist() == [[b"2", b"8", b"1"]] and labels.dtype == np.object_
    np.testing.assert_allclose(scores, [[0.6, 0.2, 0.1]], atol=1e-6)
    logits = np.log(probabilities.astype(np.float64) + 1e-9) + 3.0  # not probabilities: softmax first
    labels, scores = postprocess.top_k(logits)
    assert labels.tolist() == [[b"2", b"8", b"1"]]
    np.testing.assert_allclose(scores, [[0.6, 0.2, 0.1]], atol=1e-4)


def test_the_pipeline_samples_are_reproducible_and_inspect_as_python_models(tmp_path: Path) -> None:
    assert build_preprocess_zip() == build_preprocess_zip()
    sample = make_preprocess_zip(tmp_path / "preprocess.zip")
    info = inspect_python_archive(tmp_path / "preprocess.zip")
    assert info.files == ["digit_image.py", "model.py", "requirements.txt"]
    assert info.requirements == ["numpy", "pillow"]
    written = parse_signature((tmp_path / "preprocess.signature.json").read_text())
    assert written == PREPROCESS_SIGNATURE == sample.signature
    make_postprocess_zip(tmp_path / "postprocess.zip")
    assert inspect_python_archive(tmp_path / "postprocess.zip").requirements == ["numpy"]
    assert parse_signature((tmp_path / "postprocess.signature.json").read_text()) == POSTPROCESS_SIGNATURE
    make_digits_pipeline_json(tmp_path / "digits-pipeline.json")
    definition = json.loads((tmp_path / "digits-pipeline.json").read_text())
    assert [step["model"] for step in definition["steps"]] == ["preprocess", "digits", "postprocess"]
    assert definition["inputs"] == [{"name": "image", "datatype": "BYTES", "dims": [-1, 1]}]


# --- the CNN in the other formats (written by the runtime env's frameworks) ------------------------------------


def _runtime_python() -> Path:
    from django.conf import settings

    return Path(settings.MODELPORT_RUNTIME_ENV) / "bin" / "python"


@pytest.mark.frameworks
def test_with_the_frameworks_the_cnn_is_also_written_as_torchscript_and_as_a_savedmodel(tmp_path: Path) -> None:
    from modelport.core.formats import detect_format
    from modelport.core.formats.savedmodel_inspect import inspect_savedmodel_archive

    samples = write_samples(tmp_path, runtime_python=_runtime_python(), frameworks={"torch": "x", "tensorflow": "y"})
    listed = json.loads((tmp_path / "samples.json").read_text())
    assert [(e["filename"], e["format"]) for e in listed][-2:] == [
        ("resnet.pt", "torchscript"), ("resnet.savedmodel.zip", "tensorflow_savedmodel")]
    assert all(s.signature == RESNET_SIGNATURE for s in samples if s.filename.startswith("resnet"))
    # The portal recognises both, reads the SavedModel's signature, and has the TorchScript's to upload with it.
    assert detect_format(tmp_path / "resnet.pt") == "torchscript"
    assert detect_format(tmp_path / "resnet.savedmodel.zip") == "tensorflow_savedmodel"
    assert inspect_savedmodel_archive(tmp_path / "resnet.savedmodel.zip").signature == RESNET_SIGNATURE
    assert parse_signature((tmp_path / "resnet.signature.json").read_text()) == RESNET_SIGNATURE
    assert "resnet.pt (torchscript)" in (tmp_path / "README.md").read_text()


@pytest.mark.frameworks("torch")
def test_an_export_whose_scores_differ_from_resnet_onnx_is_refused(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from models_registry import samples

    real = samples.resnet_onnx_scores
    monkeypatch.setattr(samples, "resnet_onnx_scores", lambda images: real(images) + 0.01)
    with pytest.raises(samples.ExportFailed, match="the torchscript CNN's scores differ from resnet.onnx's by up to"):
        samples.make_resnet_framework_models(tmp_path, _runtime_python(), {"torch"})
    assert not (tmp_path / "resnet.pt").exists()


def test_without_a_framework_no_other_format_is_written(tmp_path: Path) -> None:
    from models_registry.samples import make_resnet_framework_models

    assert make_resnet_framework_models(tmp_path, Path("/nonexistent/python"), {"jax"}) == []
    assert list(tmp_path.iterdir()) == []


def test_make_sample_models_runs_on_a_fresh_checkout_without_a_secret_key(tmp_path: Path) -> None:
    """A newcomer's `make samples` before any `make run`: no var/secret_key, no SECRET_KEY. Writing sample files
    needs neither (the system checks used to refuse it with "SECRET_KEY is not set")."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "SECRET_KEY_FILE", "DJANGO_SETTINGS_MODULE")}
    env |= {"MODELPORT_VAR_DIR": str(tmp_path / "var"), "MODELPORT_RUNTIME_ENV": str(tmp_path / "no-runtime-env")}
    manage = Path(__file__).resolve().parents[2] / "manage.py"
    result = subprocess.run([sys.executable, str(manage), "make_sample_models", str(tmp_path / "samples")], env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "samples" / "digits.onnx").is_file()
    assert not (tmp_path / "var" / "secret_key").exists()  # nothing written beside what was asked for
