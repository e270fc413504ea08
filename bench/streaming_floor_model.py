"""Triton python-backend model of the streaming benchmark's floor (bench/streaming.py, target "floor"): a decoupled
model that generates nothing and sends `max_tokens` fixed pieces per request, interleaved across the requests of a
batch. It has the sample text generator's contract (the other optional inputs are read and ignored), so the same
request reaches it; what it measures is what one response per piece costs on this machine through Triton's python
backend (each `send()` a round trip from the stub process to Triton's) and, through the gateway, its relay: the
most pieces per second any python-backend model could stream here, whatever its step costs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
PIECE = np.array([[b"word "]], dtype=np.object_)  # five bytes, about a piece of the sample's


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> None:
        senders, counts = [], []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "max_tokens")
            counts.append(16 if tensor is None else int(tensor.as_numpy().reshape(-1)[0]))
            senders.append(request.get_response_sender())
        for index in range(max(counts)):
            for sender, count in zip(senders, counts, strict=True):
                if index < count:
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", PIECE)]))
        for sender in senders:
            sender.send(flags=FINAL)
        return None
