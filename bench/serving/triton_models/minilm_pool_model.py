"""Triton python-backend model `minilm-pool` of the sentence-embedding pipeline: the transformer's
last_hidden_state (FP32 [-1, -1, 384]) and the attention_mask -> sentence embeddings (FP32 [-1, 384]), mean
pooled and L2-normalized. Zipped as model.py beside minilm_steps.py."""

from __future__ import annotations

from typing import Any

import triton_python_backend_utils as pb_utils
from minilm_steps import mean_pool


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            hidden = pb_utils.get_input_tensor_by_name(request, "last_hidden_state").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("embedding", mean_pool(hidden, mask))]))
        return responses
