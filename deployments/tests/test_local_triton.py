"""The local Triton supervisor: unit tests of its helpers, then a real tritonserver from the runtime env.

The tests marked `triton` render repositories with deployments.render, start the real binary shipped in the
nvidia-pytriton wheel (see docs/local-runtime.md) and talk to it over HTTP. They skip, saying why, when the runtime
env does not exist; point MODELPORT_RUNTIME_ENV at another one to use it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from deployments.runtimes.local import backends, readiness, serverlog
from deployments.runtimes.local import triton as lt
from deployments.spec import DynamicBatching, InstanceGroup, RepositorySpec, ServedModel, Warmup
from deployments.tests.local_triton import (
    MATMUL_SIG,
    TABLE,
    W,
    batch_counts,
    batched,
    infer,
    infer_payload,
    matmul_onnx,
    onnx_model,
    output_of,
    pipeline_spec,
    post_all,
    runtime_env,
    save_onnx,
    start,
)
from modelport.core.runtime_env import RuntimeEnv, RuntimeEnvError, find_runtime_env, server_environment
from modelport.core.signature import Signature
from tests.processes import wait_for

# A real log of a failed start (Triton 2.51, trimmed): harmless CUDA noise, a multi-line error, the status table.
FAILED_LOG = r"""W1129 16:24:19.370663 9010 pinned_memory_manager.cc:273] "Unable to allocate pinned system memory, pinned memory pool will not be available: CUDA driver version is insufficient for CUDA runtime version"
E1129 16:24:19.370781 9010 server.cc:241] "CudaDriverHelper has not been initialized."
I1129 16:24:19.371622 9010 model_lifecycle.cc:472] "loading: broken:1"
E1129 16:24:19.713920 9010 model_lifecycle.cc:642] "failed to load 'broken' version 1: Internal: InvalidProtobuf: Load model from /repo/broken/1/model.onnx failed:Protobuf parsing failed.\n\nAt:\n  /repo/broken/1/model.py(64): initialize\n"
I1129 16:24:19.713935 9010 model_lifecycle.cc:777] "failed to load 'broken'"
I1129 16:24:19.714074 9010 server.cc:674]
+--------+---------+-------------------------------------------------------------+
| Model  | Version | Status                                                      |
+--------+---------+-------------------------------------------------------------+
| broken | 1       | UNAVAILABLE: Internal: InvalidProtobuf: Load model failed.  |
+--------+---------+-------------------------------------------------------------+

