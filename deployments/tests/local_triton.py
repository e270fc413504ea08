"""A real local Triton for the tests that start one (a fixture module: nothing here is collected): the runtime env,
small ONNX and python models, a pipeline of them, and the clients that load them."""

from __future__ import annotations

import asyncio
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnx
import pytest
import tritonclient.http as triton_http
from onnx import TensorProto, helper, numpy_helper

from deployments.render import render_repository
from deployments.runtimes.local import backends, readiness
from deployments.runtimes.local import triton as lt
from deployments.spec import DynamicBatching, EnsembleStep, InstanceGroup, RepositorySpec, ServedModel
from deployments.tests.values import steps
from modelport.core.runtime_env import RuntimeEnv, find_runtime_env
from modelport.core.signature import Signature, Tensor

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNTIME_ENV = Path(os.environ.get("MODELPORT_RUNTIME_ENV", str(REPO_ROOT / "var" / "runtime-env")))


W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
TABLE = np.arange(20, dtype=np.float32).reshape(10, 2)

DOUBLE_MODEL_PY = b"""import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", (x * 2).astype(np.float32))]))
        return responses
"""


def runtime_env() -> RuntimeEnv:
    if not RUNTIME_ENV.is_dir():
        pytest.skip(
            f"no runtime env at {RUNTIME_ENV}: create it from requirements-runtime.txt or set MODELPORT_RUNTIME_ENV"
        )
    return find_runtime_env(RUNTIME_ENV)


def save_onnx(path: Path, nodes: list[Any], inputs: list[Any], outputs: list[Any], weights: dict[str, Any]) -> Path:
    graph = helper.make_graph(
        nodes, path.stem, inputs, outputs, [numpy_helper.from_array(v, k) for k, v in weights.items()]
    )
    # IR 8 / opset 13: old enough for any onnxruntime the runtime env may hold.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def matmul_onnx(path: Path, batch: str | int = "N") -> Path:
    return save_onnx(
        path,
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
        {"W": W},
    )


def batched(*tensors: tuple[str, str, tuple[int, ...]]) -> tuple[Tensor, ...]:
    return tuple(Tensor(name, dtype, dims) for name, dtype, dims in tensors)


MATMUL_SIG = Signature(inputs=batched(("x", "FP32", (-1, 4))), outputs=batched(("y", "FP32", (-1, 3))))


def onnx_model(name: str, artifact: Path, signature: Signature = MATMUL_SIG, **changes: Any) -> ServedModel:
    settings: dict[str, Any] = {
        "max_batch_size": 8,
        "dynamic_batching": DynamicBatching(max_queue_delay_microseconds=10_000),
        "instance_group": InstanceGroup(count=1),
    }
    settings.update(changes)
    return ServedModel(name=name, version=1, format="onnx", signature=signature, artifact_path=artifact, **settings)


def pipeline_spec(artifacts: Path) -> tuple[ServedModel, ...]:
    """add_one (ONNX) -> double (python model) chained as the ensemble `pipeline`: y = (x + 1) * 2."""
    add_one = save_onnx(
        artifacts / "add_one.onnx",
        [helper.make_node("Add", ["x", "one"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        {"one": np.ones((1, 4), dtype=np.float32)},
    )
    double_zip = artifacts / "double.zip"
    with zipfile.ZipFile(double_zip, "w") as zf:
        zf.writestr("model.py", DOUBLE_MODEL_PY)
    vector4 = Signature(inputs=batched(("x", "FP32", (-1, 4))), outputs=batched(("y", "FP32", (-1, 4))))
    return (
        onnx_model("add_one", add_one, vector4, response_cache=True),
        ServedModel(
            name="double",
            version=1,
            format="python",
            signature=vector4,
            max_batch_size=8,
            dynamic_batching=DynamicBatching(),
            artifact_path=double_zip,
        ),
        ServedModel(
            name="pipeline",
            version=1,
            format="ensemble",
            signature=vector4,
            max_batch_size=8,
            dynamic_batching=None,
            definition=steps((
                EnsembleStep("add_one", 1, {"x": "x"}, {"y": "plus_one"}),
                EnsembleStep("double", 1, {"x": "plus_one"}, {"y": "y"}),
            )),
        ),
    )


def start(env: RuntimeEnv, spec: RepositorySpec, workdir: Path, **kwargs: Any) -> lt.ServerProcess:
    render_repository(spec, "local", workdir / "repo")
    backend_dir = backends.build_backend_dir(env, workdir / "var")
    return lt.start_server(workdir / "repo", workdir / "var" / "triton.log", env, backend_dir, **kwargs)


def infer(server: lt.ServerProcess, model: str, inputs: dict[str, np.ndarray], output: str) -> np.ndarray:
    client = triton_http.InferenceServerClient(f"{server.host}:{server.http_port}")
    try:
        request = []
        for name, array in inputs.items():
            tensor = triton_http.InferInput(name, list(array.shape), "INT64" if array.dtype == np.int64 else "FP32")
            tensor.set_data_from_numpy(array)
            request.append(tensor)
        result: np.ndarray = client.infer(model, request).as_numpy(output)
        return result
    finally:
        client.close()  # an open keep-alive connection would hold Triton's shutdown for its exit timeout


def infer_payload(name: str, array: np.ndarray, datatype: str = "FP32") -> dict[str, Any]:
    return {
        "inputs": [{"name": name, "shape": list(array.shape), "datatype": datatype, "data": array.ravel().tolist()}]
    }


async def post_all(
    server: lt.ServerProcess, requests: list[tuple[str, dict[str, Any]]], workers: int
) -> list[tuple[int, dict[str, Any]]]:
    """Send (model, payload) requests from `workers` closed-loop clients; answers in request order.

    aiohttp rather than tritonclient's async_infer, which did not put concurrent load on the server.
    """
    results: list[tuple[int, dict[str, Any]]] = [(0, {})] * len(requests)
    queue = list(enumerate(requests))

    async def worker(session: aiohttp.ClientSession) -> None:
        while queue:
            index, (model, payload) = queue.pop(0)
            async with session.post(f"{server.http_url}/v2/models/{model}/infer", json=payload) as response:
                text = await response.text()
                try:
                    results[index] = (response.status, json.loads(text))
                except ValueError:
                    results[index] = (response.status, {"error": text})

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(workers)))
    return results


def batch_counts(server: lt.ServerProcess, model: str) -> dict[int, int]:
    stats = readiness.model_stats(server, model)
    return {int(s["batch_size"]): int(s["compute_infer"]["count"]) for s in stats["batch_stats"]}  # type: ignore[attr-defined]


def output_of(answer: dict[str, Any], name: str) -> np.ndarray:
    (out,) = [o for o in answer["outputs"] if o["name"] == name]
    return np.array(out["data"], dtype=np.float32).reshape(out["shape"])
