"""Where the gRPC gateway should run: in the uvicorn process beside the HTTP gateway (grpc.aio on uvicorn's uvloop),
or in a process of its own (`manage.py grpc_gateway`). Both are started against the same deployment (the digits
model), and measured interleaved:

- gRPC alone, closed loop at concurrency 1 and 16: throughput, latency, the gateway process's CPU per request;
- gRPC and HTTP at the same time (16 callers each): what each protocol's traffic costs the other's latency.

    .venv/bin/python bench/grpc_placement.py [--duration 6] [--repeats 2]

Writes bench/results/grpc_placement.json and prints a Markdown table (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stack import (  # noqa: E402
    PY,
    ROOT,
    cpu_seconds,
    free_port,
    kserve_binary_body,
    kserve_grpc_request,
    running_stack,
    wait_for_port,
)

RESULTS = ROOT / "bench" / "results"


def grpc_load(target: str, body: Path, metadata: dict[str, str], concurrency: int, duration: float,
              warmup: float) -> subprocess.Popen[str]:
    command = [sys.executable, str(ROOT / "bench" / "grpc_loadgen.py"), "--target", target, "--body", str(body),
               "--concurrency", str(concurrency), "--duration", str(duration), "--warmup", str(warmup)]
    for key, value in metadata.items():
        command += ["--metadata", f"{key}: {value}"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def http_load(url: str, body: Path, headers: dict[str, str], concurrency: int, duration: float,
              warmup: float) -> subprocess.Popen[str]:
    command = [sys.executable, str(ROOT / "tuning" / "loadgen.py"), "--url", url, "--body", str(body),
               "--concurrency", str(concurrency), "--duration", str(duration), "--warmup", str(warmup)]
    for key, value in headers.items():
        command += ["--header", f"{key}: {value}"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def result(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate(timeout=600)
    if process.returncode:
        raise RuntimeError(f"load generator failed ({process.returncode})")
    return json.loads(out)  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    with running_stack() as stack, tempfile.TemporaryDirectory() as tmp:
        from models_registry.samples import make_digits_onnx

        samples = Path(tmp)
        make_digits_onnx(samples / "digits.onnx")
        stack.push("digits", samples / "digits.onnx")
        stack.deploy("digits", [{"model": "digits", "dynamic_batching": {"max_queue_delay_microseconds": 1000},
                                 "instance_group": {"count": 1}}])
        array = np.random.default_rng(0).uniform(0, 16, (1, 64)).astype(np.float32)
        grpc_body = samples / "digits.grpc"
        grpc_body.write_bytes(kserve_grpc_request("digits", "input", array, ["label", "probabilities"]))
        http_body, http_headers = kserve_binary_body("input", array, ["label", "probabilities"])
        (samples / "digits.http").write_bytes(http_body)
        http_headers.update(stack.headers)

        separate_port = free_port()
        stack.start_grpc_gateway(separate_port)
        # The same portal with the gRPC gateway inside its uvicorn process, on its own ports.
        inproc_http, inproc_grpc = free_port(), free_port()
        env = stack.env() | {"BENCH_GRPC_PORT": str(inproc_grpc)}
        log = open(stack.var_dir / "log" / "web-inprocess.log", "ab")  # noqa: SIM115
        stack.processes["web-inprocess"] = subprocess.Popen(
            [PY, "-m", "uvicorn", "bench.grpc_inprocess_asgi:application", "--host", "127.0.0.1", "--port",
             str(inproc_http), "--no-access-log", "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port(inproc_grpc)
        wait_for_port(inproc_http)
        placements: dict[str, dict[str, Any]] = {
            "separate": {"grpc": f"127.0.0.1:{separate_port}", "http": stack.url,
                         "pids": [stack.pid("grpc"), stack.pid("web")]},
            "in-process": {"grpc": f"127.0.0.1:{inproc_grpc}", "http": f"http://127.0.0.1:{inproc_http}",
                           "pids": [stack.pid("web-inprocess")]},
        }
        metadata = {"authorization": f"Bearer {stack.token}", "modelport-deployment": "digits"}
        for repeat in range(args.repeats):
            for concurrency in (1, 16):
                for placement, p in placements.items():
                    before = [cpu_seconds(pid) for pid in p["pids"]]
                    run = result(grpc_load(p["grpc"], grpc_body, metadata, concurrency, args.duration, args.warmup))
                    cpu = cpu_seconds(p["pids"][0]) - before[0]  # the process that runs the gRPC gateway
                    total = run["requests"] + run["errors"]
                    scaled = total * (args.duration + args.warmup) / args.duration if total else 0
                    run.update(kind="grpc", placement=placement, repeat=repeat,
                               cpu_ms_per_request=cpu * 1000 / scaled if scaled else None)
                    runs.append(run)
                    print(f"grpc c={concurrency:<2} {placement:10} {run['throughput']:8.1f} req/s p50 "
                          f"{run['p50_ms'] or 0:6.2f} ms  cpu {run['cpu_ms_per_request'] or 0:.3f} ms/req "
                          f"errors {run['errors']}", flush=True)
            for placement, p in placements.items():
                url = f"{p['http']}/serve/digits/v2/models/digits/infer"
                alone = result(http_load(url, samples / "digits.http", http_headers, 16, args.duration, args.warmup))
                time.sleep(0.5)
                grpc_process = grpc_load(p["grpc"], grpc_body, metadata, 16, args.duration, args.warmup)
                mixed_http = result(http_load(url, samples / "digits.http", http_headers, 16, args.duration,
                                              args.warmup))
                mixed_grpc = result(grpc_process)
                runs.append({"kind": "mixed", "placement": placement, "repeat": repeat, "http_alone": alone,
                             "http": mixed_http, "grpc": mixed_grpc})
                print(f"mixed {placement:10} http alone p50 {alone['p50_ms']:.2f} ms {alone['throughput']:.0f} req/s;"
                      f" with grpc: http p50 {mixed_http['p50_ms']:.2f} p99 {mixed_http['p99_ms']:.2f} ms "
                      f"{mixed_http['throughput']:.0f} req/s, grpc p50 {mixed_grpc['p50_ms']:.2f} ms "
                      f"{mixed_grpc['throughput']:.0f} req/s", flush=True)
    summary = summarize(runs)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "grpc_placement.json").write_text(json.dumps({"runs": runs, "summary": summary}, indent=2))
    print(markdown(summary))
    return 0


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for placement in ("separate", "in-process"):
        row: dict[str, Any] = {"placement": placement}
        for concurrency in (1, 16):
            picked = [r for r in runs if r["kind"] == "grpc" and r["placement"] == placement
                      and r["concurrency"] == concurrency]
            row[f"grpc_c{concurrency}_throughput"] = statistics.median(r["throughput"] for r in picked)
            row[f"grpc_c{concurrency}_p50_ms"] = statistics.median(r["p50_ms"] for r in picked)
            row[f"grpc_c{concurrency}_cpu_ms"] = statistics.median(r["cpu_ms_per_request"] for r in picked)
        mixed = [r for r in runs if r["kind"] == "mixed" and r["placement"] == placement]
        row["http_alone_p50_ms"] = statistics.median(r["http_alone"]["p50_ms"] for r in mixed)
        row["http_mixed_p50_ms"] = statistics.median(r["http"]["p50_ms"] for r in mixed)
        row["http_mixed_p99_ms"] = statistics.median(r["http"]["p99_ms"] for r in mixed)
        row["http_mixed_throughput"] = statistics.median(r["http"]["throughput"] for r in mixed)
        row["grpc_mixed_throughput"] = statistics.median(r["grpc"]["throughput"] for r in mixed)
        row["grpc_mixed_p50_ms"] = statistics.median(r["grpc"]["p50_ms"] for r in mixed)
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| placement | gRPC c=1 req/s | p50 ms | CPU ms/req | gRPC c=16 req/s | p50 ms | CPU ms/req | "
             "HTTP alone p50 ms | HTTP+gRPC: HTTP p50 / p99 ms | HTTP req/s | gRPC req/s | gRPC p50 ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['placement']} | {r['grpc_c1_throughput']:.0f} | {r['grpc_c1_p50_ms']:.2f} | "
            f"{r['grpc_c1_cpu_ms']:.3f} | "
            f"{r['grpc_c16_throughput']:.0f} | {r['grpc_c16_p50_ms']:.2f} | {r['grpc_c16_cpu_ms']:.3f} | "
            f"{r['http_alone_p50_ms']:.2f} | {r['http_mixed_p50_ms']:.2f} / {r['http_mixed_p99_ms']:.2f} | "
            f"{r['http_mixed_throughput']:.0f} | {r['grpc_mixed_throughput']:.0f} | {r['grpc_mixed_p50_ms']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
