"""Batched execution shared by Modelport's generated python-backend models (ONNX, TorchScript, SavedModel).

The renderer copies this file beside each generated `model.py` (deployments/render.py), whose `TritonPythonModel`
subclasses `BatchedModel` and says only how to load its artifact and run one batch. It runs inside the runtime env
(numpy<2, the framework), never in the portal's virtualenv, so it imports nothing from the portal.

With dynamic batching Triton hands execute() several requests at once: they are concatenated along dim 0, run
once, and the outputs split back per request. Each request is checked on its own first, so one bad request gets
its own error response and does not fail the others; if the batch run fails anyway, each request is run alone so
that only the culprit errs.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


def config_dims(tensor_config: dict[str, Any]) -> list[int]:
    # With a `reshape` the backend sees the reshaped shape, not `dims` (Triton needs dims [1] + reshape [] for a
    # batched tensor that is a plain vector [batch]).
    if "reshape" in tensor_config:
        return [int(d) for d in tensor_config["reshape"].get("shape", [])]
    return [int(d) for d in tensor_config["dims"]]


def cpu_count() -> int:
    """The cores this process may use: its affinity, within MODELPORT_CPUS where the server sets it (a cluster
    pool's pod: its CPU request, since a pod's affinity is the whole node's and each thread maps a stack within the
    model's memory limit)."""
    try:
        found = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        found = os.cpu_count() or 1
    try:
        share = int(os.environ.get("MODELPORT_CPUS", "0"))
    except ValueError:
        share = 0
    return max(1, min(found, share) if share > 0 else found)


def threads_per_instance(config: dict[str, Any]) -> int:
    """The `intra_op_num_threads` parameter, else this instance's share of the cores: instances of one model share
    the CPU, and a framework that starts a thread per core in every instance makes them fight over it."""
    instances = sum(int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1
    threads = config.get("parameters", {}).get("intra_op_num_threads", {}).get("string_value")
    return int(threads) if threads else max(1, cpu_count() // instances)


def max_output_bytes() -> int:
    """The most bytes one response's outputs may hold (0: no limit). A pool's Triton sets it
    (POOL_MAX_OUTPUT_BYTES): Triton copies an answer out of this process and, for a JSON request, writes it as text
    through a DOM of some 16 bytes per number, in its own memory, which every team's models share."""
    try:
        return max(0, int(os.environ.get("MODELPORT_MAX_OUTPUT_BYTES", "0")))
    except ValueError:
        return 0


USAGE_EVERY_SECONDS = 1.0  # how often a model instance writes its peak while it serves: a file write per second


def peak_resident_bytes() -> int:
    """This process's peak resident memory (VmHWM): what the kernel counted of its own pages, never a neighbour's."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def report_usage(directory: str, model: str, instance: str) -> None:
    """Write this instance's peak to `<directory>/<model>/<instance>` (a cluster pool's MODELPORT_USAGE_DIR, which
    the pod's agent reads: the model's figure is the sum of its instances'), replaced whole so a reader never sees
    half a number. A failure to write is no failure of the model: its figure is then the agent's fallback."""
    safe = "".join(c if c.isalnum() or c in "_.-" else "_" for c in instance)[:200] or "instance"
    try:
        folder = os.path.join(directory, model)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{safe}.tmp")
        with open(tmp, "w") as handle:
            handle.write(str(peak_resident_bytes()))
        os.replace(tmp, os.path.join(folder, safe))
    except (OSError, ValueError):  # ValueError: a directory setting no path can be
        pass


def output_bytes(array: np.ndarray) -> int:
    if array.dtype == np.object_:
        return sum(len(v) if isinstance(v, (bytes, str)) else 8 for v in array.flat) + 4 * array.size
    return int(array.nbytes)


class OutputTooLarge(ValueError):
    """An answer past max_output_bytes(): the caller's request asked for too much (a 400, not a 500)."""


def out_of_memory(exc: Exception) -> bool:
    """Whether a run failed for want of memory: in a pool a model's process may hold only its limit, and an
    allocation past it fails (numpy's MemoryError, onnxruntime's "Failed to allocate memory", torch's
    "DefaultCPUAllocator: can't allocate memory", a C++ std::bad_alloc in a kernel)."""
    text = str(exc)
    return isinstance(exc, MemoryError) or any(
        mark in text for mark in ("Failed to allocate memory", "can't allocate memory", "std::bad_alloc"))


class BatchedModel:
    """Base of a generated `TritonPythonModel`: subclasses set `artifact` and implement `load()` and `run()`."""

    artifact = ""  # the file or directory in the version directory that load() opens

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.model_name = args["model_name"]
        self.max_batch_size = int(config.get("max_batch_size", 0))
        self.inputs = [(t["name"], config_dims(t), t["data_type"]) for t in config["input"]]
        self.outputs = [
            (t["name"], pb_utils.triton_string_to_numpy(t["data_type"]), t["data_type"]) for t in config["output"]
        ]
        self.parameters = {k: str(v.get("string_value", "")) for k, v in config.get("parameters", {}).items()}
        # The shape each request must have, batch dimension included; load() may narrow dynamic dimensions with
        # what the artifact itself says.
        self.expected: dict[str, list[int]] = {
            name: ([-1] + dims) if self.max_batch_size > 0 else dims for name, dims, _ in self.inputs
        }
        self.load(os.path.join(args["model_repository"], args["model_version"], self.artifact),
                  threads_per_instance(config))
        self.instance_name = str(args.get("model_instance_name") or self.model_name)
        self.usage_dir = os.environ.get("MODELPORT_USAGE_DIR", "")
        self._usage_at = float("-inf")
        self._report_usage()

    def _report_usage(self) -> None:
        """In a cluster pool, write this instance's peak after the load and, while it serves, at most every
        USAGE_EVERY_SECONDS: what it grew to under use (onnxruntime's arena grows at the first request)."""
        now = time.monotonic()
        if not self.usage_dir or now - self._usage_at < USAGE_EVERY_SECONDS:
            return
        self._usage_at = now
        report_usage(self.usage_dir, self.model_name, self.instance_name)

    # --- what a subclass provides ---------------------------------------------------------------------------

    def load(self, path: str, threads: int) -> None:
        """Open the artifact at `path` with `threads` intra-op threads; raise pb_utils.TritonModelException with a
        message for the user when it does not fit the configured signature (it becomes Triton's load error)."""
        raise NotImplementedError

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, Any]:
        """One run on a (possibly concatenated) batch: every configured output by name, as numpy arrays."""
        raise NotImplementedError

    def prepare_input(self, name: str, array: np.ndarray) -> np.ndarray:
        """A request's input as the framework takes it (after its shape was checked)."""
        return array

    def invalid_argument(self, exc: Exception) -> bool:
        """Whether a failed run was the client's fault (a bad input value): a 400 rather than a 500."""
        return False

    # --- Triton's interface ---------------------------------------------------------------------------------

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
                key = tuple(feed[name].shape[1:] for name, _, _ in self.inputs)
            else:
                key = ("request", index)  # no batching: every request runs on its own
            groups.setdefault(key, []).append((index, feed))

        for members in groups.values():
            for index, response in self._run_group(members):
                responses[index] = response
        self._report_usage()
        return responses

    def _read_request(self, request: Any) -> dict[str, np.ndarray]:
        feed: dict[str, np.ndarray] = {}
        batch_sizes = set()
        for name, _, _ in self.inputs:
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
            array = self.prepare_input(name, array)
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
                return [(index, self._response(self.run(feed)))]
            except Exception as exc:  # noqa: BLE001 - any failure becomes this request's error response
                if out_of_memory(exc):
                    return [(index, self._error(
                        f"this request needs more memory than model '{self.model_name}' may hold (its memory "
                        f"limit; {str(exc)[:200]}): ask for less per request", invalid_argument=True))]
                return [(index, self._error(f"inference failed: {exc}", invalid_argument=(
                    isinstance(exc, OutputTooLarge) or self.invalid_argument(exc))))]

        names = [name for name, _, _ in self.inputs]
        batch = {name: np.concatenate([feed[name] for _, feed in members], axis=0) for name in names}
        sizes = [feed[names[0]].shape[0] for _, feed in members]
        try:
            outputs = {name: np.asarray(value) for name, value in self.run(batch).items()}
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
                results.append((index, self._error(str(exc), invalid_argument=isinstance(exc, OutputTooLarge))))
        return results

    def _response(self, outputs: dict[str, Any]) -> Any:
        tensors = []
        limit, total = max_output_bytes(), 0
        for name, dtype, triton_type in self.outputs:
            array = np.asarray(outputs[name])
            total += output_bytes(array)
            if limit and total > limit:
                # Refused here, before Triton copies it: the caller's own request fails, nobody else's.
                raise OutputTooLarge(f"the answer holds more than {limit} bytes (output '{name}' has shape "
                                 f"{list(array.shape)}), the most a model in a shared pool may answer "
                                 "(POOL_MAX_OUTPUT_BYTES): ask for less per request")
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
