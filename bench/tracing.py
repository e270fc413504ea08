"""What tracing costs the gateway (issue 34): its CPU per request for the same closed-loop /infer workload with
tracing off and with tracing on at 100 % sampling, exporting to an OTLP receiver, in one run.

    .venv/bin/python bench/tracing.py [--concurrency 8] [--duration 5] [--repeats 3] [--ratio 0.01] [--output PATH]

A throwaway Modelport (bench/stack.py) deploys the digits model (ONNX, as bench/gateway_overhead.py does). Three web
processes serve the same database, each started alike as `make run` starts one: tracing off (no OTEL_* variable);
tracing on with OTEL_EXPORTER_OTLP_ENDPOINT pointing at a receiver in this process (an OTLP/HTTP sink that answers
200 and counts the spans it is sent) and OTEL_TRACES_SAMPLER=always_on; and (--ratio, default 0.01) sampling that
share of its requests (parentbased_traceidratio), what docs/observability.md advises where full sampling costs too
much. The Triton is started by the worker without tracing, so only the gateway's side differs. The sides alternate,
--repeats times each; per run the web process's CPU time (/proc) over the requests tuning/loadgen.py completed, split
into its main thread's (the event loop: the gateway and the spans it makes) and its other threads' (the span
exporter's), and its garbage collector's time per generation and longest full collection (bench/gc_probe, on each
web process's PYTHONPATH). Reported: each side's median CPU per request, its ratio to off, and the spans received
against the requests sent to the traced sides.

"Off costs nothing measurable" is judged by what the off path is: `tracing.tracer is not None`, checked once per
request (gateway/app.py) and once per upstream call (gateway/upstream.py). The two checks are timed here with
timeit and set against the off side's CPU per request.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stack import (  # noqa: E402
    PY,
    ROOT,
    Stack,
    cpu_seconds,
    free_port,
    kserve_binary_body,
    running_stack,
    thread_cpu_seconds,
    wait_for_port,
)
from portal.web_server import UVICORN_HTTP  # noqa: E402

RESULTS = ROOT / "bench" / "results"
GC_PROBE = ROOT / "bench" / "gc_probe"
GC_PROBE_OUT = Path(tempfile.mkdtemp(prefix="gc-probe-"))


class Sink:
    """An OTLP/HTTP receiver that keeps nothing but counts: exports, spans (in all and per service name), bytes."""

    def __init__(self) -> None:
        self.exports = self.spans = self.bytes = 0
        self.by_service: dict[str, int] = {}
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with sink.lock:
                    sink.exports += 1
                    sink.bytes += len(body)
                    for resource in request.resource_spans:
                        service = next((a.value.string_value for a in resource.resource.attributes
                                        if a.key == "service.name"), "")
                        count = sum(len(scope.spans) for scope in resource.scope_spans)
                        sink.spans += count
                        sink.by_service[service] = sink.by_service.get(service, 0) + count
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


def start_web(stack: Stack, sink: Sink, name: str, ratio: float | None) -> str:
    """A web process on the stack's database, as `make run` starts one, with the garbage collector's probe
    (bench/gc_probe); tracing `ratio` of its requests (by trace id) to the sink, or off for None: its URL."""
    port = free_port()
    tracing = {} if ratio is None else {
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_SERVICE_NAME": name,
        **({"OTEL_TRACES_SAMPLER": "always_on"} if ratio >= 1 else
           {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": str(ratio)})}
    env = {**stack.env(), **tracing, "MODELPORT_GC_PROBE_DIR": str(GC_PROBE_OUT),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(GC_PROBE), os.environ.get("PYTHONPATH", "")]))}
    log = open(stack.var_dir / "log" / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
    stack.processes[name] = subprocess.Popen(
        [PY, "-m", "uvicorn", "portal.asgi:application", "--http", UVICORN_HTTP, "--host", "127.0.0.1", "--port",
         str(port), "--no-access-log", "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for_port(port)
    return f"http://127.0.0.1:{port}"


def gc_totals(pid: int, timeout: float = 10.0) -> dict[str, list[float]]:
    """The probe's sums of a web process's collections so far (bench/gc_probe): asked by SIGUSR2, read once the
    process has written them (its handler runs at its next bytecode)."""
    path = GC_PROBE_OUT / f"{pid}.json"
    path.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"web process {pid} wrote no gc figures in {timeout:g} s")
        time.sleep(0.02)
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def load(url: str, body: Path, headers: dict[str, str], concurrency: int, duration: float,
         warmup: float) -> dict[str, Any]:
    command = [PY, str(ROOT / "tuning" / "loadgen.py"), "--url", url, "--body", str(body),
               "--concurrency", str(concurrency), "--duration", str(duration), "--warmup", str(warmup)]
    for key, value in headers.items():
        command += ["--header", f"{key}: {value}"]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)  # type: ignore[no-any-return]


def none_checks_ns() -> float:
    """The off path's whole cost per request: its two `tracing.tracer is not None` checks, in nanoseconds."""
    from infra import tracing

    assert tracing.tracer is None

    def two_checks() -> None:
        if tracing.tracer is not None:
            raise AssertionError
        if tracing.tracer is not None:
            raise AssertionError

    def nothing() -> None:
        pass

    number = 1_000_000
    checks = min(timeit.repeat(two_checks, number=number, repeat=5))
    empty = min(timeit.repeat(nothing, number=number, repeat=5))  # the call itself, which the gateway does not pay
    return max(0.0, (checks - empty) / number * 1e9)


