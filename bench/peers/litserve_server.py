"""The LitServe peer: a `litserve.LitAPI` (`setup` loads the model; `decode_request`, `predict`,
`encode_response`, with LitAPI's default `batch`/`unbatch` numpy stacking) served by `litserve.LitServer`, started
as a script, as LitServe's documentation writes one. Runs in var/peers/litserve
(bench/peers/requirements-litserve.txt).

    var/peers/litserve/bin/python bench/peers/litserve_server.py --workload resnet --artifacts DIR --port PORT \
        --max-batch-size 32 --batch-timeout 0.002

Batching: `LitAPI(max_batch_size=N, batch_timeout=T)`; a worker takes up to N requests from its queue, waiting at
most T seconds for them. The window must be above 0: with `batch_timeout=0` LitServe's batching loop polls its
queue without blocking, and an idle server spins a core. Everything else at LitServe's defaults: one inference
worker process (`workers_per_device=1` on the CPU), as many API server processes as workers, the default queue.

The request is LitServe's idiomatic JSON: one item per request, {"input": the 3x64x64 image as nested lists} or
{"text": "a sentence"}; the answer {"logits": [...]} or {"embedding": [...]}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import litserve as ls
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "serving"))

from batch_log import BatchLog  # noqa: E402
from workloads import WORKLOADS, Pipeline  # noqa: E402


class OnnxAPI(ls.LitAPI):
    def __init__(self, workload_key: str, artifacts: Path, **batching: Any) -> None:
        super().__init__(**batching)
        self.workload = next(w for w in WORKLOADS.values() if w.key == workload_key)
        self.artifacts = artifacts

    def setup(self, device: str) -> None:
        self.pipeline = Pipeline(self.workload, self.artifacts)
        self.batches = BatchLog()  # the benchmark's own count of batch sizes, not part of a real server

    # No annotation on `request`: LitServe builds its endpoint from it, and a plain request is a parsed JSON body.
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        if self.workload.key == "minilm":
            return np.array([request["text"]], dtype=np.object_)
        return np.asarray(request["input"], dtype=np.float32)

    def predict(self, x: np.ndarray) -> np.ndarray:
        name = self.workload.outputs[0]
        output: np.ndarray = self.pipeline.infer({"text" if self.workload.key == "minilm" else "input": x})[name]
        self.batches.record(len(output))
        return output

    def encode_response(self, output: np.ndarray) -> dict[str, Any]:
        return {self.workload.outputs[0]: output.tolist()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-batch-size", type=int, required=True)
    parser.add_argument("--batch-timeout", type=float, required=True, help="seconds, > 0")
    args = parser.parse_args()
    api = OnnxAPI(args.workload, args.artifacts, max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout)
    ls.LitServer(api).run(host="127.0.0.1", port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
