"""TorchScript and SavedModels on the real local Triton, through the generated python-backend models.

The models are real: the sample CNN written by export_resnet.py with resnet.onnx's weights, and small lookup
models built here, all by the runtime env's torch and tensorflow (the portal's own environment has neither).
Marked `frameworks`: they need `make runtime-env RUNTIME_EXTRAS=torch,tensorflow`, which `make test` runs.
"""

from __future__ import annotations

import asyncio
import subprocess
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from deployments.render import render_repository
from deployments.runtimes.local import backends, readiness, serverlog
from deployments.runtimes.local import triton as lt
from deployments.spec import DynamicBatching, InstanceGroup, RepositorySpec, ServedModel
from deployments.tests.local_triton import batch_counts, infer_payload, output_of, post_all, runtime_env
from modelport.core.definitions import SavedModelDefinition
from modelport.core.runtime_env import RuntimeEnv
from modelport.core.signature import Signature, Tensor
from models_registry.samples import (
    RESNET_ATOL,
    RESNET_RTOL,
    RESNET_SIGNATURE,
    make_resnet_framework_models,
    make_resnet_onnx,
    resnet_inputs,
    resnet_onnx_scores,
)

pytestmark = [pytest.mark.triton, pytest.mark.frameworks]

TABLE = np.arange(20, dtype=np.float32).reshape(10, 2)
LOOKUP_SIG = Signature(
    inputs=(Tensor("positions", "INT64", (-1, 1)),),
    outputs=(Tensor("rows", "FP32", (-1, 1, 2)), Tensor("echo", "INT64", (-1, 1))),
)
TF_LOOKUP_SIG = Signature(inputs=(Tensor("ids", "INT64", (-1, 1)),), outputs=(Tensor("rows", "FP32", (-1, 1, 2)),))

# Built in the runtime env: a TorchScript whose forward() names its argument `ids` (the signature says `positions`:
# passed by position) and returns a dict; a SavedModel doing the same lookup with tf.gather.
BUILD_LOOKUPS = """
import sys
import numpy as np
import tensorflow as tf
import torch

table = np.arange(20, dtype=np.float32).reshape(10, 2)

class Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.from_numpy(table), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"rows": torch.nn.functional.embedding(ids, self.table), "echo": ids}

torch.jit.save(torch.jit.script(Lookup()), sys.argv[1])

class TfLookup(tf.Module):
    def __init__(self):
        super().__init__()
        self.table = tf.Variable(table)

    @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.int64)])
    def serve(self, ids):
        return {"rows": tf.gather(self.table, ids)}

m = TfLookup()
tf.saved_model.save(m, sys.argv[2], signatures={"serving_default": m.serve})
"""


