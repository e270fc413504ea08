"""How much the gateway adds: the same deployment and the same closed-loop load, straight to Triton and through
the gateway, on the CNN sample and on the digits model, at concurrency 1, 16 and 64; over HTTP (/serve/{name}, the
KServe v2 binary extension) and over gRPC (Triton's gRPC port against `manage.py grpc_gateway`, ModelInfer with
raw_input_contents, as tritonclient.grpc sends it).

    .venv/bin/python bench/gateway_overhead.py [--duration 8] [--repeats 3] [--quick] [--protocols http grpc]

Runs are interleaved (direct and gateway alternate) and repeated; medians are reported with their min-max spread.
The gateway's own CPU time per proxied request comes from its process's /proc CPU counters over each run (the web
process for HTTP, the gRPC gateway's process for gRPC). Writes bench/results/gateway_overhead.json and prints a
Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stack import (  # noqa: E402
    ROOT,
    Stack,
    cpu_seconds,
    free_port,
    kserve_binary_body,
    kserve_grpc_request,
    running_stack,
)

RESULTS = ROOT / "bench" / "results"


def load(url: str, body: Path, headers: dict[str, str], concurrency: int, duration: float,
         warmup: float) -> dict[str, Any]:
    command = [sys.executable, str(ROOT / "tuning" / "loadgen.py"), "--url", url, "--body", str(body),
               "--concurrency", str(concurrency), "--duration", str(duration), "--warmup", str(warmup)]
    for key, value in headers.items():
        command += ["--header", f"{key}: {value}"]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output)  # type: ignore[no-any-return]


def grpc_load(target: str, body: Path, metadata: dict[str, str], concurrency: int, duration: float,
              warmup: float) -> dict[str, Any]:
    command = [sys.executable, str(ROOT / "bench" / "grpc_loadgen.py"), "--target", target, "--body", str(body),
               "--concurrency", str(concurrency), "--duration", str(duration), "--warmup", str(warmup)]
    for key, value in metadata.items():
        command += ["--metadata", f"{key}: {value}"]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output)  # type: ignore[no-any-return]


def prepare(stack: Stack, samples: Path, grpc_address: str) -> dict[str, dict[str, Any]]:
    from models_registry.samples import make_digits_onnx, make_resnet_onnx

    make_digits_onnx(samples / "digits.onnx")
    make_resnet_onnx(samples / "resnet.onnx")
    stack.push("digits", samples / "digits.onnx")
    stack.push("resnet", samples / "resnet.onnx")
    batching = {"max_queue_delay_microseconds": 1000}
    stack.deploy("cnn", [{"model": "resnet", "dynamic_batching": batching, "instance_group": {"count": 1}}])
    stack.deploy("digits", [{"model": "digits", "dynamic_batching": batching, "instance_group": {"count": 1}}])
    rng = np.random.default_rng(0)
    workloads = {}
    for deployment, model, array, outputs in [
        ("cnn", "resnet", rng.standard_normal((1, 3, 64, 64)).astype(np.float32), ["logits"]),
        ("digits", "digits", rng.uniform(0, 16, (1, 64)).astype(np.float32), ["label", "probabilities"]),
    ]:
        body, headers = kserve_binary_body("input", array, outputs)
        path = samples / f"{deployment}.body"
        path.write_bytes(body)
        port = stack.triton_port(deployment)
        grpc_body = samples / f"{deployment}.grpc"
        grpc_body.write_bytes(kserve_grpc_request(model, "input", array, outputs))
        workloads[deployment] = {
            "body": path, "headers": headers,
            "direct": f"http://127.0.0.1:{port}/v2/models/{model}/infer",
            "gateway": f"{stack.url}/serve/{deployment}/v2/models/{model}/infer",
            "grpc_body": grpc_body,
            "grpc_direct": stack.triton_grpc_target(deployment),
            "grpc_gateway": grpc_address,
            "grpc_metadata": {"authorization": f"Bearer {stack.token}", "modelport-deployment": deployment},
        }
    return workloads


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--quick", action="store_true", help="3 s runs, 1 repeat: a smoke test of the bench itself")
    parser.add_argument("--protocols", nargs="+", choices=["http", "grpc"], default=["http", "grpc"])
    parser.add_argument("--workloads", nargs="+", choices=["cnn", "digits"], default=["cnn", "digits"])
    args = parser.parse_args()
    if args.quick:
        args.duration, args.warmup, args.repeats = 3.0, 1.0, 1
    runs: list[dict[str, Any]] = []
    with running_stack() as stack, tempfile.TemporaryDirectory() as tmp:
        grpc_port = free_port()
        stack.start_grpc_gateway(grpc_port)
        workloads = prepare(stack, Path(tmp), f"127.0.0.1:{grpc_port}")
        gateway_pids = {"http": stack.pid("web"), "grpc": stack.pid("grpc")}
        for repeat in range(args.repeats):
            for name, w in workloads.items():
                if name not in args.workloads:
                    continue
                for protocol in args.protocols:
                    for concurrency in args.concurrency:
                        for route in ("direct", "gateway"):
                            pid = gateway_pids[protocol]
                            before = cpu_seconds(pid)
                            if protocol == "http":
                                headers = dict(w["headers"])
                                if route == "gateway":
                                    headers.update(stack.headers)
                                result = load(w[route], w["body"], headers, concurrency, args.duration, args.warmup)
                            else:
                                metadata = w["grpc_metadata"] if route == "gateway" else {}
                                result = grpc_load(w[f"grpc_{route}"], w["grpc_body"], metadata, concurrency,
                                                   args.duration, args.warmup)
                            cpu = cpu_seconds(pid) - before
                            total = result["requests"] + result["errors"]
                            # Warm-up requests also cost CPU: count them in by the same rate.
                            proxied = total * (args.duration + args.warmup) / args.duration if total else 0
                            result.update(workload=name, protocol=protocol, route=route, repeat=repeat,
                                          web_cpu_ms_per_request=(cpu * 1000 / proxied)
                                          if route == "gateway" and proxied else None)
                            runs.append(result)
                            print(f"{name:7} {protocol:4} c={concurrency:<3} {route:7} "
                                  f"{result['throughput']:8.1f} req/s "
                                  f"p50 {result['p50_ms'] or 0:7.2f} ms  p99 {result['p99_ms'] or 0:7.2f} ms  "
                                  f"errors {result['errors']}", flush=True)
    summary = summarize(runs, args.concurrency)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gateway_overhead.json").write_text(json.dumps({"runs": runs, "summary": summary}, indent=2))
    print(markdown(summary))
    return 0


def summarize(runs: list[dict[str, Any]], concurrencies: list[int]) -> list[dict[str, Any]]:
    rows = []
    for name, protocol in [(n, p) for n in ("cnn", "digits") for p in ("http", "grpc")]:
        for concurrency in concurrencies:
            pick = {route: [r for r in runs if r["workload"] == name and r.get("protocol", "http") == protocol
                            and r["concurrency"] == concurrency and r["route"] == route]
                    for route in ("direct", "gateway")}
            direct, gateway = pick["direct"], pick["gateway"]
            if not direct or not gateway:
                continue
            rows.append({
                "workload": name, "protocol": protocol, "concurrency": concurrency,
                "direct_throughput": spread([r["throughput"] for r in direct]),
                "gateway_throughput": spread([r["throughput"] for r in gateway]),
                "throughput_ratio": statistics.median(g["throughput"] / d["throughput"]
                                                      for d, g in zip(direct, gateway, strict=True)),
                "direct_p50_ms": spread([r["p50_ms"] for r in direct]),
                "gateway_p50_ms": spread([r["p50_ms"] for r in gateway]),
                "added_p50_ms": statistics.median(g["p50_ms"] - d["p50_ms"]
                                                  for d, g in zip(direct, gateway, strict=True)),
                "direct_p99_ms": spread([r["p99_ms"] for r in direct]),
                "gateway_p99_ms": spread([r["p99_ms"] for r in gateway]),
                "gateway_cpu_ms_per_request": spread([r["web_cpu_ms_per_request"] for r in gateway]),
                "errors": sum(r["errors"] for r in direct + gateway),
            })
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    def fmt(s: dict[str, float], digits: int = 1) -> str:
        return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"

    lines = ["| workload | protocol | conc. | direct req/s | gateway req/s | ratio | direct p50 ms | gateway p50 ms | "
             "added p50 ms | gateway CPU ms/req | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['protocol']} | {r['concurrency']} | {fmt(r['direct_throughput'])} | "
                     f"{fmt(r['gateway_throughput'])} | "
                     f"{r['throughput_ratio']:.2f} | {fmt(r['direct_p50_ms'], 2)} | {fmt(r['gateway_p50_ms'], 2)} | "
                     f"{r['added_p50_ms']:.2f} | {fmt(r['gateway_cpu_ms_per_request'], 3)} | {r['errors']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
