"""The servers users pick instead of a Triton-based portal ("peers"), each in its own virtualenv under var/peers/
(`make bench` creates them from bench/peers/requirements-<peer>.txt), each serving the workload's Pipeline (the same
onnxruntime session, pre- and post-processing as every other server) with its own request batching, written the
way its documentation shows (bench/peers/):

- mlserver: MLServer, a custom `MLModel` runtime, adaptive batching (`max_batch_size`, `max_batch_time`); requests
  in KServe v2 JSON (MLServer's REST server has no binary tensor extension);
- bentoml: BentoML, a `@bentoml.service` with a batchable `@bentoml.api`; BentoML's own JSON;
- litserve: LitServe, a `LitAPI` with `max_batch_size` and `batch_timeout`; LitServe's own JSON, one item per request.

This module is the orchestrator's side (the portal's venv: numpy, requests, the standard library): how to start
each peer, the request body it is sent, and how to read its answer back into the workload's output arrays.
The peers serve workloads 2 (resnet) and 3 (minilm); not 1 (digits): its request is a PNG, which JSON carries only
base64-encoded, an extra decode step that no other server in the comparison does.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import requests

from bench.serving.kserve import decode_response, encode_request
from bench.serving.procs import descendants
from bench.serving.workloads import Workload
from bench.stack import ROOT, free_port

PEERS = ("mlserver", "bentoml", "litserve")
PEERS_DIR = ROOT / "var" / "peers"
PEER_CODE = ROOT / "bench" / "peers"
PEER_WORKLOADS = ("resnet", "minilm")
# The largest batch a peer may form where it needs one set (MLServer and LitServe do not batch at all without it):
# the benchmark's largest concurrency, so a full batch is every client's request. BentoML keeps its own default.
MAX_BATCH_SIZE = 32
TITLES = {
    "mlserver": "MLServer, custom MLModel runtime, adaptive batching",
    "bentoml": "BentoML, batchable @bentoml.api",
    "litserve": "LitServe, LitAPI with max_batch_size/batch_timeout",
}
PACKAGES = {"mlserver": "mlserver", "bentoml": "bentoml", "litserve": "litserve"}
REQUEST_FORMATS = {
    "mlserver": "KServe v2 JSON (POST /v2/models/<model>/infer)",
    "bentoml": "BentoML JSON (POST /<api>, {param: nested lists})",
    "litserve": "LitServe JSON (POST /predict, one item)",
}


def python(peer: str) -> Path:
    return PEERS_DIR / peer / "bin" / "python"


def serves(peer: str, workload: Workload) -> bool:
    return peer in PEERS and workload.key in PEER_WORKLOADS


# --- requests and answers ------------------------------------------------------------------------------------


def url_path(peer: str, workload: Workload) -> str:
    return {"mlserver": f"/v2/models/{workload.model}/infer", "bentoml": f"/{workload.key}",
            "litserve": "/predict"}[peer]


def _text(inputs: dict[str, np.ndarray]) -> str:
    value = inputs["text"].reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def request(peer: str, workload: Workload, inputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """The request body and headers that carry the workload's one request (batch 1) to `peer`, in its own format."""
    if peer == "mlserver":
        return encode_request(inputs, list(workload.outputs), binary=False)
    if workload.key == "resnet":
        image = inputs["input"]
        payload: dict[str, Any] = {"input": image.tolist() if peer == "bentoml" else image[0].tolist()}
    else:
        payload = {"text": [_text(inputs)] if peer == "bentoml" else _text(inputs)}
    return json.dumps(payload).encode(), {"Content-Type": "application/json"}


def answer(peer: str, workload: Workload, body: bytes, headers: Any) -> dict[str, np.ndarray]:
    """A peer's answer as the workload's outputs, batch dimension included (what a KServe answer decodes to)."""
    if peer == "mlserver":
        return decode_response(body, headers)
    output = workload.outputs[0]
    decoded = json.loads(body)
    if peer == "bentoml":
        return {output: np.asarray(decoded, dtype=np.float32)}
    return {output: np.asarray(decoded[output], dtype=np.float32)[None]}


# --- the servers -----------------------------------------------------------------------------------------------


