"""Triton python-backend model `preprocess` of the sample pipeline: encoded images (BYTES [-1, 1]) -> the
classifier's input (FP32 [-1, 64]). Zipped as model.py with its helper module digit_image.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from digit_image import NotAnImage, digit_features


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "image").as_numpy()
            try:
                rows = [digit_features(bytes(item)) for item in images.reshape(-1)]
            except NotAnImage as exc:
                # The caller's mistake: INVALID_ARG makes Triton (and the gateway) answer 400, in words about the
                # input. Any other exception is the model's own fault and stays a 500 that shows nothing of it.
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            features = np.stack(rows).astype(np.float32) if rows else np.zeros((0, 64), np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("input", features)]))
        return responses
