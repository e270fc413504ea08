"""The MLServer peer: a custom inference runtime, as MLServer's documentation writes one ("Custom Inference
Runtimes": subclass `mlserver.MLModel`, load the model in `load()`, decode the request with a codec in `predict()`,
encode the response), started with `mlserver start DIR` from a `settings.json` and a `model-settings.json` that
name this class as the `implementation`. Runs in var/peers/mlserver (bench/peers/requirements-mlserver.txt).

Adaptive batching is MLServer's own: with `max_batch_size` > 1 and `max_batch_time` > 0 in model-settings.json it
queues the requests, merges up to `max_batch_size` of them along the first dimension (or what arrived within
`max_batch_time` seconds of the first), calls `predict()` once with the merged request and splits the response.
Everything else is at MLServer's defaults: one parallel inference worker process (`parallel_workers: 1`) behind
the uvicorn front end, the REST (KServe v2 JSON) and gRPC servers and the metrics server.

The model is the workload's Pipeline (bench/serving/workloads.py): the same onnxruntime session (default session
options), pre- and post-processing as every other server.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "serving"))

from batch_log import BatchLog  # noqa: E402
from workloads import WORKLOADS, Pipeline  # noqa: E402


class OnnxPipeline(MLModel):
    async def load(self) -> bool:
        parameters = self.settings.parameters
        assert parameters is not None and parameters.uri and parameters.extra  # written by the orchestrator
        workload = next(w for w in WORKLOADS.values() if w.key == parameters.extra["workload"])
        self.pipeline = Pipeline(workload, Path(parameters.uri))
        self.batches = BatchLog()  # the benchmark's own count of batch sizes, not part of a real runtime
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inputs = {}
        for request_input in payload.inputs:
            array = self.decode(request_input, default_codec=NumpyCodec)
            if request_input.datatype == "BYTES":
                # JSON carries a BYTES element as a string; the pipeline's steps take bytes or str alike.
                array = np.asarray(array, dtype=np.object_).reshape(request_input.shape)
            inputs[request_input.name] = array
        outputs = self.pipeline.infer(inputs)
        self.batches.record(len(next(iter(outputs.values()))))
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output(name, outputs[name])
                                                                for name in self.pipeline.workload.outputs])
