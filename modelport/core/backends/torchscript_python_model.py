"""Triton python-backend model that serves a TorchScript file with torch.jit.

The renderer copies this file as `<model>/<version>/model.py` beside `model.pt`, triton_batching.py and
torchscript_io.py for the local runtime, whose tritonserver has no libtorch backend. It runs inside the runtime
env (with the `torch` extra), never in the portal's virtualenv. Batching and per-request errors:
triton_batching.BatchedModel; how the module is called: torchscript_io.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torchscript_io
import triton_python_backend_utils as pb_utils
from triton_batching import BatchedModel

# numpy has no bfloat16 and torch no string tensors: Triton's python backend cannot hand these to the module.
_UNSUPPORTED = {"TYPE_STRING": "BYTES", "TYPE_BF16": "BF16"}


class TritonPythonModel(BatchedModel):
    artifact = "model.pt"

    def load(self, path: str, threads: int) -> None:
        unsupported = [f"'{name}' ({_UNSUPPORTED[t]})"
                       for name, _, t in self.inputs + self.outputs if t in _UNSUPPORTED]
        if unsupported:
            raise pb_utils.TritonModelException(
                f"TorchScript models served locally take numeric tensors; not {', '.join(unsupported)}"
            )
        torchscript_io.set_threads(threads)
        self.module = torchscript_io.load(path)
        self.input_names = [name for name, _, _ in self.inputs]
        self.output_names = [name for name, _, _ in self.outputs]
        try:
            self.keyword = torchscript_io.by_keyword(self.module, self.input_names)
        except torchscript_io.CallError as exc:
            raise pb_utils.TritonModelException(str(exc)) from None

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, Any]:
        return torchscript_io.call(self.module, self.keyword, self.input_names, self.output_names, feed)

    def finalize(self) -> None:
        self.module = None
