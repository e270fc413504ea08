"""Writes the tiny framework models of tests/test_mlflow_frameworks_e2e.py, run with the runtime env's python (the
only environment here with torch and TensorFlow; the test environment, where mlflow is, has neither):

    python mlflow_framework_models.py torch|tensorflow OUT_DIR

Both are y = x @ W + b with the fixed W and b below. `torch` writes OUT_DIR/data/model.pth as
mlflow.pytorch.save_model writes a ScriptModule (torch.jit.ScriptModule.save of torch.jit.script(module)); `tensorflow`
writes OUT_DIR/tf2model as mlflow.tensorflow.save_model writes a tf.Module (tf.saved_model.save(module, path), no
`signatures`: the serving signature is the input-signed __call__). Each also writes OUT_DIR/input.npy (a fixed
input), OUT_DIR/expected.npy, what the model in memory answers to it (the original the deployment is compared
with), and OUT_DIR/version.txt, the framework's version (MLmodel records it). The framework imports stay inside
the functions, so the test environment can import this module."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

WEIGHT = np.array([[1.0, -2.0], [0.5, 3.0], [-1.5, 0.25]], dtype=np.float32)  # [3, 2]
BIAS = np.array([0.1, -0.2], dtype=np.float32)
INPUT = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [-1.0, 0.5, 2.5]], dtype=np.float32)


def write_torchscript(out: Path) -> np.ndarray:
    import torch

    class Affine(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.from_numpy(WEIGHT.copy()))
            self.bias = torch.nn.Parameter(torch.from_numpy(BIAS.copy()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.weight + self.bias

    scripted = torch.jit.script(Affine().eval())
    (out / "data").mkdir(parents=True, exist_ok=True)
    torch.jit.ScriptModule.save(scripted, str(out / "data" / "model.pth"))
    with torch.no_grad():
        return np.asarray(scripted(torch.from_numpy(INPUT)).numpy())


def write_savedmodel(out: Path) -> np.ndarray:
    import tensorflow as tf

    class Affine(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = tf.Variable(WEIGHT)
            self.bias = tf.Variable(BIAS)

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
        def __call__(self, x: tf.Tensor) -> tf.Tensor:
            return tf.matmul(x, self.weight) + self.bias

    module = Affine()
    tf.saved_model.save(module, str(out / "tf2model"))
    return np.asarray(module(tf.constant(INPUT)).numpy())


def main(argv: list[str]) -> None:
    framework, out = argv[1], Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    expected = write_torchscript(out) if framework == "torch" else write_savedmodel(out)
    import importlib

    # The module's version (tensorflow's distribution is tensorflow-cpu on some machines).
    (out / "version.txt").write_text(importlib.import_module(framework).__version__)
    np.save(out / "input.npy", INPUT)
    np.save(out / "expected.npy", expected)


if __name__ == "__main__":
    main(sys.argv)