def _command(peer: str, workload: Workload, artifacts: Path, port: int, work: Path,
             window_s: float) -> tuple[list[str], dict[str, str], Path]:
    """(argv, environment, working directory) that start `peer`, writing its configuration files into `work`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "MODELPORT_", "CELERY_"))}
    env["BENCH_BATCH_LOG"] = str(batch_log_dir(work, peer))  # bench/serving/batch_log.py
    bin_dir = python(peer).parent
    if peer == "mlserver":
        repository = work / "mlserver"
        model_dir = repository / workload.model
        model_dir.mkdir(parents=True, exist_ok=True)
        # Ports are MLServer's only settings here; gRPC and metrics servers still start, as they do by default.
        ports = [port, free_port(), free_port()]
        (repository / "settings.json").write_text(json.dumps({
            "host": "127.0.0.1", "http_port": ports[0], "grpc_port": ports[1], "metrics_port": ports[2]}))
        (model_dir / "model-settings.json").write_text(json.dumps({
            "name": workload.model, "implementation": "mlserver_runtime.OnnxPipeline",
            "max_batch_size": MAX_BATCH_SIZE, "max_batch_time": window_s,
            "parameters": {"uri": str(artifacts), "extra": {"workload": workload.key}}}))
        env["PYTHONPATH"] = str(PEER_CODE)  # where `mlserver start` finds the runtime that model-settings.json names
        return [str(bin_dir / "mlserver"), "start", str(repository)], env, repository
    if peer == "bentoml":
        home = work / "bentoml-home"
        home.mkdir(parents=True, exist_ok=True)
        # BENTOML_HOME: its model store and logs stay in the bench's temporary directory, not in ~/bentoml.
        env.update({"BENTOML_HOME": str(home), "BENTOML_DO_NOT_TRACK": "True", "BENCH_WORKLOAD": workload.key,
                    "BENCH_ARTIFACTS": str(artifacts)})
        return [str(bin_dir / "bentoml"), "serve", "bentoml_service:OnnxService", "--working-dir", str(PEER_CODE),
                "--host", "127.0.0.1", "--port", str(port)], env, home
    directory = work / "litserve"  # LitServe writes a client.py into its working directory
    directory.mkdir(parents=True, exist_ok=True)
    return [str(python(peer)), str(PEER_CODE / "litserve_server.py"), "--workload", workload.key,
            "--artifacts", str(artifacts), "--port", str(port), "--max-batch-size", str(MAX_BATCH_SIZE),
            "--batch-timeout", str(window_s)], env, directory


def batch_log_dir(work: Path, peer: str) -> Path:
    """Where `peer`'s processes count their inference calls and items (batch_log.py)."""
    return work / "batches" / peer


def ready_url(peer: str, workload: Workload, port: int) -> str:
    path = {"mlserver": f"/v2/models/{workload.model}/ready", "bentoml": "/readyz", "litserve": "/health"}[peer]
    return f"http://127.0.0.1:{port}{path}"


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop a peer and everything it started. Its workers do not always share its process group (BentoML gives
    each worker a session of its own), so every descendant found before the signal is signalled too."""
    members = descendants(process.pid)
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + 10
    for pid in members:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


@contextlib.contextmanager
def peer_servers(peers: list[str], workload: Workload, artifacts: Path, work: Path, logs: Path,
                 window_s: float) -> Iterator[dict[str, tuple[subprocess.Popen[bytes], int]]]:
    """Start `peers` for `workload`, wait until each answers its readiness check, and stop them afterwards."""
    processes: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for peer in peers:
            if not python(peer).exists():
                raise RuntimeError(f"{python(peer)} is missing: run `make bench` (it creates var/peers/{peer})")
            port = free_port()
            command, env, cwd = _command(peer, workload, artifacts, port, work, window_s)
            log = open(logs / f"{workload.key}-{peer}.log", "ab")  # noqa: SIM115 - as long as the process
            processes[peer] = (subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True), port)
        for peer, (process, port) in processes.items():
            # Generous: each one imports its framework and onnxruntime while the others do the same on 2 cores.
            deadline = time.monotonic() + 180
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"peer {peer} exited with {process.returncode}; see {logs}")
                with contextlib.suppress(requests.RequestException):
                    if requests.get(ready_url(peer, workload, port), timeout=1).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"peer {peer} was not ready within 180 s; see {logs}")
                time.sleep(0.2)
        yield processes
    finally:
        for process, _ in processes.values():
            stop(process)


def package_versions(interpreter: Path, names: list[str]) -> dict[str, str]:
    """The installed versions of `names` in the env of `interpreter`; a package not installed is left out."""
    script = ("import importlib.metadata as m, json, sys\nout = {}\nfor p in sys.argv[1:]:\n"
              "    try: out[p] = m.version(p)\n    except m.PackageNotFoundError: pass\nprint(json.dumps(out))")
    done = subprocess.run([str(interpreter), "-c", script, *names], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def versions() -> dict[str, dict[str, str]]:
    """Per peer env that exists: the peer's and its main dependencies' versions."""
    names = ["onnxruntime", "numpy", "tokenizers", "uvicorn", "uvloop", "fastapi", "starlette", "pydantic",
             "protobuf", "grpcio", "pyzmq"]
    return {peer: package_versions(python(peer), [PACKAGES[peer], *names]) for peer in PEERS if python(peer).exists()}
