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



def constant_folding_bomb_onnx(side: int) -> bytes:
    """y = x + sum(C @ C) with C = ConstantOfShape([side, side]): a few hundred bytes of standard operators that a
    constant-folding optimizer would evaluate at load (2 * side**3 FLOP, three side x side float tensors)."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    nodes = [
        helper.make_node("Constant", [], ["shape"],
                         value=helper.make_tensor("s", TensorProto.INT64, [2], [side, side])),
        helper.make_node("ConstantOfShape", ["shape"], ["big"],
                         value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])),
        helper.make_node("MatMul", ["big", "big"], ["product"]),
        helper.make_node("ReduceSum", ["product"], ["total"], keepdims=0),
        helper.make_node("Add", ["x", "total"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "bomb", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def constant_of_shape_onnx() -> bytes:
    """y = ConstantOfShape(n): about a hundred bytes of one standard operator that answer as many floats as the
    caller asks for."""
    import onnx
    from onnx import TensorProto, helper

    n = helper.make_tensor_value_info("n", TensorProto.INT64, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["count"])
    node = helper.make_node("ConstantOfShape", ["n"], ["y"],
                            value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]))
    model = helper.make_model(helper.make_graph([node], "shaper", [n], [y]),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def relu_chain_onnx(nodes: int) -> bytes:
    """y = Relu(Relu(...Relu(x))), `nodes` deep: a few MB of standard operators whose session onnxruntime builds for
    seconds (issue 30: 100k nodes, 2.4 MB, loaded in 30 s), computing nothing hostile at load or run."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    names = ["x", *(f"r{i}" for i in range(nodes - 1)), "y"]
    chain = [helper.make_node("Relu", [names[i]], [names[i + 1]]) for i in range(nodes)]
    graph = helper.make_graph(chain, "relus", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def onnx_with_unused_initializer(name: str) -> bytes:
    """y = x (Identity), with an initializer no node uses, named `name`: onnxruntime's warning names it on stderr."""
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    unused = numpy_helper.from_array(np.zeros(1, np.float32), name)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "unused", [x], [y], [unused])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
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


STREAMING_MODEL = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils

OUTPUT = "text_output"


class TritonPythonModel:
    """A decoupled model: for each request, pieces sent one by one through its response sender. The text asks:
    "one" a single piece; "fail" raises after the first; "big" sends a piece of 2 MB; "slow" waits 3 s before its
    second; "misnamed"/"mistyped" (the OUTPUT below) break the signature; anything else 5 pieces 0.2 s apart. It logs
    "stream-test: cancelled" when Triton tells it the caller went away."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            text = text.decode() if isinstance(text, bytes) else str(text)
            # Raising leaves the request to the python backend, which ends it with the exception as an error.
            self.stream(request, sender, text)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def stream(self, request, sender, text):
        count = 1 if text in ("one", "big") else 5
        for index in range(count):
            if request.is_cancelled():
                pb_utils.Logger.log_info(f"stream-test: cancelled after {index} pieces")
                return
            if text == "fail" and index == 1:
                raise RuntimeError("the model failed after its first piece")
            if text == "slow" and index == 1:
                time.sleep(3)
            piece = b"x" * (2 * 1024 * 1024) if text == "big" else f"piece {index}".encode()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor(OUTPUT, np.array([piece], dtype=object))]))
            time.sleep(0.2)
'''

STREAMING_SIGNATURE = {
    "inputs": [{"name": "text_input", "datatype": "BYTES", "dims": [1]}],
    "outputs": [{"name": "text_output", "datatype": "BYTES", "dims": [-1]}],
}


def streaming_python_model_zip(broken: str = "") -> bytes:
    """STREAMING_MODEL; `broken` "misnamed" sends its pieces under another output name, "mistyped" as FP32."""
    source = STREAMING_MODEL
    if broken == "misnamed":
        source = source.replace('OUTPUT = "text_output"', 'OUTPUT = "text"')
    elif broken == "mistyped":
        source = source.replace("np.array([piece], dtype=object)", "np.array([1.0], dtype=np.float32)")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model.py", source)
    return buffer.getvalue()