def in_runtime_env(env: RuntimeEnv, code: str, workdir: Path, *args: str) -> None:
    script = workdir / "build.py"  # a file, not -c: torch.jit.script reads the module's source
    script.write_text(textwrap.dedent(code))
    done = subprocess.run([str(env.bin_dir / "python"), str(script), *args], capture_output=True, text=True,
                          timeout=300, check=False,
                          env={"PATH": f"{env.bin_dir}:/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr[-3000:]


def served(name: str, fmt: str, artifact: Path, signature: Signature, **changes: object) -> ServedModel:
    settings: dict[str, object] = {
        "max_batch_size": 8,
        "dynamic_batching": DynamicBatching(max_queue_delay_microseconds=20_000),
        "instance_group": InstanceGroup(count=1),
    }
    settings.update(changes)
    return ServedModel(name=name, version=1, format=fmt, signature=signature, artifact_path=artifact,
                       **settings)  # type: ignore[arg-type]


def start(env: RuntimeEnv, models: tuple[ServedModel, ...], workdir: Path) -> lt.ServerProcess:
    render_repository(RepositorySpec(models=models), "local", workdir / "repo",
                      local_frameworks={"torch", "tensorflow"})
    backend_dir = backends.build_backend_dir(env, workdir / "var")
    return lt.start_server(workdir / "repo", workdir / "var" / "triton.log", env, backend_dir)


@pytest.fixture(scope="module")
def framework_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = runtime_env()
    folder = tmp_path_factory.mktemp("framework-artifacts")
    make_resnet_onnx(folder / "resnet.onnx")
    make_resnet_framework_models(folder, env.bin_dir / "python", {"torch", "tensorflow"})
    in_runtime_env(env, BUILD_LOOKUPS, folder, str(folder / "lookup.pt"), str(folder / "lookup-savedmodel"))
    with zipfile.ZipFile(folder / "lookup.savedmodel.zip", "w") as archive:
        for path in sorted((folder / "lookup-savedmodel").rglob("*")):
            if path.is_file():
                archive.write(path, f"lookup/{path.relative_to(folder / 'lookup-savedmodel')}")
    return folder


@pytest.fixture(scope="module")
def fw_server(framework_artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[lt.ServerProcess]:
    env = runtime_env()
    models = (
        served("resnet_onnx", "onnx", framework_artifacts / "resnet.onnx", RESNET_SIGNATURE),
        served("resnet_pt", "torchscript", framework_artifacts / "resnet.pt", RESNET_SIGNATURE),
        served("resnet_tf", "tensorflow_savedmodel", framework_artifacts / "resnet.savedmodel.zip", RESNET_SIGNATURE,
               definition=SavedModelDefinition(signature_def="serving_default")),
        served("lookup_pt", "torchscript", framework_artifacts / "lookup.pt", LOOKUP_SIG,
               dynamic_batching=DynamicBatching(max_queue_delay_microseconds=50_000)),
        served("lookup_tf", "tensorflow_savedmodel", framework_artifacts / "lookup.savedmodel.zip", TF_LOOKUP_SIG,
               dynamic_batching=DynamicBatching(max_queue_delay_microseconds=50_000)),
    )
    process = start(env, models, tmp_path_factory.mktemp("triton-frameworks"))
    try:
        # Each python-backend stub imports its framework: a few seconds apiece on a busy machine.
        result = readiness.wait_ready(process, [m.name for m in models], timeout=240)
        assert result.ready, f"{result.message}\n{serverlog.tail_log(process.log_path, 60)}"
        yield process
    finally:
        lt.stop_server(process.pid, grace_seconds=10)
    assert lt.group_pids(process.pid) == []


def images_payload(images: np.ndarray) -> dict[str, object]:
    return infer_payload("input", images)


def test_the_cnn_scores_the_same_as_onnx_torchscript_and_savedmodel(fw_server: lt.ServerProcess) -> None:
    images = resnet_inputs(5, seed=11)
    expected = resnet_onnx_scores(images)
    requests = [(model, images_payload(images)) for model in ("resnet_onnx", "resnet_pt", "resnet_tf")]
    answers = asyncio.run(post_all(fw_server, requests, workers=1))
    scores = {}
    for (model, _), (status, answer) in zip(requests, answers, strict=True):
        assert status == 200, answer
        scores[model] = output_of(answer, "logits")
        assert np.allclose(scores[model], expected, rtol=RESNET_RTOL, atol=RESNET_ATOL), model
    assert np.allclose(scores["resnet_pt"], scores["resnet_tf"], rtol=RESNET_RTOL, atol=RESNET_ATOL)


@pytest.mark.parametrize("model", ["resnet_pt", "resnet_tf"])
def test_concurrent_requests_are_batched_and_each_gets_its_own_scores(fw_server: lt.ServerProcess, model: str) -> None:
    images = resnet_inputs(48, seed=3)
    expected = resnet_onnx_scores(images)
    before = batch_counts(fw_server, model)
    requests = [(model, images_payload(images[i : i + 1])) for i in range(len(images))]
    answers = asyncio.run(post_all(fw_server, requests, workers=16))

    for i, (status, answer) in enumerate(answers):
        assert status == 200, answer
        assert np.allclose(output_of(answer, "logits"), expected[i : i + 1], rtol=RESNET_RTOL, atol=RESNET_ATOL)
    after = batch_counts(fw_server, model)
    new_batches = {size: after[size] - before.get(size, 0) for size in after if after[size] > before.get(size, 0)}
    print(f"{model} executions per batch size under 16 concurrent clients: {new_batches}")
    assert max(new_batches) > 1


@pytest.mark.parametrize(("model", "input_name", "status_of_bad"), [("lookup_pt", "positions", 500),
                                                                     ("lookup_tf", "ids", 400)])
def test_a_request_that_fails_inside_a_batch_gets_its_own_error_and_the_others_their_rows(
    fw_server: lt.ServerProcess, model: str, input_name: str, status_of_bad: int
) -> None:
    before = batch_counts(fw_server, model)
    ids = [[3], [7], [12], [0], [9], [1], [5], [2]]  # 12 is outside the 10-row table
    requests = [(model, infer_payload(input_name, np.array([i], dtype=np.int64), "INT64")) for i in ids]
    answers = asyncio.run(post_all(fw_server, requests, workers=len(requests)))

    for (index,), (status, answer) in zip(ids, answers, strict=True):
        if index == 12:
            # TensorFlow says InvalidArgument (the client's fault: 400); torch raises a plain error (500).
            assert status == status_of_bad and "inference failed" in answer["error"], answer
        else:
            assert status == 200, answer
            assert np.array_equal(output_of(answer, "rows"), TABLE[index].reshape(1, 1, 2))
            if model == "lookup_pt":
                (echo,) = [o for o in answer["outputs"] if o["name"] == "echo"]
                assert echo["data"] == [index]
    after = batch_counts(fw_server, model)
    # The requests arrived together and were batched, so the good ones really shared a run with the bad one.
    assert any(size > 1 and after[size] > before.get(size, 0) for size in after)


def test_a_torchscript_model_whose_forward_does_not_fit_the_signature_fails_to_load_with_the_reason(
    framework_artifacts: Path, tmp_path: Path
) -> None:
    env = runtime_env()
    two_inputs = Signature(inputs=(Tensor("a", "FP32", (-1, 3, 64, 64)), Tensor("b", "FP32", (-1, 3, 64, 64))),
                           outputs=RESNET_SIGNATURE.outputs)
    process = start(env, (served("wrong_pt", "torchscript", framework_artifacts / "resnet.pt", two_inputs),), tmp_path)
    try:
        result = readiness.wait_ready(process, ["wrong_pt"], timeout=120)
        assert not result.ready
        assert any("forward() takes the arguments (input) but the signature declares the inputs (a, b)" in line
                   for line in result.errors), result.errors
    finally:
        lt.stop_server(process.pid, grace_seconds=10)
