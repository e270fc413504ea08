"""The confinement of a Kubernetes pool's models, for real on this machine: the stub wrapper (pool_stub.py) run as
the python backend runs a stub, around a stand-in for the real stub that allocates what it is told, and the start
script (pool_triton.sh) that puts the wrapper in the backend's place. What a pod adds (an unprivileged container, no
writable cgroup filesystem) is what this machine's processes have too: the wrapper needs no privilege.

The last test runs the whole pod's mechanism against a real tritonserver (marker `triton`): the start script, the
agent writing the limits, the generated ONNX models in stub processes of their own."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployments.runtimes.kubernetes import pool_stub

WRAPPER = Path(pool_stub.__file__)
START = WRAPPER.with_name("pool_triton.sh")
MiB = 2**20

# The stand-in for Triton's real stub: it says what it was started with, then allocates (and touches) the MiB its
# command line asks for, in 8 MiB steps, holding them until its stdin closes.
FAKE_STUB = textwrap.dedent(f"""\
    #!{sys.executable}
    import resource, sys
    print("limit", resource.getrlimit(resource.RLIMIT_DATA)[1], flush=True)
    print("oom_score_adj", open("/proc/self/oom_score_adj").read().strip(), flush=True)
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        print("raised", flush=True)
    except (ValueError, OSError):
        print("cannot raise", flush=True)
    held = []
    try:
        for _ in range(int(sys.argv[2]) // 8):
            held.append(bytearray(8 * 2**20))  # zero-filled: every page touched
    except MemoryError:
        print("refused at", len(held) * 8, flush=True)
        sys.exit(3)
    print("holding", len(held) * 8, flush=True)
    sys.stdin.read()
    held.append(bytearray(8 * 2**20))
    print("still going", flush=True)
    """)


@pytest.fixture
def pod(tmp_path: Path) -> Path:
    """A repository with two models' directories, their limits as the agent writes them, and the fake stub."""
    for name in ("d3-r1-attacker", "d4-r1-neighbour"):
        (tmp_path / "models" / name / "1").mkdir(parents=True)
        (tmp_path / "models" / name / "1" / "model.py").write_text("")
    (tmp_path / "limits").mkdir()
    (tmp_path / "limits" / "d3-r1-attacker").write_text(f"{96 * MiB}\n")
    (tmp_path / "limits" / "d4-r1-neighbour").write_text(f"{400 * MiB}\n")
    stub = tmp_path / "real_stub"
    stub.write_text(FAKE_STUB)
    stub.chmod(0o755)
    return tmp_path


def _env(pod: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "MODELPORT_MODEL_LIMITS_DIR": str(pod / "limits"),
        "MODELPORT_REPOSITORY": str(pod / "models"),
    }


def _start(pod: Path, model_path: str, mib: int, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """As Triton starts a stub: `<stub> <model path> <more args>`, the stub entry being the wrapper."""
    return subprocess.Popen(
        [sys.executable, "-I", str(WRAPPER), str(pod / "real_stub"), model_path, str(mib), "shm-region", "1048576"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env if env is not None else _env(pod),
    )


def _lines(process: subprocess.Popen[str], until: str) -> list[str]:
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line.strip())
        if line.startswith(until):
            break
    return lines


def test_a_model_past_its_limit_fails_in_its_own_process_while_a_neighbour_keeps_going(pod: Path) -> None:
    neighbour = _start(pod, str(pod / "models/d4-r1-neighbour/1/model.py"), 200)
    try:
        assert _lines(neighbour, "holding") == [
            f"limit {400 * MiB}",
            "oom_score_adj 1000",
            "cannot raise",
            "holding 200",
        ]
        # The attacker asks for far more than its 96 MiB: the allocation fails in its own process, as an error
        # (a 400 for the request, triton_batching.out_of_memory), and it cannot lift its limit first.
        attacker = _start(pod, str(pod / "models/d3-r1-attacker/1/model.py"), 1024)
        out, err = attacker.communicate(timeout=60)
        assert attacker.returncode == 3, err
        lines = out.split("\n")
        assert lines[:3] == [f"limit {96 * MiB}", "oom_score_adj 1000", "cannot raise"]
        assert lines[3].startswith("refused at") and int(lines[3].split()[-1]) < 96
        assert neighbour.poll() is None  # untouched, holding its 200 MiB
        assert neighbour.stdin is not None
        neighbour.stdin.close()
        assert _lines(neighbour, "still going")[-1] == "still going"  # and allocating more
        assert neighbour.wait(timeout=30) == 0
    finally:
        if neighbour.poll() is None:
            neighbour.kill()
            neighbour.wait()


def test_the_wrapper_is_replaced_by_the_real_stub_keeping_its_pid(pod: Path) -> None:
    """Triton tracks the stub by the pid it started (through bash's exec): the wrapper execs, it never forks."""
    process = _start(pod, str(pod / "models/d4-r1-neighbour/1/model.py"), 8)
    try:
        _lines(process, "holding")
        cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[0] == str(pod / "real_stub").encode() or cmdline[1] == str(pod / "real_stub").encode()
        assert Path(f"/proc/{process.pid}/oom_score_adj").read_text().strip() == "1000"
        limits = Path(f"/proc/{process.pid}/limits").read_text()
        assert f"Max data size             {400 * MiB}" in limits
    finally:
        process.kill()
        process.wait()


def test_triton_probing_the_stub_without_arguments_gets_status_1(pod: Path) -> None:
    done = subprocess.run([sys.executable, "-I", str(WRAPPER), str(pod / "real_stub")], env=_env(pod), timeout=30)
    assert done.returncode == 1


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("no limit", "no memory limit was given for model 'd5-r1-new'"),
        ("garbage", "not a positive number of bytes"),
        ("zero", "not a positive number of bytes"),
        ("too long", "not a positive number of bytes"),
        ("symlink", "no memory limit was given"),  # O_NOFOLLOW: a link planted there is not the agent's file
        ("outside", "outside the repository"),
        ("climbing", "not a plain path"),
        ("bad name", "names no model"),
        ("no limits dir", "MODELPORT_MODEL_LIMITS_DIR is not set"),
    ],
)
def test_anything_amiss_fails_the_model_before_any_of_its_code_runs(pod: Path, case: str, words: str) -> None:
    env = _env(pod)
    model = pod / "models/d5-r1-new/1/model.py"
    model.parent.mkdir(parents=True)
    limit = pod / "limits" / "d5-r1-new"
    path = str(model)
    if case == "garbage":
        limit.write_text("lots\n")
    elif case == "zero":
        limit.write_text("0")
    elif case == "too long":
        limit.write_text("1" * 40)
    elif case == "symlink":
        limit.symlink_to(pod / "limits" / "d4-r1-neighbour")
    elif case == "outside":
        path = str(pod / "elsewhere/d4-r1-neighbour/1/model.py")
    elif case == "climbing":
        path = str(pod / "models/d5-r1-new/../d4-r1-neighbour/1/model.py")
    elif case == "bad name":
        path = str(pod / "models/-x/1/model.py")
    elif case == "no limits dir":
        del env["MODELPORT_MODEL_LIMITS_DIR"]
    process = _start(pod, path, 8, env)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 2
    assert out == ""  # the real stub never ran
    assert "could not confine the model's process" in err and words in err, err


