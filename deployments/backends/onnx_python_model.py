"""Triton python-backend model that serves an ONNX file with onnxruntime.

The renderer copies this file as `<model>/<version>/model.py` beside `model.onnx` when the target runtime has no
onnxruntime backend (the local tritonserver from nvidia-pytriton has only the python backend). It runs inside the
runtime env (numpy<2, onnxruntime), never in the portal's virtualenv, so it imports nothing from the portal.

With dynamic batching Triton hands execute() several requests at once: they are concatenated along dim 0, run
once, and the outputs split back per request. Each request is checked on its own first, so one bad request gets
its own error response and does not fail the others.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


def _config_dims(tensor_config: dict[str, Any]) -> list[int]:
    # With a `reshape` the backend sees the reshaped shape, not `dims` (Triton needs dims [1] + reshape [] for a
    # batched tensor that is a plain vector [batch]).
    if "reshape" in tensor_config:
        return [int(d) for d in tensor_config["reshape"].get("shape", [])]
    return [int(d) for d in tensor_config["dims"]]


def _onnx_dims(shape: list[Any]) -> list[int]:
    # onnxruntime gives symbolic dimensions as strings or None; treat them as dynamic.
    return [d if isinstance(d, int) and d > 0 else -1 for d in shape]


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.model_name = args["model_name"]
        self.max_batch_size = int(config.get("max_batch_size", 0))
        self.inputs = [(t["name"], _config_dims(t)) for t in config["input"]]
        self.outputs = [
            (t["name"], pb_utils.triton_string_to_numpy(t["data_type"]), t["data_type"]) for t in config["output"]
        ]

        # Instances of one model share the CPU: give each its share of the cores instead of letting every
        # onnxruntime session start a thread per core and fight over them.
        instances = sum(int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1
        parameters = config.get("parameters", {})
        threads = parameters.get("intra_op_num_threads", {}).get("string_value")
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads) if threads else max(1, _cpu_count() // instances)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL

        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])

        onnx_inputs = {i.name: i for i in self.session.get_inputs()}
        onnx_outputs = {o.name for o in self.session.get_outputs()}
        missing_in = [name for name, _ in self.inputs if name not in onnx_inputs]
        missing_out = [name for name, _, _ in self.outputs if name not in onnx_outputs]
        if missing_in or missing_out:
            # Raised here the message becomes Triton's "failed to load" error, which the portal shows.
            raise pb_utils.TritonModelException(
                f"the signature does not match the ONNX file: inputs {missing_in} / outputs {missing_out} not in "
                f"the model (it has inputs {sorted(onnx_inputs)} and outputs {sorted(onnx_outputs)})"
            )
        # The shape each request must have, batch dimension included, from both the config and the ONNX file.
        self.expected: dict[str, list[int]] = {}
        self.string_inputs: set[str] = set()
        for name, dims in self.inputs:
            full = ([-1] + dims) if self.max_batch_size > 0 else dims
            onnx_dims = _onnx_dims(onnx_inputs[name].shape)
            if len(onnx_dims) == len(full):
                full = [c if c != -1 else o for c, o in zip(full, onnx_dims, strict=True)]
            self.expected[name] = full
            if onnx_inputs[name].type == "tensor(string)":
                self.string_inputs.add(name)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        # Requests whose inputs are valid, grouped by their non-batch shapes: only those can be concatenated.
        groups: dict[tuple[Any, ...], list[tuple[int, dict[str, np.ndarray]]]] = {}
        for index, request in enumerate(requests):
            try:
                feed = self._read_request(request)
            except ValueError as exc:
                responses[index] = self._error(str(exc), invalid_argument=True)
                continue
            if self.max_batch_size > 0:
                key = tuple(feed[name].shape[1:] for name, _ in self.inputs)
            else:
                key = ("request", index)  # no batching: every request runs on its own
            groups.setdefault(key, []).append((index, feed))

        for members in groups.values():
            for index, response in self._run_group(members):
                responses[index] = response
        return responses

    def _read_request(self, request: Any) -> dict[str, np.ndarray]:
        feed: dict[str, np.ndarray] = {}
        batch_sizes = set()
        for name, _ in self.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise ValueError(f"input '{name}' is missing")
            array = tensor.as_numpy()
            expected = self.expected[name]
            if array.ndim != len(expected) or any(
                e != -1 and e != a for e, a in zip(expected, array.shape, strict=False)
            ):
                raise ValueError(
                    f"input '{name}' has shape {list(array.shape)}, model '{self.model_name}' expects {expected} "
                    "(-1: any size)"
                )
            if name in self.string_inputs and array.dtype == np.object_:
                array = np.vectorize(lambda v: v.decode("utf-8") if isinstance(v, bytes) else v, otypes=[object])(array)
            if self.max_batch_size > 0:
                batch_sizes.add(array.shape[0])
            feed[name] = array
        if len(batch_sizes) > 1:
            raise ValueError(f"inputs have different batch sizes {sorted(batch_sizes)}")
        return feed

    def _run_group(self, members: list[tuple[int, dict[str, np.ndarray]]]) -> list[tuple[int, Any]]:
        if len(members) == 1:
            index, feed = members[0]
            try:
                return [(index, self._response(self._run(feed)))]
            except Exception as exc:  # noqa: BLE001 - any failure becomes this request's error response
                # onnxruntime raises InvalidArgument for bad input values (an index out of range, say): the
                # client's fault, so a 400 rather than a 500.
                invalid = type(exc).__name__ == "InvalidArgument"
                return [(index, self._error(f"inference failed: {exc}", invalid_argument=invalid))]

        names = [name for name, _ in self.inputs]
        batch = {name: np.concatenate([feed[name] for _, feed in members], axis=0) for name in names}
        sizes = [feed[names[0]].shape[0] for _, feed in members]
        try:
            outputs = self._run(batch)
            for name, array in outputs.items():
                if array.ndim == 0 or array.shape[0] != sum(sizes):
                    raise ValueError(f"output '{name}' has batch size {array.shape[:1]}, expected {sum(sizes)}")
        except Exception:  # noqa: BLE001
            # Something in the batch made the run fail: run each request alone so only the culprit errs.
            results: list[tuple[int, Any]] = []
            for member in members:
                results.extend(self._run_group([member]))
            return results

        splits = np.cumsum(sizes)[:-1]
        per_output = {name: np.split(array, splits, axis=0) for name, array in outputs.items()}
        results = []
        for position, (index, _) in enumerate(members):
            try:
                results.append((index, self._response({n: parts[position] for n, parts in per_output.items()})))
            except Exception as exc:  # noqa: BLE001
                results.append((index, self._error(str(exc))))
        return results

    def _run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [name for name, _, _ in self.outputs]
        values = self.session.run(names, feed)
        return dict(zip(names, values, strict=True))

    def _response(self, outputs: dict[str, np.ndarray]) -> Any:
        tensors = []
        for name, dtype, triton_type in self.outputs:
            array = np.asarray(outputs[name])
            if array.dtype != dtype and not (dtype == np.object_ and array.dtype.kind in "OSU"):
                raise ValueError(f"output '{name}' is {array.dtype}, but the signature says {triton_type}")
            if dtype == np.object_:
                array = array.astype(np.object_)
            tensors.append(pb_utils.Tensor(name, np.ascontiguousarray(array)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _error(self, message: str, *, invalid_argument: bool = False) -> Any:
        # TritonError codes exist in python backends of Triton 23.10 and later; INTERNAL is the default.
        code = getattr(pb_utils.TritonError, "INVALID_ARG" if invalid_argument else "INTERNAL", None)
        error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
        return pb_utils.InferenceResponse(output_tensors=[], error=error)

    def finalize(self) -> None:
        self.session = None
