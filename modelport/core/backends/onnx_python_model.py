"""Triton python-backend model that serves an ONNX file with onnxruntime.

The renderer copies this file as `<model>/<version>/model.py` beside `model.onnx` and triton_batching.py when the
target runtime has no onnxruntime backend (the local tritonserver from nvidia-pytriton has only the python backend).
It runs inside the runtime env (numpy<2, onnxruntime), never in the portal's virtualenv, so it imports nothing from
the portal. Batching and per-request errors: triton_batching.BatchedModel.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
from triton_batching import BatchedModel


def _onnx_dims(shape: list[Any]) -> list[int]:
    # onnxruntime gives symbolic dimensions as strings or None; treat them as dynamic.
    return [d if isinstance(d, int) and d > 0 else -1 for d in shape]


class TritonPythonModel(BatchedModel):
    artifact = "model.onnx"

    def load(self, path: str, threads: int) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Constant folding evaluates, while the session is built, every node whose inputs are constants: a few
        # hundred bytes of standard operators (ConstantOfShape [n, n], then MatMul) are minutes of CPU and GBs at
        # load, inside a Triton that may be a pool shared by several teams, under its lock. Unfolded, such nodes
        # cost only at inference, where the caller pays (exporters such as torch.onnx fold constants already).
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"],
                                            disabled_optimizers=["ConstantFolding"])

        onnx_inputs = {i.name: i for i in self.session.get_inputs()}
        onnx_outputs = {o.name for o in self.session.get_outputs()}
        missing_in = [name for name, _, _ in self.inputs if name not in onnx_inputs]
        missing_out = [name for name, _, _ in self.outputs if name not in onnx_outputs]
        if missing_in or missing_out:
            # Raised here the message becomes Triton's "failed to load" error, which the portal shows.
            raise pb_utils.TritonModelException(
                f"the signature does not match the ONNX file: inputs {missing_in} / outputs {missing_out} not in "
                f"the model (it has inputs {sorted(onnx_inputs)} and outputs {sorted(onnx_outputs)})"
            )
        self.string_inputs: set[str] = set()
        for name, full in self.expected.items():
            onnx_dims = _onnx_dims(onnx_inputs[name].shape)
            if len(onnx_dims) == len(full):
                self.expected[name] = [c if c != -1 else o for c, o in zip(full, onnx_dims, strict=True)]
            if onnx_inputs[name].type == "tensor(string)":
                self.string_inputs.add(name)

    def prepare_input(self, name: str, array: np.ndarray) -> np.ndarray:
        if name in self.string_inputs and array.dtype == np.object_:
            return np.vectorize(lambda v: v.decode("utf-8") if isinstance(v, bytes) else v, otypes=[object])(array)
        return array

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, Any]:
        names = [name for name, _, _ in self.outputs]
        values = self.session.run(names, feed)
        return dict(zip(names, values, strict=True))

    def invalid_argument(self, exc: Exception) -> bool:
        # onnxruntime raises InvalidArgument for bad input values (an index out of range, say).
        return type(exc).__name__ == "InvalidArgument"

    def finalize(self) -> None:
        self.session = None