I1129 16:24:19.714325 9010 server.cc:305] "Waiting for in-flight requests to complete."
error: creating server: Internal - failed to load all models
"""  # noqa: E501 - Triton log lines, verbatim


# --- Helpers that need no server ------------------------------------------------------------------------------


def test_log_errors_returns_tritons_error_messages_without_prefixes_or_cuda_noise(tmp_path: Path) -> None:
    log = tmp_path / "triton.log"
    log.write_text(FAILED_LOG)
    errors = serverlog.log_errors(log)
    assert errors == [
        "failed to load 'broken' version 1: Internal: InvalidProtobuf: Load model from /repo/broken/1/model.onnx "
        "failed:Protobuf parsing failed.\n\nAt:\n  /repo/broken/1/model.py(64): initialize",
        "model 'broken' version 1: UNAVAILABLE: Internal: InvalidProtobuf: Load model failed.",
        "error: creating server: Internal - failed to load all models",
    ]
    assert serverlog.summary_error(errors) == errors[0]


def test_log_errors_include_the_sandbox_wrappers_refusal_to_run_a_model_unconfined(tmp_path: Path) -> None:
    log = tmp_path / "triton.log"
    refusal = "modelport sandbox: could not confine the python model: [Errno 1] unshare: Operation not permitted"
    log.write_text('I1129 16:24:19.371622 9010 model_lifecycle.cc:472] "loading: broken:1"\n' + refusal + "\n")
    assert serverlog.log_errors(log) == [refusal]


def test_a_process_group_that_is_no_sandbox_is_stopped_as_a_group_and_timed_from_its_start() -> None:
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert lt.is_sandbox_init(sleeper.pid) is False and lt.is_sandbox_init(os.getpid()) is False
        assert lt.server_pids(sleeper.pid) == [sleeper.pid]
        assert 0 <= lt.process_age(sleeper.pid) < 30 and lt.process_age(2**22 + 1) == 0.0
        assert lt.find_servers("/nonexistent/") == []
    finally:
        sleeper.kill()
        sleeper.wait()


def test_log_errors_of_a_missing_log_is_empty(tmp_path: Path) -> None:
    assert serverlog.log_errors(tmp_path / "nothing.log") == []
    assert serverlog.tail_log(tmp_path / "nothing.log") == ""


def test_tail_log_returns_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "triton.log"
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    assert serverlog.tail_log(log, 3) == "line 997\nline 998\nline 999\n"


def test_pick_free_ports_gives_distinct_bindable_ports() -> None:
    ports = lt.pick_free_ports(3)
    assert len(set(ports)) == 3 and all(1024 <= p <= 65535 for p in ports)


def test_it_does_not_adopt_a_pid_that_is_not_a_tritonserver() -> None:
    assert lt.is_alive(os.getpid()) is False  # this python process: a recycled pid looks like this
    assert lt.is_alive(2**22 + 1) is False  # above pid_max: no such process


def test_stop_server_leaves_a_process_that_is_not_a_tritonserver_alone() -> None:
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert lt.stop_server(sleeper.pid, grace_seconds=0.5) is False
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_find_runtime_env_explains_a_missing_env(tmp_path: Path) -> None:
    with pytest.raises(RuntimeEnvError, match="requirements-runtime.txt"):
        find_runtime_env(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeEnvError, match="install nvidia-pytriton"):
        find_runtime_env(tmp_path / "empty")


def test_the_server_environment_puts_the_runtime_env_first_and_drops_the_portals_python_settings() -> None:
    env = RuntimeEnv(root=Path("/rt"), python_version="3.11", site_packages=Path("/sp"), tritonserver=Path("/t"))
    result = server_environment(env, {"PATH": "/portal/.venv/bin:/usr/bin", "PYTHONPATH": "/portal", "HOME": "/h"})
    assert result["PATH"] == "/rt/bin:/portal/.venv/bin:/usr/bin"
    assert "PYTHONPATH" not in result and result["VIRTUAL_ENV"] == "/rt" and result["HOME"] == "/h"


# --- A real tritonserver ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lt.ServerProcess]:
    env = runtime_env()
    workdir = tmp_path_factory.mktemp("triton")
    artifacts = workdir / "artifacts"
    artifacts.mkdir()
    matmul = matmul_onnx(artifacts / "matmul.onnx")
    lookup = save_onnx(
        artifacts / "lookup.onnx",
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 1])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["N", 1, 2])],
        {"table": TABLE},
    )
    spec = RepositorySpec(
        models=(
            onnx_model("matmul", matmul, instance_group=InstanceGroup(count=2), warmup=Warmup(batch_size=2)),
            # The signature allows any width; only the ONNX file knows it must be 4: the python model checks it.
            onnx_model(
                "loose_mm",
                matmul,
                Signature(inputs=batched(("x", "FP32", (-1, -1))), outputs=batched(("y", "FP32", (-1, 3)))),
                dynamic_batching=DynamicBatching(max_queue_delay_microseconds=20_000),
            ),
            onnx_model(
                "lookup",
                lookup,
                Signature(inputs=batched(("ids", "INT64", (-1, 1))), outputs=batched(("rows", "FP32", (-1, 1, 2)))),
                dynamic_batching=DynamicBatching(max_queue_delay_microseconds=50_000),
            ),
            onnx_model(
                "fixed_mm",
                matmul_onnx(artifacts / "fixed.onnx", batch=2),
                Signature(inputs=batched(("x", "FP32", (2, 4))), outputs=batched(("y", "FP32", (2, 3)))),
                max_batch_size=0,
                dynamic_batching=None,
            ),
            *pipeline_spec(artifacts),
        )
    )
    process = start(env, spec, workdir, response_cache_bytes=1024 * 1024)
    try:
        result = readiness.wait_ready(process, [m.name for m in spec.models], timeout=120)
        assert result.ready, f"{result.message}\n{serverlog.tail_log(process.log_path, 60)}"
        yield process
    finally:
        lt.stop_server(process.pid, grace_seconds=10)
    assert lt.group_pids(process.pid) == []


@pytest.mark.triton
def test_the_server_answers_like_onnxruntime_in_process(triton_server: lt.ServerProcess, tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    session = ort.InferenceSession(str(matmul_onnx(tmp_path / "m.onnx")), providers=["CPUExecutionProvider"])
    expected = session.run(["y"], {"x": x})[0]
    assert np.allclose(infer(triton_server, "matmul", {"x": x}, "y"), expected, atol=1e-5)


@pytest.mark.triton
def test_a_model_without_batching_runs_each_request_on_its_own(triton_server: lt.ServerProcess) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert np.allclose(infer(triton_server, "fixed_mm", {"x": x}, "y"), x @ W, atol=1e-5)


@pytest.mark.triton
def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(triton_server: lt.ServerProcess) -> None:
    before = batch_counts(triton_server, "matmul")
    inputs = [np.full((1, 4), i, dtype=np.float32) for i in range(128)]
    answers = asyncio.run(post_all(triton_server, [("matmul", infer_payload("x", x)) for x in inputs], workers=16))

    for x, (status, answer) in zip(inputs, answers, strict=True):
        assert status == 200, answer
        assert np.allclose(output_of(answer, "y"), x @ W, atol=1e-4)
    after = batch_counts(triton_server, "matmul")
    new_batches = {size: after[size] - before.get(size, 0) for size in after if after[size] > before.get(size, 0)}
    print(f"matmul executions per batch size under 16 concurrent clients: {new_batches}")
    assert max(new_batches) > 1


@pytest.mark.triton
def test_a_request_with_a_wrong_shape_fails_alone_while_concurrent_good_requests_succeed(
    triton_server: lt.ServerProcess,
) -> None:
    good = np.ones((1, 4), dtype=np.float32)
    wrong = np.ones((1, 5), dtype=np.float32)
    requests = [("loose_mm", infer_payload("x", good))] * 6 + [("loose_mm", infer_payload("x", wrong))]
    requests += [("loose_mm", infer_payload("x", good))] * 6 + [("matmul", infer_payload("x", wrong))]
    answers = asyncio.run(post_all(triton_server, requests, workers=len(requests)))

    bad_loose, bad_core = answers[6], answers[13]
    # Triton itself rejects a shape that contradicts config.pbtxt; the python model rejects one only the ONNX
    # file contradicts, with its own error response.
    assert bad_core[0] == 400 and "unexpected shape" in bad_core[1]["error"]
    assert bad_loose[0] == 400
    assert bad_loose[1]["error"] == "input 'x' has shape [1, 5], model 'loose_mm' expects [-1, 4] (-1: any size)"
    for index in [*range(6), *range(7, 13)]:
        status, answer = answers[index]
        assert status == 200, answer
        assert np.allclose(output_of(answer, "y"), good @ W, atol=1e-4)


@pytest.mark.triton
def test_a_request_that_fails_inside_a_batch_does_not_fail_the_others(triton_server: lt.ServerProcess) -> None:
    before = batch_counts(triton_server, "lookup")
    ids = [[3], [7], [12], [0], [9], [1], [5], [2]]  # 12 is outside the 10-row table: onnxruntime fails on it
    requests = [("lookup", infer_payload("ids", np.array([i], dtype=np.int64), "INT64")) for i in ids]
    answers = asyncio.run(post_all(triton_server, requests, workers=len(requests)))

    for (index,), (status, answer) in zip(ids, answers, strict=True):
        if index == 12:
            assert status == 400 and "inference failed" in answer["error"], answer
        else:
            assert status == 200, answer
            assert np.allclose(output_of(answer, "rows"), TABLE[index].reshape(1, 1, 2))
    after = batch_counts(triton_server, "lookup")
    # The requests arrived together and were batched, so the good ones really shared a run with the bad one.
    assert any(size > 1 and after[size] > before.get(size, 0) for size in after)


@pytest.mark.triton
def test_an_ensemble_of_an_onnx_and_a_python_step_answers(triton_server: lt.ServerProcess) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert np.allclose(infer(triton_server, "pipeline", {"x": x}, "y"), (x + 1) * 2)


@pytest.mark.triton
def test_the_response_cache_answers_a_repeated_request(triton_server: lt.ServerProcess) -> None:
    x = np.full((1, 4), 42, dtype=np.float32)
    infer(triton_server, "add_one", {"x": x}, "y")
    assert np.allclose(infer(triton_server, "add_one", {"x": x}, "y"), x + 1)
    stats = readiness.model_stats(triton_server, "add_one")
    assert int(stats["inference_stats"]["cache_hit"]["count"]) >= 1  # type: ignore[index]


@pytest.mark.triton
def test_a_corrupt_model_makes_wait_ready_report_tritons_error(tmp_path: Path) -> None:
    env = runtime_env()
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"this is not a protobuf")
    process = start(env, RepositorySpec(models=(onnx_model("broken", garbage),)), tmp_path)
    try:
        result = readiness.wait_ready(process, ["broken"], timeout=60)
    finally:
        lt.stop_server(process.pid, grace_seconds=5)

    assert result.ready is False
    assert result.exit_code == 1
    assert result.message.startswith("tritonserver exited (code 1) before it was ready: failed to load 'broken'")
    assert any("failed to load 'broken' version 1" in e and "Protobuf parsing failed" in e for e in result.errors)
    # The server exited by itself (stop_server found nothing to stop): its python-backend stub notices and ends
    # after it, in its own time on a loaded machine.
    wait_for(lambda: lt.group_pids(process.pid) == [], 30, what="the failed server's stub processes to end")


@pytest.mark.triton
def test_stopping_the_server_leaves_no_process(tmp_path: Path) -> None:
    env = runtime_env()
    model = onnx_model("matmul", matmul_onnx(tmp_path / "m.onnx"), instance_group=InstanceGroup(count=2))
    process = start(env, RepositorySpec(models=(model,)), tmp_path)
    assert readiness.wait_ready(process, ["matmul"], timeout=60).ready
    members = lt.group_pids(process.pid)
    assert len(members) >= 3  # the server and one python-backend stub per instance
    assert lt.is_alive(process.pid)

    assert lt.stop_server(process.pid, grace_seconds=10) is True
    assert lt.group_pids(process.pid) == []
    assert not lt.is_alive(process.pid)
    assert all(not Path(f"/proc/{pid}").exists() or lt.is_alive(pid) is False for pid in members)
    assert lt.stop_server(process.pid) is False  # already gone: nothing is signalled


def test_the_backend_directory_links_the_stub_for_the_runtime_envs_python(tmp_path: Path) -> None:
    env = runtime_env()
    backend_dir = backends.build_backend_dir(env, tmp_path)
    stub = backend_dir / "python" / "triton_python_backend_stub"
    stubs = env.pytriton_server_dir / "python_backend_stubs"
    assert stub.resolve() == (stubs / env.python_version / stub.name).resolve()
    assert backends.build_backend_dir(env, tmp_path) == backend_dir  # idempotent
    assert sorted(p.name for p in (backend_dir / "python").iterdir()) == [
        "libtriton_python.so",
        "triton_python_backend_stub",
        "triton_python_backend_utils.py",
    ]


SLOW_MODEL_PY = b"""import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(60)

    def execute(self, requests):
        return []
