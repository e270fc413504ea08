"""A throwaway Modelport for benchmarks: its own var/ directory (SQLite, filesystem broker and artifacts), a web
server (uvicorn), a Celery worker and beat, exactly as `make run` starts them; plus helpers that push models and
deploy them through the REST API the way a user does."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from portal.web_server import UVICORN_HTTP

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def free_port() -> int:
    from deployments.runtimes.local.triton import pick_free_ports

    return pick_free_ports(1)[0]


@dataclass
class Stack:
    var_dir: Path
    url: str
    token: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        response = requests.request(method, f"{self.url}{path}", headers=self.headers, timeout=120, **kwargs)
        if response.status_code >= 400 and response.status_code != 409:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response

    def push(self, model: str, path: Path, signature: dict[str, Any] | None = None, **fields: Any) -> int:
        self.api("POST", "/api/v1/models/", json={"name": model})
        data = {k: str(v) for k, v in fields.items()}
        if signature:
            data["signature"] = json.dumps(signature)
        with open(path, "rb") as f:
            number = self.api("POST", f"/api/v1/models/{model}/versions/", files={"file": (path.name, f)},
                              data=data).json()["number"]
        return self.wait_version(model, number)

    def wait_version(self, model: str, number: int) -> int:
        for _ in range(600):
            version = self.api("GET", f"/api/v1/models/{model}/versions/{number}/").json()
            if version["status"] == "ready":
                return number
            if version["status"] == "invalid":
                raise RuntimeError(f"{model}:{number} is invalid: {version['error']}")
            time.sleep(0.1)
        raise RuntimeError(f"{model}:{number} was not inspected in time")

    def deploy(self, name: str, models: list[dict[str, Any]]) -> dict[str, Any]:
        """Create or re-configure a deployment and wait until it serves the new revision."""
        response = self.api("POST", "/api/v1/deployments/", json={"name": name, "models": models})
        if response.status_code == 409:
            response = self.api("PATCH", f"/api/v1/deployments/{name}/", json={"models": models})
        for _ in range(1200):
            detail = self.api("GET", f"/api/v1/deployments/{name}/").json()
            if detail["status"] == "ready" and detail["serving_revision"] == detail["revision"]:
                return detail
            if detail["status"] == "failed":
                raise RuntimeError(f"{name} failed: {detail['status_message']}")
            time.sleep(0.25)
        raise RuntimeError(f"{name} did not become ready")

    def triton_port(self, name: str) -> int:
        """The deployment's Triton HTTP port (for 'direct' measurements), from the portal's own database."""
        output = self.manage("shell", "-c", (
            "from deployments.models import Deployment;"
            f"print(Deployment.objects.get(name={name!r}).upstream_url.rsplit(':', 1)[1])"))
        return int(output.strip().splitlines()[-1])

    def triton_grpc_target(self, name: str) -> str:
        """The deployment's Triton gRPC endpoint (host:port, for 'direct' gRPC measurements)."""
        output = self.manage("shell", "-c", (
            "from deployments.models import Deployment;"
            f"print(Deployment.objects.get(name={name!r}).grpc_upstream)"))
        return output.strip().splitlines()[-1]

    def start_grpc_gateway(self, port: int) -> None:
        """The gRPC gateway as bin/run-portal starts it (manage.py grpc_gateway), as process "grpc"."""
        log = open(self.var_dir / "log" / "grpc.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.processes["grpc"] = subprocess.Popen([PY, "manage.py", "grpc_gateway", "--port", str(port)], cwd=ROOT,
                                                  env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                                  start_new_session=True)
        wait_for_port(port)

    def manage(self, *args: str) -> str:
        done = subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=self.env(), capture_output=True, text=True)
        if done.returncode != 0:  # the reason, not only the exit status (the stack's directory goes away after)
            raise RuntimeError(f"manage.py {' '.join(args)[:200]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return done.stdout

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "S3_BUCKET")}
        env.update({"MODELPORT_VAR_DIR": str(self.var_dir), "DJANGO_SETTINGS_MODULE": "portal.settings",
                    "GATEWAY_RATE_LIMIT_PER_SECOND": "0", "LOG_LEVEL": "WARNING"})
        return env

    def pid(self, name: str) -> int:
        return self.processes[name].pid


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout:g} s")


