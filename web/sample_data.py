"""What Try it prefills for a sample's signature: the held-out digit for the classifier, a sample PNG for a model
that takes images. Page helpers; the sample models themselves are models_registry/samples.py's."""

from __future__ import annotations

from typing import Any

from models_registry.samples import SAMPLE_DIGIT_PIXELS


def sample_inputs(signature: dict[str, Any]) -> dict[str, list[float]]:
    """Data for Try it when the inputs are those of the digits classifier: the held-out 7 instead of zeros."""
    if [(t.get("name"), t.get("datatype"), list(t.get("dims", []))) for t in signature.get("inputs", [])] == [
            ("input", "FP32", [-1, 64])]:
        return {"input": [float(v) for v in SAMPLE_DIGIT_PIXELS]}
    return {}


def takes_images(signature: dict[str, Any]) -> bool:
    """Whether the model takes encoded images, one per row (the pipeline, its preprocess step): a sample PNG of a
    digit is offered for its Try it."""
    return [(t.get("name"), t.get("datatype"), list(t.get("dims", []))) for t in signature.get("inputs", [])] == [
        ("image", "BYTES", [-1, 1])]