def span_costs(n: int = 20000) -> dict[str, float]:
    """Where the traced side's time goes, in this process (CPU time per span): a span as the gateway makes one (seven
    attributes, renamed) to an in-memory exporter, then the OTLP protobuf encoding of those spans in batches of 512
    (the batch processor's size). The rest of the difference is the export's HTTP and the context propagation."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench")
    attributes: dict[str, str | int] = {
        "modelport.team.id": 1, "modelport.deployment": "digits", "modelport.revision": 1, "modelport.model": "digits",
        "http.response.status_code": 200, "http.request.body.size": 300, "http.response.body.size": 200}

    def one() -> None:
        with tracer.start_as_current_span("POST /serve/", kind=SpanKind.SERVER) as span:
            span.set_attribute("http.request.method", "POST")
            for key, value in attributes.items():
                span.set_attribute(key, value)
            span.update_name("POST infer")

    for _ in range(1000):
        one()
    memory.clear()
    started = time.process_time()
    for _ in range(n):
        one()
    made = time.process_time()
    spans = memory.get_finished_spans()
    encoding = time.process_time()
    for i in range(0, n, 512):
        encode_spans(spans[i:i + 512]).SerializeToString()
    encoded = time.process_time()
    provider.shutdown()
    return {"span": round((made - started) / n * 1e6, 1), "encode": round((encoded - encoding) / n * 1e6, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per run")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3, help="runs per side, alternating off and on")
    parser.add_argument("--ratio", type=float, default=0.01,
                        help="a third side sampling this ratio (parentbased_traceidratio); 0 for none")
    parser.add_argument("--output", type=Path, default=RESULTS / "tracing.json")
    args = parser.parse_args()
    from models_registry.samples import make_digits_onnx

    result: dict[str, Any] = {"concurrency": args.concurrency, "ratio": args.ratio, "duration_s": args.duration,
                              "repeats": args.repeats, "load_average_before": [round(x, 2) for x in os.getloadavg()],
                              "runs": []}
    sink = Sink()
    with tempfile.TemporaryDirectory(prefix="tracing-bench-") as tmp, running_stack() as stack:
        work = Path(tmp)
        make_digits_onnx(work / "digits.onnx")
        stack.push("digits", work / "digits.onnx")
        stack.deploy("digits", [{"model": "digits", "dynamic_batching": {"max_queue_delay_microseconds": 1000},
                                 "instance_group": {"count": 1}}])
        array = np.random.default_rng(0).uniform(0, 16, (1, 64)).astype(np.float32)
        body, body_headers = kserve_binary_body("input", array, ["label", "probabilities"])
        body_path = work / "digits.body"
        body_path.write_bytes(body)
        headers = {**stack.headers, **body_headers}
        # Each side a web process of its own, started alike (the stack's own web process serves none of them).
        sides = {"off": (start_web(stack, sink, "web_off", None), "web_off"),
                 "on": (start_web(stack, sink, "web_traced", 1.0), "web_traced")}
        if args.ratio:
            sides["ratio"] = (start_web(stack, sink, "web_ratio", args.ratio), "web_ratio")
        warmed = {}
        for side, (base, _) in sides.items():  # not measured: the measured runs' CPU covers their requests only
            warmed[side] = load(f"{base}/serve/digits/v2/models/digits/infer", body_path, headers, args.concurrency,
                                args.warmup, 0)["requests"]
        for repeat in range(args.repeats):
            for side, (base, process) in sides.items():
                pid = stack.pid(process)
                gc_before = gc_totals(pid)
                cpu_before, threads_before = cpu_seconds(pid), thread_cpu_seconds(pid)
                figures = load(f"{base}/serve/digits/v2/models/digits/infer", body_path, headers, args.concurrency,
                               args.duration, 0)
                spent = cpu_seconds(pid) - cpu_before
                main, others = (after - before for after, before in zip(thread_cpu_seconds(pid), threads_before,
                                                                        strict=True))
                gc_after = gc_totals(pid)
                sent = figures["requests"] + figures["errors"]
                run = {"side": side, "repeat": repeat, **figures, "cpu_s": round(spent, 3),
                       "cpu_us_per_request": round(spent / sent * 1e6, 1) if sent else None,
                       # Where it was spent: the event loop's thread, and the others (the span exporter's thread)
                       "main_thread_us_per_request": round(main / sent * 1e6, 1) if sent else None,
                       "other_threads_us_per_request": round(others / sent * 1e6, 1) if sent else None,
                       # The garbage collector's share, per generation (0, 1, 2), and its longest full collection
                       "gc_collections": [int(a - b) for a, b in zip(gc_after["count"], gc_before["count"],
                                                                     strict=True)],
                       "gc_us_per_request": [round((a - b) / sent * 1e6, 2) if sent else None for a, b in
                                             zip(gc_after["seconds"], gc_before["seconds"], strict=True)],
                       "gc_longest_full_ms": round(gc_after["longest"][2] * 1e3, 2)}
                result["runs"].append(run)
                print(json.dumps(run), flush=True)
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    result["summary"] = summarize(result["runs"])
    # Every request sent to each side, warm-up included, against the spans it exported (its last batch on exit).
    sent = {side: warmed[side] + sum(r["requests"] + r["errors"] for r in result["runs"] if r["side"] == side)
            for side in sides}
    result["summary"]["sink"] = {"exports": sink.exports, "spans": sink.spans, "bytes": sink.bytes, "sides": {
        side: {"requests_sent": sent[side], "spans_received": sink.by_service.get(process, 0)}
        for side, (_, process) in sides.items()}}
    result["summary"]["in_process_us_per_span"] = span_costs()
    result["summary"]["off_path_two_checks_ns"] = round(none_checks_ns(), 1)
    off = result["summary"]["off"]["cpu_us_per_request_median"]
    result["summary"]["off_path_share_of_request_cpu"] = (
        round(result["summary"]["off_path_two_checks_ns"] / 1000 / off, 6) if off else None)
    sink.server.shutdown()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for side in ("off", "on", "ratio"):
        mine = [r for r in runs if r["side"] == side and r["cpu_us_per_request"]]
        if not mine:
            continue
        cpu = [r["cpu_us_per_request"] for r in mine]
        summary[side] = {"cpu_us_per_request_median": statistics.median(cpu) if cpu else None,
                         "cpu_us_per_request_min_max": [min(cpu), max(cpu)] if cpu else None,
                         "main_thread_us_per_request_median": statistics.median(
                             r["main_thread_us_per_request"] for r in mine),
                         "other_threads_us_per_request_median": statistics.median(
                             r["other_threads_us_per_request"] for r in mine),
                         "gc_us_per_request_median": [statistics.median(r["gc_us_per_request"][g] for r in mine)
                                                      for g in range(3)],
                         "gc_full_collections": sum(r["gc_collections"][2] for r in mine),
                         "gc_longest_full_ms": max(r["gc_longest_full_ms"] for r in mine),
                         "throughput_median": statistics.median(r["throughput"] for r in mine) if mine else None,
                         "p50_ms_median": statistics.median(r["p50_ms"] for r in mine) if mine else None,
                         "errors": sum(r["errors"] for r in runs if r["side"] == side)}
    off, on = summary["off"]["cpu_us_per_request_median"], summary["on"]["cpu_us_per_request_median"]
    if off and on:
        summary["on_over_off"] = round(on / off, 3)
        summary["on_minus_off_us"] = round(on - off, 1)
    ratio = summary.get("ratio", {}).get("cpu_us_per_request_median")
    if off and ratio:
        summary["ratio_over_off"] = round(ratio / off, 3)
    traced = [r for r in runs if r["side"] == "on"]
    summary["on_requests_measured"] = sum(r["requests"] for r in traced)
    return summary


if __name__ == "__main__":
    sys.exit(main())
