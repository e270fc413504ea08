"""The sample models are real: the digits classifier predicts what scikit-learn predicts, the ResNet runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

from models_registry.onnx_inspect import inspect_onnx
from models_registry.samples import (
    DIGITS_SIGNATURE,
    RESNET_SIGNATURE,
    build_digits_onnx,
    build_resnet_onnx,
    digits_holdout,
    make_digits_onnx,
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
    assert [entry["filename"] for entry in listed] == ["digits.onnx", "resnet.onnx"]
    assert listed[0]["signature"] == DIGITS_SIGNATURE.to_json()
    assert listed[1]["signature"] == RESNET_SIGNATURE.to_json()
    readme = (tmp_path / "samples/README.md").read_text()
    assert "`probabilities`: FP32 [-1, 10]" in readme
    for sample in samples:
        path = tmp_path / "samples" / sample.filename
        assert path.stat().st_size == sample.size
        # What the portal reads from each file is what the sample says it is.
        inspection = inspect_onnx(path)
        assert inspection.signature == sample.signature
        assert inspection.has_batch_dim
        assert inspection.problems == []
