"""Triton python-backend model that serves a TensorFlow SavedModel with tf.saved_model.load.

The renderer copies this file as `<model>/<version>/model.py` beside `model.savedmodel/` and triton_batching.py for
the local runtime, whose tritonserver has no TensorFlow backend. It runs inside the runtime env (with the
`tensorflow` extra), never in the portal's virtualenv. It serves the SignatureDef named by the config parameter
TF_SIGNATURE_DEF (the one inspection chose; the same parameter Triton's own TensorFlow backend reads on a
cluster), "serving_default" when there is none: the signature's input and output keys are the tensor names.
Batching and per-request errors: triton_batching.BatchedModel.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
import triton_python_backend_utils as pb_utils
from triton_batching import BatchedModel

DEFAULT_SIGNATURE = "serving_default"


class TritonPythonModel(BatchedModel):
    artifact = "model.savedmodel"

    def load(self, path: str, threads: int) -> None:
        # Only settable before TensorFlow's runtime starts, which load() does.
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        key = self.parameters.get("TF_SIGNATURE_DEF") or DEFAULT_SIGNATURE
        # Kept on self: the signature function refers to the loaded object's variables.
        self.loaded = tf.saved_model.load(path, tags=["serve"])
        if key not in self.loaded.signatures:
            raise pb_utils.TritonModelException(
                f"the SavedModel has no signature {key!r}; it has {sorted(self.loaded.signatures)}"
            )
        self.function = self.loaded.signatures[key]
        _, specs = self.function.structured_input_signature
        outputs = self.function.structured_outputs
        missing_in = [name for name, _, _ in self.inputs if name not in specs]
        missing_out = [name for name, _, _ in self.outputs if name not in outputs]
        if missing_in or missing_out:
            raise pb_utils.TritonModelException(
                f"the signature does not match the SavedModel's {key!r}: inputs {missing_in} / outputs "
                f"{missing_out} not in it (it has inputs {sorted(specs)} and outputs {sorted(outputs)})"
            )
        for name, full in self.expected.items():
            shape = specs[name].shape
            if shape.rank is not None and shape.rank == len(full):
                self.expected[name] = [c if c != -1 else (d if d is not None else -1)
                                       for c, d in zip(full, shape.as_list(), strict=True)]

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, Any]:
        result = self.function(**{name: tf.constant(array) for name, array in feed.items()})
        return {name: result[name].numpy() for name, _, _ in self.outputs}

    def invalid_argument(self, exc: Exception) -> bool:
        return isinstance(exc, tf.errors.InvalidArgumentError)

    def finalize(self) -> None:
        self.function = None
        self.loaded = None
