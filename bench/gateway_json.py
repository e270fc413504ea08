"""The gateway's CPU per KServe v2 JSON request, end to end: the CNN sample's JSON request (1x3x64x64 FP32 written
out by json.dumps, about 253 KB, what bench/serving sends as e-gateway-json) sent by tuning/loadgen.py's closed
loop to the real web process (uvicorn with portal.web_server's protocol and portal.asgi, as bin/run-portal starts
it: the token check, the route, the body check and transcoding, the upstream request, the answer's check, the
statistics), in front of a stand-in for Triton that answers every request with the CNN's answer (10 logits) at
once, so that the gateway's process is what is measured. Its CPU time over a run (from /proc) divided by the
requests it served, warm-up included (as bench/serving/run.py's load() counts it).

Before and after in one run: `--baseline REF` (default: the commit where this branch left main) is exported with
`git archive` to a temporary directory and served by a second web process on the same database; the two are
measured in turn, --repeat times, so that a change in the machine's load touches both alike.

    .venv/bin/python bench/gateway_json.py                          # ~2 min: 16 and 32 clients, 3 rounds of 4 s
    .venv/bin/python bench/gateway_json.py --clients 32 --repeat 5 --baseline main
    .venv/bin/python bench/gateway_json.py --binary        # and the same tensor as binary, for the rest's cost
    .venv/bin/python bench/gateway_json.py --binary-only   # the binary request alone (the thin gateway's path)
    .venv/bin/python bench/gateway_json.py --no-baseline --profile var/gateway-json.prof   # cProfile of the web process
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stack import PY, ROOT, Stack, free_port, wait_for_port  # noqa: E402
from portal.web_server import UVICORN_HTTP  # noqa: E402

MODEL = "resnet"
DEPLOYMENT = "cnn-json"


def cnn_body() -> bytes:
    image = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    return json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 64, 64], "datatype": "FP32",
                                   "data": image.reshape(-1).tolist()}]}).encode()


def cnn_binary_body() -> tuple[bytes, dict[str, str]]:
    """The same tensor in the binary tensor extension, as tritonclient sends it (the answer still JSON)."""
    image = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    header = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 64, 64], "datatype": "FP32",
                                     "parameters": {"binary_data_size": image.nbytes}}]}).encode()
    return header + image.tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                      "Content-Type": "application/octet-stream"}


def cnn_answer() -> bytes:
    logits = np.random.default_rng(1).standard_normal(10).astype(np.float32)
    return json.dumps({"model_name": MODEL, "model_version": "1", "outputs": [
        {"name": "logits", "datatype": "FP32", "shape": [1, 10], "data": logits.tolist()}]},
        separators=(",", ":")).encode()  # compact, as Triton writes it


# --- The stand-in for Triton (its own process: its CPU is not the gateway's) ------------------------------------


def serve_upstream(port: int) -> None:
    """An HTTP/1.1 keep-alive server that reads each request whole (httptools, as uvicorn parses) and answers with
    the CNN's answer; counts the requests by Content-Type, printed to stdout on SIGTERM."""
    import httptools

    answer = cnn_answer()
    response = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(answer)
                + answer)
    seen: dict[str, int] = {}

    class Connection(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.content_type = ""

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_header(self, name: bytes, value: bytes) -> None:
            if name.lower() == b"content-type":
                self.content_type = value.decode("latin-1")

        def on_message_complete(self) -> None:
            seen[self.content_type] = seen.get(self.content_type, 0) + 1
            self.transport.write(response)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = loop.create_future()
        loop.add_signal_handler(signal.SIGTERM, stop.set_result, None)
        server = await loop.create_server(Connection, "127.0.0.1", port)
        async with server:
            await stop
        print(json.dumps(seen), flush=True)

    asyncio.run(main())


# --- The portal ---------------------------------------------------------------------------------------------------


SETUP = """
from accounts.models import Team
from deployments.model_entry import ModelEntry
from deployments.models import Deployment, Revision
from deployments.revision_spec import RevisionSpec
from models_registry.samples import RESNET_SIGNATURE
team = Team.objects.get(name="bench")
spec = RevisionSpec(runtime="local", models=(ModelEntry(name="{model}", version=1, format="onnx",
                    signature=RESNET_SIGNATURE, max_batch_size=8),)).to_json()
deployment = Deployment.objects.create(team=team, name="{name}", upstream_url="{url}", status=Deployment.Status.READY)
revision = Revision.objects.create(deployment=deployment, number=1, spec=spec)
Deployment.objects.filter(pk=deployment.pk).update(serving_revision=revision, revision=revision)
"""


def web(stack: Stack, source: Path, port: int, log: Path, profile: Path | None) -> subprocess.Popen[bytes]:
    command = [PY, "-m", "uvicorn", "portal.asgi:application", "--http", UVICORN_HTTP, "--host", "127.0.0.1",
               "--port", str(port), "--no-access-log", "--log-level", "warning"]
    if profile is not None:
        command[1:3] = ["-m", "cProfile", "-o", str(profile), "-m", "uvicorn"]
    env = {**stack.env(), "PYTHONPATH": str(source)}
    with open(log, "ab") as out:
        process = subprocess.Popen(command, cwd=source, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    wait_for_port(port, timeout=60)
    return process


def export(ref: str, into: Path) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.strip()
    archive = subprocess.Popen(["git", "archive", commit], cwd=ROOT, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    return commit


def user_system(pid: int) -> tuple[float, float]:
    """A process's user and system CPU seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


_TICK = os.sysconf("SC_CLK_TCK")


def load(url: str, body: Path, headers: dict[str, str], clients: int, duration: float, warmup: float,
         pid: int) -> dict[str, Any]:
    command = [PY, str(ROOT / "tuning" / "loadgen.py"), "--url", url, "--body", str(body), "--concurrency",
               str(clients), "--duration", str(duration), "--warmup", str(warmup)]
    for name, value in headers.items():
        command += ["--header", f"{name}: {value}"]
    before = user_system(pid)
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    user, system = (after - was for after, was in zip(user_system(pid), before, strict=True))
    cpu = user + system
    result: dict[str, Any] = json.loads(done.stdout)
    if result["errors"] or not result["requests"]:
        raise RuntimeError(f"the gateway refused requests: {result['error_samples']}")
    served = result["requests"] * (duration + warmup) / duration  # the warm-up's requests cost CPU too
    result["cpu_ms_per_request"] = cpu * 1000 / served
    result["system_share"] = system / cpu if cpu else 0.0  # the kernel's part: the sockets' reads and writes
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", default=None, help="the 'before' commit (default: git merge-base HEAD main)")
    parser.add_argument("--binary", action="store_true",
                        help="also send the same tensor in the binary tensor extension "
                             "(the gateway's cost without JSON)")
    parser.add_argument("--binary-only", action="store_true",
                        help="send only the binary tensor extension's request (the thin gateway's path)")
    parser.add_argument("--no-baseline", action="store_true", help="measure the working tree only")
    parser.add_argument("--profile", type=Path, help="run the working tree's web process under cProfile, into FILE")
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return 0

    var_dir = Path(tempfile.mkdtemp(prefix="modelport-gwjson-"))
    stack = Stack(var_dir=var_dir, url="", token="")
    processes: list[subprocess.Popen[bytes]] = []
    upstream: subprocess.Popen[bytes] | None = None
    try:
        upstream_port = free_port()
        upstream = subprocess.Popen([PY, __file__, "--serve-upstream", str(upstream_port)], stdout=subprocess.PIPE)
        wait_for_port(upstream_port)
        stack.manage("ensure_dirs")
        stack.manage("migrate", "--noinput")
        token = stack.manage("create_api_token", "--user", "bench", "--team", "bench", "--create",
                             "--admin").strip()
        stack.manage("shell", "-c", SETUP.format(model=MODEL, name=DEPLOYMENT,
                                                 url=f"http://127.0.0.1:{upstream_port}"))
        auth = {"Authorization": f"Bearer {token}"}
        (var_dir / "cnn.json").write_bytes(cnn_body())
        size = (var_dir / "cnn.json").stat().st_size
        requests = {"JSON": (var_dir / "cnn.json", {**auth, "Content-Type": "application/json"})}
        if args.binary_only:
            requests.clear()
        if args.binary or args.binary_only:
            binary, headers = cnn_binary_body()
            (var_dir / "cnn.bin").write_bytes(binary)
            requests["binary"] = (var_dir / "cnn.bin", {**auth, **headers})

        sources: dict[str, Path] = {}
        if not args.no_baseline:
            ref = args.baseline or subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=ROOT, check=True,
                                                  capture_output=True, text=True).stdout.strip()
            (var_dir / "before").mkdir()
            sources[f"before ({export(ref, var_dir / 'before')})"] = var_dir / "before"
        sources["after (working tree)"] = ROOT
        servers: dict[str, tuple[str, int]] = {}
        for label, source in sources.items():
            port = free_port()
            profile = args.profile.resolve() if args.profile and source == ROOT else None
            process = web(stack, source, port, var_dir / f"web-{port}.log", profile)
            processes.append(process)
            print(f"{label}: web process {process.pid} on port {port}", file=sys.stderr, flush=True)
            servers[label] = (f"http://127.0.0.1:{port}/serve/{DEPLOYMENT}/v2/models/{MODEL}/infer", process.pid)

        load_before = os.getloadavg()[0]
        runs: dict[tuple[str, str, int], list[dict[str, Any]]] = {
            (s, r, c): [] for r in requests for s in servers for c in args.clients}
        for round_ in range(args.repeat):
            for clients in args.clients:
                # Alternate which goes first, so that neither always follows the other's after-effects.
                order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
                for kind, (body, headers) in requests.items():
                    for label in order:
                        url, pid = servers[label]
                        runs[(label, kind, clients)].append(load(url, body, headers, clients, args.duration,
                                                                 args.warmup, pid))
        load_after = os.getloadavg()[0]
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGINT if args.profile else signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        seen = ""
        if upstream is not None:
            upstream.terminate()
            seen = upstream.communicate(timeout=10)[0].decode().strip()
        shutil.rmtree(var_dir, ignore_errors=True)

    print(f"CNN JSON request: {size:,} bytes; "
          f"{args.repeat} rounds of {args.duration:g} s (+{args.warmup:g} s warm-up); load average "
          f"{load_before:.2f} before, {load_after:.2f} after; upstream saw {seen}")
    print("| gateway | request | clients | CPU ms per request (median, runs) | of it in the kernel | req/s | p50 ms "
          "| p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for (label, kind, clients), results in runs.items():
        cpu = [r["cpu_ms_per_request"] for r in results]
        print(f"| {label} | {kind} | {clients} | {statistics.median(cpu):.3f} ({min(cpu):.3f}-{max(cpu):.3f}) | "
              f"{statistics.median(r['system_share'] for r in results):.0%} | "
              f"{statistics.median(r['throughput'] for r in results):.0f} | "
              f"{statistics.median(r['p50_ms'] for r in results):.1f} | "
              f"{statistics.median(r['p99_ms'] for r in results):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
