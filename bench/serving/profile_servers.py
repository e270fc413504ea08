"""Where the time goes: py-spy samples of every Python process that serves one workload at one concurrency, for the
hand-rolled Tornado server (a) and for Modelport configuration e through the gateway (the web process and each
Triton python-backend stub), while tuning/loadgen.py keeps the load on.

    .venv/bin/python bench/serving/profile_servers.py [--workload digits] [--concurrency 32] [--seconds 8]

py-spy comes with the bench env (bench/requirements-bench.txt) and needs to ptrace the processes (root here).
Prints, per process, the share of samples by leaf function and the share of samples that pass through a few
functions of interest; writes the folded stacks to bench/results/profile-<workload>-<server>-<process>.folded
(speedscope or flamegraph.pl open them) and a summary to bench/results/serving-profile-<workload>.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from bench.serving import procs, run  # noqa: E402
from bench.serving.kserve import encode_request  # noqa: E402
from bench.serving.workloads import WORKLOADS, request_inputs  # noqa: E402
from bench.stack import ROOT, running_stack  # noqa: E402

PY_SPY = run.BENCH_ENV / "bin" / "py-spy"
# Frames whose inclusive share is reported (substrings of "function (file)").
INTEREST = {
    "digit_features (PNG decode, 8x8 features)": "digit_features",
    "top_k (post-processing)": "top_k (",
    "onnxruntime session.run": "run (onnxruntime",
    "tokenize": "tokenize (",
    "mean_pool": "mean_pool (",
    "KServe decode/encode (hand-rolled)": "kserve.py",
    "Tornado HTTP": "tornado/",
    "Triton python backend: reading/writing tensors": "triton_python_backend_utils",
    "gateway (our code)": "gateway/",
    "uvicorn / asyncio": "uvicorn/",
}


def summarize(folded: Path) -> dict[str, Any]:
    leaves: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        # py-spy's idle frames (waiting in select/epoll) are kept with --idle; without it they are absent.
        leaves[frames[-1]] += n
        for label, needle in INTEREST.items():
            if any(needle in frame for frame in frames):
                inclusive[label] += n
    return {"samples": total,
            "top_leaves": [(name, round(100 * n / total, 1)) for name, n in leaves.most_common(12)] if total else [],
            "through": {label: round(100 * n / total, 1) for label, n in inclusive.most_common()} if total else {}}


def record(pids: dict[str, int], seconds: float, out: Path) -> dict[str, subprocess.Popen[bytes]]:
    return {name: subprocess.Popen([str(PY_SPY), "record", "--pid", str(pid), "--duration", str(int(seconds)),
                                    "--rate", "250", "--format", "raw", "--nonblocking", "--output",
                                    str(out / f"{name}.folded")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for name, pid in pids.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="digits", choices=[w.key for w in WORKLOADS.values()])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    workload = next(w for w in WORKLOADS.values() if w.key == args.workload)
    report: dict[str, Any] = {"workload": workload.key, "concurrency": args.concurrency, "seconds": args.seconds}
    with running_stack() as stack, tempfile.TemporaryDirectory(prefix="serving-profile-") as tmp:
        work = Path(tmp)
        artifacts = work / workload.key
        run.prepare(workload, stack, artifacts)
        name = workload.deployment("e")
        stack.deploy(name, workload.deploy_models("e", 0))
        triton = run.triton_pid(stack, name)
        body, headers = encode_request(request_inputs(workload, artifacts), list(workload.outputs))
        body_path = work / "request.body"
        body_path.write_bytes(body)
        with run.handrolled_servers(workload, artifacts, stack.var_dir / "log") as handrolled:
            process, port = handrolled["a"]
            stubs = {}
            for pid in procs.descendants(triton)[1:]:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"triton_python_backend_stub" in cmdline[0]:
                    # The stub's arguments: the model.py path (…/<model>/<version>/model.py), then the instance name.
                    model = Path(cmdline[1].decode()).parent.parent.name
                    stubs[f"stub-{model}-{len([s for s in stubs if model in s])}"] = pid
            targets = {
                "a": ({"tornado": process.pid}, f"http://127.0.0.1:{port}/v2/models/{workload.model}/infer", headers),
                "e-gateway": ({"gateway": stack.pid("web"), **stubs},
                              f"{stack.url}/serve/{name}/v2/models/{workload.model}/infer",
                              {**headers, **stack.headers}),
            }
            for server, (pids, url, request_headers) in targets.items():
                out = work / server
                out.mkdir()
                command = [sys.executable, str(ROOT / "tuning" / "loadgen.py"), "--url", url, "--body", str(body_path),
                           "--concurrency", str(args.concurrency), "--duration", str(args.seconds + 1), "--warmup", "1"]
                for key, value in request_headers.items():
                    command += ["--header", f"{key}: {value}"]
                load = subprocess.Popen(command, stdout=subprocess.PIPE)
                time.sleep(1.5)  # past the load generator's start and warm-up
                spies = record(pids, args.seconds, out)
                for spy in spies.values():
                    spy.wait()
                result = json.loads(load.communicate()[0])
                report[server] = {"load": {k: result[k] for k in ("throughput", "p50_ms", "p99_ms", "errors")},
                                  "processes": {}}
                for process_name in pids:
                    folded = out / f"{process_name}.folded"
                    if not folded.exists():
                        stderr = spies[process_name].stderr.read().decode()  # type: ignore[union-attr]
                        report[server]["processes"][process_name] = {"error": stderr[-300:]}
                        continue
                    target = run.RESULTS / f"profile-{workload.key}-{server}-{process_name}.folded"
                    target.write_text(folded.read_text())
                    report[server]["processes"][process_name] = summarize(folded)
    (run.RESULTS / f"serving-profile-{workload.key}.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
