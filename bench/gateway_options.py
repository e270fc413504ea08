"""Which front end costs the binary path least: the same deployment and the same closed-loop load, straight to Triton
and through each candidate, interleaved, so that the ratios are read within one run on a shared machine:

- `uvicorn`: today's web server (uvicorn, httptools, portal.web_server's guarded protocol, one worker), as
  `make run` starts it;
- `granian`: granian's ASGI interface serving the same `portal.asgi:application` (one worker, HTTP/1.1);
- `nginx`: nginx from the distribution in the data path, proxying to Triton over kept-alive connections, the portal
  deciding access through `auth_request` (a GET of the deployment's `/v2/health/ready` through the portal's
  gateway, which checks the token, the team and the route exactly as for an inference request), each decision
  cached by nginx for 1 s (its cache's granularity is a second), keyed by the Authorization header and the
  deployment.

    .venv/bin/python bench/gateway_options.py [--quick] [--duration 6] [--repeats 3] [--grpc]
    .venv/bin/python bench/gateway_options.py --fronts uvicorn --baseline main   # uvicorn before and after a change

`--fronts` chooses the front ends (nginx and granian are needed only when chosen). `--baseline REF` adds
`uvicorn-before`: the same web server and settings serving `git archive REF` (another web process on the same
database and deployments), measured in the same rounds as the working tree's, so that a change to the Python
gateway is judged against direct and against itself in one sitting.

`--grpc` also measures gRPC: straight to Triton, `manage.py grpc_gateway`, and nginx's `grpc_pass` with the same
`auth_request`. The CPU per request of a front end is its processes' user+system time (/proc) over the run divided by
the requests (for nginx: its master and worker plus the portal process answering the access checks). Writes
bench/results/gateway_options.json (gateway_options-FRONTS[-baseline].json for a partial run) and prints a Markdown
table with the load average before and after.
"""

from __future__ import annotations

import argparse
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

from bench.gateway_json import export, web  # noqa: E402
from bench.gateway_overhead import grpc_load, load  # noqa: E402
from bench.stack import (  # noqa: E402
    PY,
    ROOT,
    Stack,
    cpu_seconds,
    free_port,
    kserve_binary_body,
    kserve_grpc_request,
    running_stack,
    wait_for_port,
)