def kserve_grpc_request(model: str, name: str, array: Any, outputs: list[str]) -> bytes:
    """A serialized ModelInferRequest with the tensor in raw_input_contents (what tritonclient.grpc sends)."""
    from tritonclient.grpc import service_pb2

    datatype = {"float32": "FP32", "int64": "INT64"}[str(array.dtype)]
    message = service_pb2.ModelInferRequest(model_name=model)
    message.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
    message.raw_input_contents.append(array.tobytes())
    for output in outputs:
        message.outputs.add(name=output)
    return message.SerializeToString()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (from /proc; clock ticks converted to seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> tuple[float, float]:
    """User + system CPU time of a process's main thread (an ASGI server's event loop) and of all its other threads
    together (executors, an exporter's thread), from /proc/<pid>/task; a thread that ended meanwhile is not counted."""
    main = others = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds = (int(fields[11]) + int(fields[12])) / tick
        if task.name == str(pid):
            main += seconds
        else:
            others += seconds
    return main, others


@contextlib.contextmanager
def running_stack(keep: bool = False) -> Iterator[Stack]:
    var_dir = Path(tempfile.mkdtemp(prefix="modelport-bench-"))
    port = free_port()
    stack = Stack(var_dir=var_dir, url=f"http://127.0.0.1:{port}", token="")
    logs = var_dir / "log"
    logs.mkdir()
    try:
        stack.manage("ensure_dirs")  # the var/ layout and a development secret key, as `make run` makes them
        stack.manage("migrate", "--noinput")
        stack.token = stack.manage("create_api_token", "--user", "bench", "--team", "bench", "--create",
                                   "--admin").strip()

        def start(name: str, *command: str) -> None:
            log = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
            stack.processes[name] = subprocess.Popen(command, cwd=ROOT, env=stack.env(), stdout=log,
                                                     stderr=subprocess.STDOUT, start_new_session=True)

        start("worker", PY, "-m", "celery", "-A", "portal", "worker", "-P", "threads", "--concurrency=4",
              "--loglevel=WARNING")
        start("beat", PY, "-m", "celery", "-A", "portal", "beat", "--loglevel=WARNING", "--schedule",
              str(var_dir / "beat-schedule"))
        start("web", PY, "-m", "uvicorn", "portal.asgi:application", "--http", UVICORN_HTTP, "--host", "127.0.0.1",
              "--port", str(port), "--no-access-log", "--log-level", "warning")
        for _ in range(300):
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{stack.url}/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield stack
    finally:
        with contextlib.suppress(Exception):
            for detail in requests.get(f"{stack.url}/api/v1/deployments/", headers=stack.headers, timeout=10).json():
                requests.delete(f"{stack.url}/api/v1/deployments/{detail['name']}/", headers=stack.headers, timeout=60)
        with contextlib.suppress(Exception):
            wait_deleted(stack)
        for process in stack.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in stack.processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        if not keep:
            shutil.rmtree(var_dir, ignore_errors=True)


def wait_deleted(stack: Stack, timeout: float = 120.0) -> None:
    """Wait until the worker has stopped every deployment's Triton and removed its row. A DELETE only asks for that;
    a worker stopped before it is done leaves those Tritons running after the bench, since they run detached (in
    their sandboxes) so that a restarted worker adopts them, and nothing adopts them once this stack's database is
    gone."""
    deadline = time.monotonic() + timeout
    script = "from deployments.models import Deployment; print(Deployment.objects.count())"
    while time.monotonic() < deadline:
        if int(stack.manage("shell", "-c", script).strip().splitlines()[-1]) == 0:
            return
        time.sleep(1)
    print(f"bench: deployments still stopping after {timeout:.0f} s; their Tritons may outlive the bench",
          file=sys.stderr)


def kserve_binary_body(name: str, array: Any, outputs: list[str]) -> tuple[bytes, dict[str, str]]:
    """A KServe v2 request using the binary tensor extension (what tritonclient sends for numpy inputs)."""
    raw = array.tobytes()
    datatype = {"float32": "FP32", "int64": "INT64", "object": "BYTES"}[str(array.dtype)]
    header = json.dumps({
        "inputs": [{"name": name, "shape": list(array.shape), "datatype": datatype,
                    "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
    }).encode()
    return header + raw, {"Inference-Header-Content-Length": str(len(header)),
                          "Content-Type": "application/octet-stream"}
