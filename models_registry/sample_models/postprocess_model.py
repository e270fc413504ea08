"""Triton python-backend model `postprocess` of the sample pipeline: class scores (FP32 [-1, 10]) -> the top 3
labels (BYTES [-1, 3], "0".."9") and their probabilities (FP32 [-1, 3]). Zipped as model.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

TOP_K = 3


def top_k(scores: np.ndarray, k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """Labels (object array of bytes) and probabilities of the k best classes per row, best first."""
    scores = scores.astype(np.float64)
    looks_like_probabilities = (scores >= 0).all() and np.allclose(scores.sum(axis=1), 1.0, atol=1e-3)
    if not looks_like_probabilities:  # logits: softmax them
        shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
        scores = shifted / shifted.sum(axis=1, keepdims=True)
    best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    labels = np.vectorize(lambda i: str(i).encode(), otypes=[object])(best)
    return labels.astype(np.object_), np.take_along_axis(scores, best, axis=1).astype(np.float32)


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            scores = pb_utils.get_input_tensor_by_name(request, "probabilities").as_numpy()
            labels, probabilities = top_k(scores)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("labels", labels), pb_utils.Tensor("scores", probabilities)]))
        return responses
