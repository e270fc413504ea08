"""The bound: the most this CPU gives for a workload with no server at all. onnxruntime in this process, onnxruntime's
default session options, the workload's requests stacked into batches of 1 to 64, each batch size run for a fixed
time; the best batch size's rate is the bound. Runs in the bench env:

    var/bench-env/bin/python bench/serving/bound.py --workload minilm --artifacts DIR [--seconds 1.5]

Prints one JSON object, per batch size: `pipeline` items/s (pre-processing + model + post-processing, what a
server does per request, so comparable with the servers) and `model` items/s (the ONNX session alone on
pre-processed inputs); and the best of each with its batch size. With `--answer`: the one request's answer
(batch 1) as a KServe v2 JSON response instead, the reference every server's answer is checked against.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kserve import encode_response  # noqa: E402
from workloads import WORKLOADS, Pipeline, batch_inputs, request_inputs  # noqa: E402

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def rate(step: Any, batch: int, seconds: float) -> float:
    """Items per second of `step()` (which handles `batch` items), after one untimed call."""
    step()
    calls = 0
    started = time.perf_counter()
    while True:
        step()
        calls += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return calls * batch / elapsed


def measure(workload_key: str, artifacts: Path, seconds: float,
            batch_sizes: tuple[int, ...] = BATCH_SIZES) -> dict[str, Any]:
    workload = next(w for w in WORKLOADS.values() if w.key == workload_key)
    pipeline = Pipeline(workload, artifacts)
    rows = []
    for batch in batch_sizes:
        inputs = batch_inputs(workload, artifacts, batch)
        feed = pipeline.preprocess(inputs)
        rows.append({
            "batch": batch,
            "pipeline": round(rate(lambda inputs=inputs: pipeline.infer(inputs), batch, seconds), 1),
            "model": round(rate(lambda feed=feed: pipeline.run(feed), batch, seconds), 1),
        })
    best_pipeline = max(rows, key=lambda r: r["pipeline"])
    best_model = max(rows, key=lambda r: r["model"])
    return {"workload": workload_key, "batches": rows,
            "pipeline": best_pipeline["pipeline"], "pipeline_batch": best_pipeline["batch"],
            "model": best_model["model"], "model_batch": best_model["batch"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=1.5, help="per batch size and mode")
    parser.add_argument("--answer", action="store_true", help="print the request's answer, measure nothing")
    args = parser.parse_args()
    if args.answer:
        workload = next(w for w in WORKLOADS.values() if w.key == args.workload)
        outputs = Pipeline(workload, args.artifacts).infer(request_inputs(workload, args.artifacts))
        body, _ = encode_response(workload.model, outputs, [(name, False) for name in workload.outputs])
        sys.stdout.write(body.decode())
        return 0
    json.dump(measure(args.workload, args.artifacts, args.seconds), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
