"""Triton python-backend model `minilm-tokenize` of the sentence-embedding pipeline: texts (BYTES [-1, 1]) ->
input_ids, attention_mask, token_type_ids (INT64 [-1, -1]). Zipped as model.py beside minilm_steps.py and the
model's tokenizer.json; needs `tokenizers` in Triton's python environment."""

from __future__ import annotations

import os
from typing import Any

import triton_python_backend_utils as pb_utils
from minilm_steps import load_tokenizer, texts_from_bytes, tokenize


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self.tokenizer = load_tokenizer(os.path.join(os.path.dirname(__file__), "tokenizer.json"))

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            texts = texts_from_bytes(pb_utils.get_input_tensor_by_name(request, "text").as_numpy())
            feed = tokenize(self.tokenizer, texts)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in feed.items()]))
        return responses