# --- The start script ---------------------------------------------------------------------------------------------


@pytest.fixture
def image(tmp_path: Path) -> Path:
    """The parts of a Triton image the start script uses: its backends and a tritonserver that records its
    arguments (and python3 on PATH, as the image has)."""
    backends = tmp_path / "opt" / "backends"
    (backends / "python").mkdir(parents=True)
    (backends / "onnxruntime").mkdir()
    (backends / "onnxruntime" / "libtriton_onnxruntime.so").write_text("")
    (backends / "python" / "libtriton_python.so").write_text("")
    (backends / "python" / "triton_python_backend_utils.py").write_text("")
    (backends / "python" / "triton_python_backend_stub").write_text(FAKE_STUB)
    (backends / "python" / "triton_python_backend_stub").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tritonserver").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/triton-args\n')
    (bin_dir / "tritonserver").chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    return tmp_path


def _run_start(image: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(START), "--model-repository=/models", "--model-control-mode=explicit"],
        capture_output=True,
        text=True,
        timeout=30,
        env={
            "PATH": f"{image / 'bin'}:/usr/bin:/bin",
            "MODELPORT_TRITON_BACKENDS": str(image / "opt" / "backends"),
            "MODELPORT_BACKEND_DIR": str(image / "run"),
            "MODELPORT_STUB_WRAPPER": str(WRAPPER),
            **env,
        },
    )


