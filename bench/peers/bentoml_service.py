"""The BentoML peer: a `@bentoml.service` class whose model is loaded in `__init__` and whose inference method is
a batchable `@bentoml.api` (BentoML's "Adaptive batching" guide), started with
`bentoml serve bentoml_service:OnnxService --port PORT`. Runs in var/peers/bentoml
(bench/peers/requirements-bentoml.txt).

Everything at BentoML's defaults: `batchable=True` with its default `max_batch_size` (100) and `max_latency_ms`
(60,000); BentoML has no fixed batching window to set, its dispatcher decides how long to wait from the batch
latencies it has measured. One worker process (`workers` unset), the default traffic settings, access logging on.

The request is BentoML's own JSON: the API's parameter names as keys, a numpy array as nested lists, a list of
strings as a JSON list; the answer is the returned array as nested lists. With `batchable=True` each request
carries a batch (dim 0), which BentoML concatenates with the others' and splits again. Which workload is served
comes from the environment (BENCH_WORKLOAD, BENCH_ARTIFACTS), the route is the workload's name.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import bentoml
import numpy as np
from bentoml.validators import DType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "serving"))

from batch_log import BatchLog  # noqa: E402
from workloads import WORKLOADS, Pipeline  # noqa: E402


@bentoml.service
class OnnxService:
    def __init__(self) -> None:
        key = os.environ["BENCH_WORKLOAD"]
        workload = next(w for w in WORKLOADS.values() if w.key == key)
        self.pipeline = Pipeline(workload, Path(os.environ["BENCH_ARTIFACTS"]))
        self.batches = BatchLog()  # the benchmark's own count of batch sizes, not part of a real service

    @bentoml.api(batchable=True)
    def resnet(self, input: Annotated[np.ndarray, DType("float32")]) -> np.ndarray:  # noqa: A002 - the tensor's name
        logits: np.ndarray = self.pipeline.infer({"input": input})["logits"]
        self.batches.record(len(logits))
        return logits

    @bentoml.api(batchable=True)
    def minilm(self, text: list[str]) -> np.ndarray:
        texts = np.empty((len(text), 1), dtype=np.object_)
        texts[:, 0] = text
        embedding: np.ndarray = self.pipeline.infer({"text": texts})["embedding"]
        self.batches.record(len(embedding))
        return embedding
