"""Does the sandbox slow serving? The digits classifier (ONNX through Modelport's python-backend model, dynamic
batching) on one real tritonserver started plainly and one started in the sandbox, same repository, loaded in
turns (A B A B ...) by tuning/loadgen.py's closed-loop clients straight at Triton (no gateway), so that a busy
machine disturbs both alike.

    .venv/bin/python bench/sandbox_overhead.py [--rounds 3] [--duration 8] [--concurrency 1 16]

Prints one JSON line per run and a summary per setting: median throughput, p50/p99, and the CPU time the server's
processes spent per request, which a busy machine disturbs far less than throughput. Needs the runtime env and a
kernel that can build the sandbox (it says so otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()

    import numpy as np

    from deployments.render import render_repository
    from deployments.runtimes.local import backends, readiness
    from deployments.runtimes.local import triton as lt
    from deployments.spec import DynamicBatching, InstanceGroup, RepositorySpec, ServedModel
    from modelport.core import sandbox
    from modelport.core.runtime_env import find_runtime_env
    from models_registry.samples import DIGITS_SIGNATURE, make_digits_onnx

    env = find_runtime_env(Path(os.environ.get("MODELPORT_RUNTIME_ENV", ROOT / "var" / "runtime-env")).resolve())
    options = sandbox.Options()
    caps = sandbox.check(options)
    if not caps.available:
        print(f"the sandbox is not available here: {caps.reason}", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="sandbox-overhead-"))
    onnx = work / "digits.onnx"
    make_digits_onnx(onnx)
    model = ServedModel(name="digits", version=1, format="onnx", signature=DIGITS_SIGNATURE, max_batch_size=64,
                        dynamic_batching=DynamicBatching(max_queue_delay_microseconds=0),
                        instance_group=InstanceGroup(1),
                        artifact_path=onnx)
    repository = work / "repository"
    render_repository(RepositorySpec(models=(model,)), "local", repository)
    subprocess.run(["chmod", "-R", "a+rX", str(work)], check=True)
    body = work / "request.json"
    row = np.random.default_rng(0).random(64).round(3).tolist()
    body.write_text(json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": row}]}))

    servers: dict[str, lt.ServerProcess] = {}
    try:
        plain_backend = backends.build_backend_dir(env, work / "var")
        servers["plain"] = lt.start_server(repository, work / "plain.log", env, plain_backend)
        sandboxed_backend = backends.build_backend_dir(env, work / "var", sandboxed=True)
        scratch = work / "scratch"
        sandbox.prepare_scratch(scratch, options)
        spec = sandbox.Spec(read_only=(repository, sandboxed_backend, env.root, env.base_prefix), scratch=scratch,
                            tcp_ports=(), egress=False, name="mp-bench",
                            limits=sandbox.cgroups.Limits(4 * 2**30, None, 1024))
        servers["sandboxed"] = lt.start_server(
            repository, work / "sandboxed.log", env, sandboxed_backend, sandbox=sandbox.Sandbox(spec, caps, options),
            env=sandbox.environment([env.bin_dir], scratch,
                                    {"VIRTUAL_ENV": str(env.root), "MODELPORT_SANDBOX_NET": "none"}))
        for name, server in servers.items():
            result = readiness.wait_ready(server, ["digits"], timeout=120)
            assert result.ready, f"{name}: {result.message}"
        results: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for concurrency in args.concurrency:
            for _ in range(args.rounds):
                for name, server in servers.items():
                    cpu_before = cpu_seconds(lt.server_pids(server.pid))
                    out = subprocess.run(
                        [sys.executable, str(ROOT / "tuning" / "loadgen.py"), "--url",
                         f"{server.http_url}/v2/models/digits/infer", "--body", str(body), "--concurrency",
                         str(concurrency), "--duration", str(args.duration), "--warmup", "1"],
                        capture_output=True, text=True, check=True).stdout
                    run = json.loads(out)
                    run["cpu_us_per_request"] = round(
                        (cpu_seconds(lt.server_pids(server.pid)) - cpu_before) / max(1, run["requests"]) * 1e6, 1)
                    print(json.dumps({"server": name, "concurrency": concurrency, **run}))
                    results.setdefault((name, concurrency), []).append(run)
        print("\nmedian of", args.rounds, "runs of", args.duration, "s:")
        for (name, concurrency), runs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            print(f"  c={concurrency:<3} {name:<10} {statistics.median(r['throughput'] for r in runs):8.1f} req/s   "
                  f"p50 {statistics.median(r['p50_ms'] for r in runs):6.2f} ms   "
                  f"p99 {statistics.median(r['p99_ms'] for r in runs):6.2f} ms   "
                  f"CPU {statistics.median(r['cpu_us_per_request'] for r in runs):6.1f} us/request   "
                  f"errors {sum(r['errors'] for r in runs)}")
    finally:
        for server in servers.values():
            lt.stop_server(server.pid, grace_seconds=5)
        if caps.cgroups.version:
            for parent in caps.cgroups.parents.values():
                sandbox.cgroups.remove([parent / "mp-bench"], wait_seconds=2)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    return 0


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of `pids` (while they measure: warm-up requests count too, for both alike)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
