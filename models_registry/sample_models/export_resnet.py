"""Write the sample ResNet-style CNN as TorchScript and as a TensorFlow SavedModel, with resnet.onnx's weights.

Run by models_registry.samples in the runtime env (which has the frameworks; the portal's env has neither):

    python export_resnet.py WEIGHTS.npz [--torchscript OUT.pt] [--savedmodel OUT_DIR] --check OUT.npz

WEIGHTS.npz holds resnet.onnx's initializers by name, and `__check_input__`, a batch of images. The network below
is the one samples.build_resnet_onnx builds node by node: conv (no bias) + batch norm (epsilon 1e-5, ONNX's
default) + relu, three residual blocks, global average pool, a fully connected layer. Every weight must be used
exactly once, so a change on one side that the other misses fails here rather than giving different scores. Each
written model is loaded back from disk and run on the check input; its logits go into the --check file, where
samples.py compares them with onnxruntime's.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

# (name, in channels, out channels, stride) of the residual blocks; a block whose shape changes has a projection.
BLOCKS = (("block1", 16, 16, 1), ("block2", 16, 32, 2), ("block3", 32, 64, 2))
EPSILON = 1e-5


class Weights:
    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.used: set[str] = set()

    def __call__(self, name: str) -> np.ndarray:
        self.used.add(name)
        return self.arrays[name]

    def check_all_used(self) -> None:
        unused = sorted(set(self.arrays) - self.used)
        if unused:
            raise SystemExit(f"weights not used by the exported network: {unused}")


def export_torchscript(weights: Weights, out: Path, check_input: np.ndarray) -> np.ndarray:
    import torch
    from torch import nn

    torch.manual_seed(0)

    class ConvBN(nn.Module):
        def __init__(self, prefix: str, stride: int, relu: bool) -> None:
            super().__init__()
            w = torch.from_numpy(weights(f"{prefix}.weight"))
            cout, cin, k, _ = w.shape
            self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)
            self.bn = nn.BatchNorm2d(cout, eps=EPSILON)
            self.relu = relu
            with torch.no_grad():
                self.conv.weight.copy_(w)
                self.bn.weight.copy_(torch.from_numpy(weights(f"{prefix}.bn.scale")))
                self.bn.bias.copy_(torch.from_numpy(weights(f"{prefix}.bn.bias")))
                self.bn.running_mean.copy_(torch.from_numpy(weights(f"{prefix}.bn.mean")))
                self.bn.running_var.copy_(torch.from_numpy(weights(f"{prefix}.bn.var")))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.bn(self.conv(x))
            return torch.relu(y) if self.relu else y

    class Block(nn.Module):
        def __init__(self, name: str, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = ConvBN(f"{name}.conv1", stride, relu=True)
            self.conv2 = ConvBN(f"{name}.conv2", 1, relu=False)
            self.project = (ConvBN(f"{name}.project", stride, relu=False) if stride != 1 or cin != cout
                            else nn.Identity())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.conv2(self.conv1(x)) + self.project(x))

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = ConvBN("stem", 2, relu=True)
            self.blocks = nn.Sequential(*(Block(*spec) for spec in BLOCKS))
            fc_w = torch.from_numpy(weights("fc.weight"))
            self.fc = nn.Linear(fc_w.shape[1], fc_w.shape[0])
            with torch.no_grad():
                self.fc.weight.copy_(fc_w)
                self.fc.bias.copy_(torch.from_numpy(weights("fc.bias")))

        # The argument's name is the signature's input name, so the wrapper passes it by keyword.
        def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
            x = self.blocks(self.stem(input))
            return self.fc(x.mean(dim=(2, 3)))

    model = ResNet().eval()
    torch.jit.save(torch.jit.script(model), str(out))
    loaded = torch.jit.load(str(out))
    with torch.inference_mode():
        return loaded(torch.from_numpy(check_input)).numpy()


def export_savedmodel(weights: Weights, out: Path, check_input: np.ndarray) -> np.ndarray:
    import tensorflow as tf

    class ResNet(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            # Convolution kernels in TensorFlow's HWIO layout, from ONNX's OIHW.
            self.variables_by_name = {
                name: tf.Variable(array.transpose(2, 3, 1, 0) if array.ndim == 4 else array, trainable=False,
                                  name=name.replace(".", "_"))
                for name, array in sorted(weights.arrays.items())
            }

        def w(self, name: str) -> tf.Variable:
            weights.used.add(name)  # at tracing time, which tf.saved_model.save does
            return self.variables_by_name[name]

        def conv_bn(self, x: tf.Tensor, prefix: str, stride: int, relu: bool) -> tf.Tensor:
            kernel = self.w(f"{prefix}.weight")
            pad = int(kernel.shape[0]) // 2
            # Explicit symmetric padding as in the ONNX graph ("SAME" would pad stride-2 convolutions unevenly).
            x = tf.nn.conv2d(x, kernel, strides=stride, padding=[[0, 0], [pad, pad], [pad, pad], [0, 0]])
            x = tf.nn.batch_normalization(x, self.w(f"{prefix}.bn.mean"), self.w(f"{prefix}.bn.var"),
                                          self.w(f"{prefix}.bn.bias"), self.w(f"{prefix}.bn.scale"), EPSILON)
            return tf.nn.relu(x) if relu else x

        @tf.function(input_signature=[tf.TensorSpec([None, *check_input.shape[1:]], tf.float32)])
        def serve(self, input: tf.Tensor) -> dict[str, tf.Tensor]:  # noqa: A002 - the signature's input name
            x = tf.transpose(input, [0, 2, 3, 1])  # NCHW, as the ONNX model takes it, to TensorFlow's NHWC
            x = self.conv_bn(x, "stem", 2, True)
            for name, cin, cout, stride in BLOCKS:
                y = self.conv_bn(self.conv_bn(x, f"{name}.conv1", stride, True), f"{name}.conv2", 1, False)
                shortcut = self.conv_bn(x, f"{name}.project", stride, False) if stride != 1 or cin != cout else x
                x = tf.nn.relu(y + shortcut)
            features = tf.reduce_mean(x, axis=[1, 2])
            logits = tf.matmul(features, self.w("fc.weight"), transpose_b=True) + self.w("fc.bias")
            return {"logits": logits}

    model = ResNet()
    tf.saved_model.save(model, str(out), signatures={"serving_default": model.serve})
    loaded = tf.saved_model.load(str(out))
    return loaded.signatures["serving_default"](input=tf.constant(check_input))["logits"].numpy()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("weights", type=Path)
    parser.add_argument("--torchscript", type=Path)
    parser.add_argument("--savedmodel", type=Path)
    parser.add_argument("--check", type=Path, required=True)
    args = parser.parse_args()
    with np.load(args.weights) as data:
        arrays = {name: data[name] for name in data.files}
    check_input = arrays.pop("__check_input__")
    results: dict[str, Any] = {}
    if args.torchscript:
        weights = Weights(arrays)
        results["torchscript"] = export_torchscript(weights, args.torchscript, check_input)
        weights.check_all_used()
    if args.savedmodel:
        weights = Weights(arrays)
        results["savedmodel"] = export_savedmodel(weights, args.savedmodel, check_input)
        weights.check_all_used()
    np.savez(args.check, **results)


if __name__ == "__main__":
    main()