"""


@pytest.mark.triton
def test_wait_ready_gives_up_after_its_timeout_and_names_the_models_not_ready(tmp_path: Path) -> None:
    env = runtime_env()
    archive = tmp_path / "slow.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("model.py", SLOW_MODEL_PY)
    slow = ServedModel(name="slow", version=1, format="python", signature=MATMUL_SIG, artifact_path=archive)
    process = start(env, RepositorySpec(models=(slow,)), tmp_path)
    try:
        result = readiness.wait_ready(process, ["slow"], timeout=1.0)
        assert result.ready is False and result.exit_code is None
        assert result.message.startswith("not ready after 1 s")
        assert result.models_not_ready == ("slow",)
        assert lt.is_alive(process.pid)
    finally:
        assert lt.stop_server(process.pid, grace_seconds=2) is True
    assert lt.group_pids(process.pid) == []


LOUD_MODEL_PY = b"""import sys

import numpy as np
import triton_python_backend_utils as pb_utils

BLOCK = "x" * (1 << 20)


class TritonPythonModel:
    def initialize(self, args):
        # The giant log line: 48 MiB without a newline, past a 4 MiB log and a 1 MiB pipe.
        for _ in range(48):
            sys.stdout.write(BLOCK)
        sys.stdout.flush()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            for _ in range(16):
                sys.stdout.write(BLOCK)
            sys.stdout.flush()
            y = np.zeros((x.shape[0], 3), dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
        return responses
"""


@pytest.mark.triton
def test_a_model_printing_a_giant_line_neither_fills_the_disk_nor_stalls_triton(tmp_path: Path) -> None:
    """The log keeper holds the log and its rotated file within the limit and never stops reading: the model
    writes 48 MiB at start and 16 MiB per request, and still loads and answers."""
    env = runtime_env()
    archive = tmp_path / "loud.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("model.py", LOUD_MODEL_PY)
    loud = ServedModel(name="loud", version=1, format="python", signature=MATMUL_SIG, artifact_path=archive)
    limit = 4 * 1024**2
    process = start(env, RepositorySpec(models=(loud,)), tmp_path, log_max_bytes=limit)
    keeper = serverlog._keepers[-1]
    try:
        result = readiness.wait_ready(process, ["loud"], timeout=120)
        assert result.ready, f"{result.message}\n{serverlog.tail_log(process.log_path, 20)}"
        for _ in range(3):
            y = infer(process, "loud", {"x": np.ones((2, 4), dtype=np.float32)}, "y")
            assert y.shape == (2, 3)
        on_disk = sum(p.stat().st_size for p in serverlog.log_files(process.log_path) if p.exists())
        assert on_disk <= limit, f"{on_disk} bytes of log on disk"
        assert serverlog.log_files(process.log_path)[0].exists()  # it rotated: 96 MiB went through
        tail = serverlog.tail_log(process.log_path, 5)
        assert len(tail.encode()) < 100 * 1024 and "bytes cut)" in tail
    finally:
        assert lt.stop_server(process.pid, grace_seconds=5) is True
    assert lt.group_pids(process.pid) == []
    assert keeper.wait(timeout=10) == 0  # the keeper ends with its server