RESULTS = ROOT / "bench" / "results"
HTTP_ROUTES = ("direct", "uvicorn-before", "uvicorn", "granian", "nginx")
FRONTS = ("uvicorn", "granian", "nginx")
GRPC_ROUTES = ("direct", "grpc_gateway", "nginx")


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and every process below it (granian's and nginx's workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        with contextlib.suppress(OSError):
            total += cpu_seconds(current)
        todo.extend(children.get(current, []))
    return total


def start_granian(stack: Stack, port: int) -> subprocess.Popen[bytes]:
    log = open(stack.var_dir / "log" / "granian.log", "ab")  # noqa: SIM115 - lives as long as the process
    process = subprocess.Popen(
        [PY, "-m", "granian", "--interface", "asgi", "--http", "1", "--no-ws", "--workers", "1", "--host",
         "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log", "portal.asgi:application"],
        cwd=ROOT, env=stack.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for_port(port)
    return process


def nginx_config(directory: Path, http_port: int, grpc_port: int, portal: str,
                 triton_http: dict[str, int], triton_grpc: dict[str, str]) -> str:
    upstreams = "".join(
        f"  upstream triton_{name} {{ server 127.0.0.1:{port}; keepalive 64; }}\n"
        for name, port in triton_http.items())
    upstreams += "".join(
        f"  upstream tritongrpc_{name} {{ server {target}; keepalive 64; }}\n" for name, target in triton_grpc.items())
    auth = f"""
      internal;
      proxy_pass http://{portal}/serve/$deployment/v2/health/ready;
      proxy_method GET;
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
      proxy_set_header Inference-Header-Content-Length "";
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_cache decisions;
      proxy_cache_key "$http_authorization|$deployment";
      proxy_cache_valid 200 1s;
      proxy_cache_lock on;
"""
    return f"""daemon off;
worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {directory}/body;
  proxy_temp_path {directory}/proxy;
  fastcgi_temp_path {directory}/fastcgi;
  uwsgi_temp_path {directory}/uwsgi;
  scgi_temp_path {directory}/scgi;
  proxy_cache_path {directory}/cache levels=1 keys_zone=decisions:1m max_size=10m;
  client_max_body_size 256m;
  client_body_buffer_size 1m;
  client_header_timeout 10s;
  client_body_timeout 60s;
{upstreams}
  server {{
    listen 127.0.0.1:{http_port};
    location ~ ^/serve/(?<deployment>[A-Za-z0-9_-]+)/(?<rest>v2/.*)$ {{
      auth_request /_access;
      proxy_pass http://triton_$deployment/$rest;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Authorization "";
    }}
    location = /_access {{{auth}    }}
  }}
  server {{
    listen 127.0.0.1:{grpc_port} http2;
    set $deployment $http_modelport_deployment;
    location / {{
      auth_request /_access;
      grpc_pass grpc://tritongrpc_$deployment;
      grpc_set_header Authorization "";
    }}
    location = /_access {{{auth}    }}
  }}
}}
"""


def nginx_binary() -> str:
    """Debian puts nginx in /usr/sbin, which a user's PATH may not hold."""
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found is None:
        raise SystemExit("bench/gateway_options.py needs nginx: apt-get install nginx-light (Debian's package)")
    return found


@contextlib.contextmanager
def running_nginx(directory: Path, config: str, http_port: int) -> Any:
    # nginx's workers run as nobody when it is started as root: they need to reach and write their folders.
    directory.mkdir(parents=True, exist_ok=True)
    for folder in (directory.parent, directory):
        folder.chmod(0o755)
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi", "cache"):
        (directory / sub).mkdir(exist_ok=True)
        (directory / sub).chmod(0o777)
    (directory / "nginx.conf").write_text(config)
    nginx = nginx_binary()
    process = subprocess.Popen([nginx, "-p", str(directory), "-c", str(directory / "nginx.conf")],
                               stdout=subprocess.DEVNULL, stderr=open(directory / "stderr.log", "ab"),  # noqa: SIM115
                               start_new_session=True)
    try:
        wait_for_port(http_port)
        yield process
    finally:
        process.send_signal(signal.SIGQUIT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def prepare(stack: Stack, samples: Path, workloads: list[str]) -> dict[str, dict[str, Any]]:
    from models_registry.samples import make_digits_onnx, make_resnet_onnx

    batching = {"max_queue_delay_microseconds": 1000}
    rng = np.random.default_rng(0)
    specs = {
        "cnn": ("resnet", make_resnet_onnx, rng.standard_normal((1, 3, 64, 64)).astype(np.float32), ["logits"]),
        "digits": ("digits", make_digits_onnx, rng.uniform(0, 16, (1, 64)).astype(np.float32),
                   ["label", "probabilities"]),
    }
    prepared = {}
    for deployment in workloads:
        model, make, array, outputs = specs[deployment]
        make(samples / f"{model}.onnx")
        stack.push(model, samples / f"{model}.onnx")
        stack.deploy(deployment, [{"model": model, "dynamic_batching": batching, "instance_group": {"count": 1}}])
        body, headers = kserve_binary_body("input", array, outputs)
        (samples / f"{deployment}.body").write_bytes(body)
        (samples / f"{deployment}.grpc").write_bytes(kserve_grpc_request(model, "input", array, outputs))
        prepared[deployment] = {"model": model, "body": samples / f"{deployment}.body", "headers": headers,
                                "grpc_body": samples / f"{deployment}.grpc",
                                "triton_port": stack.triton_port(deployment),
                                "triton_grpc": stack.triton_grpc_target(deployment)}
    return prepared


def check_access(bases: dict[str, str], name: str, workload: dict[str, Any], token: str,
                 nginx_grpc: str | None) -> None:
    """Every front end answers the team's token and refuses another one, before anything is measured: a front end
    that let everyone through would measure fast for the wrong reason."""
    import grpc
    import requests

    body = workload["body"].read_bytes()
    for route, base in bases.items():
        url = f"{base}/serve/{name}/v2/models/{workload['model']}/infer"
        for bearer, expected in ((token, 200), ("mp_not-a-token", 401)):
            status = requests.post(url, data=body, timeout=30,
                                   headers={**workload["headers"], "Authorization": f"Bearer {bearer}"}).status_code
            if status != expected:
                raise SystemExit(f"{route}: a request with {'the' if bearer == token else 'a wrong'} token was "
                                 f"answered {status}, not {expected}")
    if nginx_grpc is not None:
        with grpc.insecure_channel(nginx_grpc) as channel:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            grpc_body = workload["grpc_body"].read_bytes()
            infer(grpc_body, metadata=[("authorization", f"Bearer {token}"), ("modelport-deployment", name)],
                  timeout=30)
            try:
                infer(grpc_body, metadata=[("authorization", "Bearer mp_not-a-token"), ("modelport-deployment", name)],
                      timeout=30)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
                    raise SystemExit(f"nginx grpc_pass: a wrong token was answered {exc.code()}") from None
            else:
                raise SystemExit("nginx grpc_pass: a call with a wrong token was answered")


def spread(values: list[float | None]) -> dict[str, float]:
    """Median, min and max of the runs that measured something (a run whose every request failed has no p50)."""
    known = [v for v in values if v is not None]
    if not known:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(known), "min": min(known), "max": max(known)}


def loadavg() -> list[float]:
    return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--workloads", nargs="+", choices=["cnn", "digits"], default=["cnn"])
    parser.add_argument("--grpc", action="store_true", help="measure gRPC too (direct, grpc_gateway, nginx)")
    parser.add_argument("--quick", action="store_true", help="3 s runs after 1 s of warm-up, 2 repeats")
    parser.add_argument("--fronts", nargs="+", choices=FRONTS, default=list(FRONTS),
                        help="the front ends to measure beside direct (default: all)")
    parser.add_argument("--baseline", metavar="REF",
                        help="also measure uvicorn serving this commit (git archive), as uvicorn-before")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.warmup, args.repeats = 3.0, 1.0, 2
    if "nginx" in args.fronts:
        nginx_binary()  # before minutes of setting up a portal and its deployments
    if args.grpc and "nginx" not in args.fronts:
        parser.error("--grpc compares grpc_gateway with nginx's grpc_pass: keep nginx in --fronts")
    load_before = loadavg()
    runs: list[dict[str, Any]] = []
    with running_stack() as stack, tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        workloads = prepare(stack, tmpdir, args.workloads)
        granian_port, nginx_port, nginx_grpc_port, grpc_port, before_port = (free_port() for _ in range(5))
        bases = {"uvicorn": stack.url}
        if args.baseline:
            (tmpdir / "before").mkdir()
            commit = export(args.baseline, tmpdir / "before")
            stack.processes["web-before"] = web(stack, tmpdir / "before", before_port,
                                                stack.var_dir / "log" / "web-before.log", None)
            bases["uvicorn-before"] = f"http://127.0.0.1:{before_port}"
            print(f"uvicorn-before serves {commit}", flush=True)
        if "granian" in args.fronts:
            stack.processes["granian"] = start_granian(stack, granian_port)
            bases["granian"] = f"http://127.0.0.1:{granian_port}"
        if args.grpc:
            stack.start_grpc_gateway(grpc_port)
        config = nginx_config(tmpdir / "nginx", nginx_port, nginx_grpc_port, stack.url.removeprefix("http://"),
                              {n: w["triton_port"] for n, w in workloads.items()},
                              {n: w["triton_grpc"] for n, w in workloads.items()})
        with (running_nginx(tmpdir / "nginx", config, nginx_port) if "nginx" in args.fronts
              else contextlib.nullcontext()) as nginx:
            if nginx is not None:
                bases["nginx"] = f"http://127.0.0.1:{nginx_port}"
            cpu_of = {"direct": lambda: 0.0, "uvicorn": lambda: cpu_seconds(stack.pid("web")),
                      "uvicorn-before": lambda: cpu_seconds(stack.pid("web-before")),
                      "granian": lambda: tree_cpu(stack.pid("granian")),
                      # nginx's own processes and the portal's answers to its access checks
                      "nginx": lambda: (tree_cpu(nginx.pid) if nginx is not None else 0.0)
                      + cpu_seconds(stack.pid("web")),
                      "grpc_gateway": lambda: cpu_seconds(stack.pid("grpc")) if args.grpc else 0.0}
            for name, w in workloads.items():
                check_access(bases, name, w, stack.token, f"127.0.0.1:{nginx_grpc_port}" if args.grpc else None)
            plan = [("http", route) for route in HTTP_ROUTES if route == "direct" or route in bases]
            if args.grpc:
                plan += [("grpc", route) for route in GRPC_ROUTES]
            for repeat in range(args.repeats):
                for name, w in workloads.items():
                    for concurrency in args.concurrency:
                        for protocol, route in plan:
                            before = cpu_of[route]()
                            if protocol == "http":
                                headers = dict(w["headers"])
                                path = f"/v2/models/{w['model']}/infer"
                                if route == "direct":
                                    url = f"http://127.0.0.1:{w['triton_port']}{path}"
                                else:
                                    url = f"{bases[route]}/serve/{name}{path}"
                                    headers.update(stack.headers)
                                result = load(url, w["body"], headers, concurrency, args.duration, args.warmup)
                            else:
                                target = {"direct": w["triton_grpc"], "grpc_gateway": f"127.0.0.1:{grpc_port}",
                                          "nginx": f"127.0.0.1:{nginx_grpc_port}"}[route]
                                metadata = {} if route == "direct" else {
                                    "authorization": f"Bearer {stack.token}", "modelport-deployment": name}
                                result = grpc_load(target, w["grpc_body"], metadata, concurrency, args.duration,
                                                   args.warmup)
                            cpu = cpu_of[route]() - before
                            total = result["requests"] + result["errors"]
                            proxied = total * (args.duration + args.warmup) / args.duration if total else 0
                            result.update(workload=name, protocol=protocol, route=route, repeat=repeat,
                                          cpu_ms_per_request=(cpu * 1000 / proxied) if route != "direct" and proxied
                                          else None)
                            runs.append(result)
                            print(f"{name:6} {protocol:4} c={concurrency:<3} {route:12} {result['throughput']:8.1f} "
                                  f"req/s p50 {result['p50_ms'] or 0:7.2f} ms p99 {result['p99_ms'] or 0:7.2f} ms "
                                  f"errors {result['errors']}", flush=True)
    load_after = loadavg()
    summary = summarize(runs)
    RESULTS.mkdir(parents=True, exist_ok=True)
    # A run of some front ends, or against a baseline, does not overwrite the three front ends' results.
    partial = set(args.fronts) != set(FRONTS) or args.baseline
    name = "gateway_options"
    if partial:
        name += f"-{'-'.join(args.fronts)}{'-baseline' if args.baseline else ''}"
    (RESULTS / f"{name}.json").write_text(json.dumps(
        {"load_before": load_before, "load_after": load_after, "args": vars(args), "runs": runs,
         "summary": summary}, indent=2))
    print(f"load average before {load_before}, after {load_after}")
    print(markdown(summary))
    return 0


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each front end against the direct runs of the same repeat (interleaved), as ratios."""
    rows = []
    keys = sorted({(r["workload"], r["protocol"], r["concurrency"]) for r in runs})
    for workload, protocol, concurrency in keys:
        same = [r for r in runs
                if (r["workload"], r["protocol"], r["concurrency"]) == (workload, protocol, concurrency)]
        direct = {r["repeat"]: r for r in same if r["route"] == "direct"}
        for route in dict.fromkeys(r["route"] for r in same if r["route"] != "direct"):
            mine = [r for r in same if r["route"] == route and r["repeat"] in direct]
            if not mine:
                continue
            rows.append({
                "workload": workload, "protocol": protocol, "concurrency": concurrency, "route": route,
                "direct_throughput": spread([direct[r["repeat"]]["throughput"] for r in mine]),
                "throughput": spread([r["throughput"] for r in mine]),
                "ratio": statistics.median(r["throughput"] / direct[r["repeat"]]["throughput"] for r in mine),
                "p50_ms": spread([r["p50_ms"] for r in mine]),
                "added_p50_ms": spread([r["p50_ms"] - direct[r["repeat"]]["p50_ms"] for r in mine
                                        if r["p50_ms"] is not None and direct[r["repeat"]]["p50_ms"] is not None]
                                       )["median"],
                "p99_ms": spread([r["p99_ms"] for r in mine]),
                "cpu_ms_per_request": spread([r["cpu_ms_per_request"] for r in mine]),
                "errors": sum(r["errors"] for r in mine),
            })
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    def fmt(s: dict[str, float], digits: int = 1) -> str:
        return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"

    lines = ["| workload | protocol | conc. | front end | direct req/s | req/s | ratio to direct | p50 ms "
             "| added p50 ms | p99 ms | CPU ms/req | errors |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['protocol']} | {r['concurrency']} | {r['route']} | "
                     f"{fmt(r['direct_throughput'])} | {fmt(r['throughput'])} | {r['ratio']:.2f} | "
                     f"{fmt(r['p50_ms'], 2)} | {r['added_p50_ms']:.2f} | {fmt(r['p99_ms'], 2)} | "
                     f"{fmt(r['cpu_ms_per_request'], 3)} | {r['errors']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
