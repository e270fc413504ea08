"""Small real artifacts built in-process for tests."""

from __future__ import annotations

import io
import zipfile

import numpy as np


def tiny_onnx(batch: bool = True, in_features: int = 4, out_features: int = 3) -> bytes:
    """y = x @ W (+ b): a real ONNX model with a dynamic batch dimension."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = numpy_helper.from_array(rng.standard_normal((in_features, out_features)).astype(np.float32), "W")
    first = "batch" if batch else 1
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [first, in_features])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [first, out_features])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "tiny", [x], [y], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


PYTHON_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", (x * 2).astype(np.float32))]))
        return responses
'''


def python_model_zip(extra: dict[str, bytes] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model.py", PYTHON_MODEL)
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
    return buffer.getvalue()


PYTHON_SIGNATURE = {
    "inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}],
    "outputs": [{"name": "y", "datatype": "TYPE_FP32", "dims": [-1, 4]}],
}


SLEEPY_MODEL = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sleeps as many seconds as it is asked to: a stand-in for a slow model."""

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "seconds").as_numpy()
            time.sleep(float(seconds.max()))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("slept", seconds.astype(np.float32))]))
        return responses
'''


def sleepy_python_model_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model.py", SLEEPY_MODEL)
    return buffer.getvalue()
