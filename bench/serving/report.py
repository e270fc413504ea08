"""The serving benchmark's report, from a results document: the per-endpoint summaries of the runs, the targets
table (throughput and latency ratios against the hand-rolled servers and the best peer), and the Markdown tables of
docs/benchmarks.md. No server runs here: run.py measures, this reads what it wrote (`run --report FILE`)."""

from __future__ import annotations

import statistics
from typing import Any

from bench.serving import peers
from bench.serving.endpoints import FORMAT_SERVERS, SERVERS, modelport_endpoint
from bench.serving.workloads import FORMATS, WORKLOADS

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
                               "target": f"e (gateway) best throughput (concurrency {best['concurrency']}) "
                                         "/ bound >= 0.70",
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
        checks += gateway_targets(rows)
    return checks


def gateway_targets(rows: dict[tuple[str, int], dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 23's targets for the gateway itself on the CNN workload: its CPU per JSON request at 32 clients (the
    web process's CPU time over the run, warm-up included, per request: load() in this module), and the binary
    path against Triton direct at 16 clients (throughput share and the p50 it adds)."""
    checks = []
    json_row = rows.get(("e-gateway-json", 32))
    cpu = json_row["cpu_ms_per_request"].get("gateway") if json_row else None
    if cpu is not None:
        checks.append({"workload": "resnet", "target": "gateway CPU ms per e-gateway-json request at concurrency 32 "
                       "<= 0.6", "value": round(cpu, 3), "met": cpu <= 0.6})
    gateway, direct = rows.get(("e-gateway", 16)), rows.get(("e-direct", 16))
    if gateway and direct:
        share = gateway["throughput"]["median"] / direct["throughput"]["median"]
        added = gateway["p50_ms"]["median"] - direct["p50_ms"]["median"]
        checks.append({"workload": "resnet", "target": "throughput of e-gateway / e-direct at concurrency 16 >= 0.85",
                       "value": round(share, 3), "met": share >= 0.85})
        checks.append({"workload": "resnet", "target": "p50 of e-gateway - p50 of e-direct at concurrency 16 <= 0.5 ms",
                       "value": round(added, 2), "met": added <= 0.5})
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
            lines.append(f"| {server} | " + " | ".join(cells)
                         + f" | {fmt(row['p50_ms'], 1)} | {fmt(row['p95_ms'], 1)} | "
                         f"{fmt(row['p99_ms'], 1)} | {errors} |")
        workload = WORKLOADS[result["number"]]
        steps = list(workload.steps)
        lines += ["", f"Where the time goes at {top} clients (medians): CPU milliseconds per request of each process "
                  "(warm-up included at the measured rate), and per Triton model the mean batch and the queue and "
                  "compute time per request from Triton's statistics (for a peer, the mean batch of its inference "
                  "calls).", "",
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
        lines.append(f"| {check['workload']} | {check['target']} | {check['value']} | "
                     f"{'yes' if check['met'] else 'no'} |")
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
                ratios.append(f"{model_format.title} {via} "
                              f"{own['throughput']['median'] / onnx['throughput']['median']:.2f}x")
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