def test_the_start_script_runs_triton_with_every_models_stub_behind_the_wrapper(image: Path, pod: Path) -> None:
    done = _run_start(image)
    assert done.returncode == 0, done.stderr
    out = image / "run"
    assert (image / "triton-args").read_text().split("\n")[:3] == [
        f"--backend-directory={out}",
        "--model-repository=/models",
        "--model-control-mode=explicit",
    ]
    # The image's backends as they are (links), the python backend's library and utils linked, its stub replaced.
    assert os.readlink(out / "onnxruntime") == str(image / "opt/backends/onnxruntime")
    assert os.readlink(out / "python/libtriton_python.so") == str(image / "opt/backends/python/libtriton_python.so")
    stub = out / "python" / "triton_python_backend_stub"
    assert not stub.is_symlink() and str(WRAPPER) in stub.read_text()
    env = {**_env(pod), "PATH": f"{image / 'bin'}:/usr/bin:/bin"}
    assert subprocess.run([str(stub)], env=env, timeout=30).returncode == 1  # Triton's probe
    # What Triton runs for a model: the wrapper, then the image's real stub, limited.
    ran = subprocess.run(
        [str(stub), str(pod / "models/d3-r1-attacker/1/model.py"), "8"],
        input="",
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split("\n")[:2] == [f"limit {96 * MiB}", "oom_score_adj 1000"]
    # Unconfined never: a model with no limit does not start.
    (pod / "limits" / "d3-r1-attacker").unlink()
    refused = subprocess.run(
        [str(stub), str(pod / "models/d3-r1-attacker/1/model.py"), "8"],
        input="",
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 2 and refused.stdout == ""


def test_the_start_script_never_starts_triton_without_the_wrapper(image: Path) -> None:
    done = _run_start(image, MODELPORT_STUB_WRAPPER=str(image / "missing.py"))
    assert done.returncode != 0 and "no stub wrapper" in done.stderr
    assert not (image / "triton-args").exists()
    (image / "opt/backends/python/triton_python_backend_stub").unlink()
    done = _run_start(image)
    assert done.returncode != 0 and "no python backend stub" in done.stderr
    assert not (image / "triton-args").exists()


# --- The whole pod's mechanism, with a real Triton -------------------------------------------------------------------


@pytest.fixture
def stopping() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.mark.triton
def test_in_a_real_triton_one_teams_huge_answer_fails_its_own_request_and_the_neighbour_answers_all_along(
    tmp_path: Path, stopping: list[subprocess.Popen[bytes]]
) -> None:
    """Issue 30's attacker on a cluster pool's mechanism: the start script's backend directory, the agent writing
    each model's limit from its entry, the pool's repository as the worker renders it (the generated python model
    for ONNX). The ConstantOfShape model asked for 6x10^7 floats (240 MB, past its 256 MiB limit with its stub) and
    for 10^6 (4 MB, past a POOL_MAX_OUTPUT_BYTES of 1 MiB) gets 400s from its own process, Triton keeps its pid, and
    another team's model answers 200 in between; each model's figure is its own processes' peak. (A model given no
    limit: the wrapper refuses it, test_anything_amiss_..., and the agent before it asks Triton, which would wait
    for the dead stub until its load times out: test_k8s_pool_agent.py.)"""
    import json
    import urllib.error
    import urllib.request

    import numpy as np

    from deployments.render import render_repository
    from deployments.runtimes.kubernetes import pool_agent
    from deployments.runtimes.local import backends
    from deployments.runtimes.local import triton as lt
    from deployments.spec import RepositorySpec
    from deployments.tests import local_triton
    from modelport.core.runtime_env import server_environment
    from modelport.core.signature import Signature, Tensor
    from tests.artifacts import constant_of_shape_onnx

    env = local_triton.runtime_env()
    (tmp_path / "shaper.onnx").write_bytes(constant_of_shape_onnx())
    shaper = local_triton.onnx_model(
        "d3-r1-shaper",
        tmp_path / "shaper.onnx",
        Signature(inputs=(Tensor("n", "INT64", (1,)),), outputs=(Tensor("y", "FP32", (-1,)),)),
        max_batch_size=0,
        dynamic_batching=None,
    )
    digits = local_triton.onnx_model("d4-r1-digits", local_triton.matmul_onnx(tmp_path / "m.onnx"))
    models = (tmp_path / "models").resolve()
    models.mkdir()
    for model in (shaper, digits):
        rendered = tmp_path / f"rendered-{model.name}"
        render_repository(
            RepositorySpec(models=(model,)), "kubernetes", rendered, fold_constants=False, python_models=True
        )
        assert 'backend: "python"' in (rendered / model.name / "config.pbtxt").read_text()
        (rendered / model.name).rename(models / model.name)
    # The agent's part, as their entries say.
    agent = pool_agent.Agent(
        tmp_path / "desired",
        models,
        pool_agent.Triton("http://127.0.0.1:1", ""),
        max_file_bytes=2**30,
        max_revision_bytes=2**30,
        limits_dir=tmp_path / "limits",
        usage_dir=tmp_path / "usage",
    )
    agent._write_limits("d3-r1", {"memory_limits": {"d3-r1-shaper": 256 * MiB}})
    agent._write_limits("d4-r1", {"memory_limits": {"d4-r1-digits": 256 * MiB}})
    (tmp_path / "usage").mkdir()

    image = tmp_path / "image"
    (image / "bin").mkdir(parents=True)
    (image / "bin" / "tritonserver").symlink_to(env.tritonserver)
    http, grpc, metrics = lt.pick_free_ports(3, "127.0.0.1")
    environment = {
        **server_environment(env),
        "PATH": f"{image / 'bin'}:{env.bin_dir}:/usr/bin:/bin",
        "MODELPORT_TRITON_BACKENDS": str(backends.build_backend_dir(env, tmp_path / "var")),
        "MODELPORT_BACKEND_DIR": str(tmp_path / "run"),
        "MODELPORT_STUB_WRAPPER": str(WRAPPER),
        "MODELPORT_MODEL_LIMITS_DIR": str(tmp_path / "limits"),
        "MODELPORT_REPOSITORY": str(models),
        "MODELPORT_USAGE_DIR": str(tmp_path / "usage"),
        "MODELPORT_MAX_OUTPUT_BYTES": str(MiB),
        "MODELPORT_CPUS": "1",
    }
    log = (tmp_path / "triton.log").open("wb")
    triton = subprocess.Popen(
        [
            "sh",
            str(START),
            f"--model-repository={models}",
            "--model-control-mode=explicit",
            "--strict-readiness=false",
            "--disable-auto-complete-config",
            "--http-address=127.0.0.1",
            f"--http-port={http}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={grpc}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={metrics}",
            "--allow-gpu-metrics=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=environment,
        start_new_session=True,
    )
    stopping.append(triton)
    url = f"http://127.0.0.1:{http}"
    client = pool_agent.Triton(url, "")

    def tail() -> str:
        return (tmp_path / "triton.log").read_text(errors="replace")[-3000:]

    deadline = time.monotonic() + 90
    while client.ready_models() is None:
        assert triton.poll() is None and time.monotonic() < deadline, tail()
        time.sleep(0.2)
    assert client.action("d3-r1-shaper", "load") is None, tail()
    assert client.action("d4-r1-digits", "load") is None, tail()
    server_pid = triton.pid  # sh exec'd tritonserver: the same process

    def post(model: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            f"{url}/v2/models/{model}/infer",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def ask(count: int) -> tuple[int, dict[str, Any]]:
        return post("d3-r1-shaper", {"inputs": [{"name": "n", "shape": [1], "datatype": "INT64", "data": [count]}]})

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    victim = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.ravel().tolist()}]}
    status, answer = ask(3)
    assert status == 200 and answer["outputs"][0]["data"] == [1.0, 1.0, 1.0], answer
    # An answer that fits in its memory but not in the bound: refused in its own process.
    status, answer = ask(1_000_000)
    assert status == 400 and "POOL_MAX_OUTPUT_BYTES" in str(answer["error"]), answer
    victims = []
    for _ in range(4):
        # 240 MB does not fit in its 256 MiB with its stub: the allocation fails in its own process.
        status, answer = ask(60_000_000)
        assert status == 400, (status, answer)
        assert "needs more memory than model" in str(answer["error"]), answer
        code, reply = post("d4-r1-digits", victim)
        victims.append(code)
        assert code == 200, reply
        got = np.array(reply["outputs"][0]["data"]).reshape(2, 3)
        assert np.allclose(got, x @ local_triton.W, atol=1e-5)
    assert victims == [200] * 4
    assert triton.poll() is None and lt.is_alive(server_pid), tail()
    # Each model's stub is limited and first in line for the kernel's killer; Triton is neither.
    stubs = {
        name: [
            pid
            for pid in lt.server_pids(server_pid)
            if f"{models}/{name}/".encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        for name in ("d3-r1-shaper", "d4-r1-digits")
    }
    for name, pids in stubs.items():
        assert pids, name
        for pid in pids:
            assert f"Max data size             {256 * MiB}" in Path(f"/proc/{pid}/limits").read_text()
            assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "1000"
    assert Path(f"/proc/{server_pid}/oom_score_adj").read_text().strip() != "1000"
    assert resource.getrlimit(resource.RLIMIT_DATA) != (256 * MiB, 256 * MiB)
    # The figures: each model's own processes' peak, as its generated model wrote it.
    shaper_peak = agent.usage_bytes("d3-r1-shaper")
    digits_peak = agent.usage_bytes("d4-r1-digits")
    assert shaper_peak is not None and digits_peak is not None
    assert 10 * MiB < digits_peak <= 256 * MiB and 10 * MiB < shaper_peak <= 256 * MiB
    own = sum(
        int(line.split()[1]) * 1024
        for pid in stubs["d4-r1-digits"]
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmHWM:")
    )
    assert abs(own - digits_peak) < 16 * MiB  # its own pages, not the attacker's


# --- What the generated models do in a cluster pool -----------------------------------------------------------------


def _batching(monkeypatch: pytest.MonkeyPatch) -> Any:
    """modelport/core/backends/triton_batching.py as the stub imports it (beside model.py, with Triton's utils)."""
    import importlib.util
    import types

    from modelport.core.formats.base import BACKENDS_DIR

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    spec = importlib.util.spec_from_file_location("triton_batching_under_test", BACKENDS_DIR / "triton_batching.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_models_threads_follow_the_pods_cpu_request_not_the_nodes_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    batching = _batching(monkeypatch)
    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("MODELPORT_CPUS", raising=False)
    assert batching.cpu_count() == cores
    monkeypatch.setenv("MODELPORT_CPUS", "1")
    assert batching.cpu_count() == 1
    monkeypatch.setenv("MODELPORT_CPUS", "999")
    assert batching.cpu_count() == cores  # never more than it may use
    for junk in ("0", "-3", "lots"):
        monkeypatch.setenv("MODELPORT_CPUS", junk)
        assert batching.cpu_count() == cores


def test_a_model_instance_writes_its_own_peak_whole(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    batching = _batching(monkeypatch)
    batching.report_usage(str(tmp_path), "d3-r1-digits", "d3-r1-digits_0")
    batching.report_usage(str(tmp_path), "d3-r1-digits", "../../escape")  # Triton's name, made a plain file name
    files = sorted(p.name for p in (tmp_path / "d3-r1-digits").iterdir())
    assert files == [".._.._escape", "d3-r1-digits_0"]
    peak = int((tmp_path / "d3-r1-digits" / "d3-r1-digits_0").read_text())
    assert peak == batching.peak_resident_bytes() or abs(peak - batching.peak_resident_bytes()) < 4 * MiB
    assert peak > 10 * MiB  # this process's VmHWM, an interpreter with numpy
    batching.report_usage(str(tmp_path / "missing" / "\0"), "x", "y")  # cannot write: no failure of the model
