"""Real, small sample models for demos, tests and benchmarks (`python manage.py make_sample_models DIR`).

- digits.onnx: a scikit-learn classifier of 8x8 handwritten digits (the `load_digits` dataset that ships inside
  scikit-learn, so nothing is downloaded). StandardScaler + LogisticRegression, trained on 80% of the 1,797 images;
  the other 20% (360 images) are held out for tests: `train_test_split(test_size=0.2, random_state=0,
  stratify=y)`. Converted with skl2onnx without ZipMap, so both outputs are plain tensors Triton can serve.
- resnet.onnx: a ResNet-style CNN (conv + batchnorm + relu, three residual blocks, global average pool, gemm)
  built node by node with onnx.helper, with random weights from a fixed seed. About 25 MFLOPs per 64x64 image:
  enough to load a CPU under a benchmark, a few milliseconds per image in onnxruntime. Its predictions mean
  nothing; it exists to be served.

Both have a dynamic batch dimension and use opset 17 / IR version 8, which onnxruntime has supported since 1.13,
so older Triton images can serve them too. Both are byte-for-byte reproducible.

When the runtime env has the frameworks (`make runtime-env RUNTIME_EXTRAS=torch,tensorflow`), the same CNN with the
same weights is also written as TorchScript (resnet.pt, with resnet.signature.json: TorchScript carries no
signature) and as a TensorFlow SavedModel (resnet.savedmodel.zip), by sample_models/export_resnet.py run in the
runtime env; their scores are checked against onnxruntime's before anything is written, so tests and benchmarks
compare one network across three formats.

The reference pipeline `digits-pipeline` (docs/pipelines.md) chains three of them:
- preprocess.zip: a python-backend model (model.py + helper module digit_image.py + requirements.txt; sources in
  sample_models/) that decodes PNG/JPEG bytes with Pillow into the classifier's 64 features;
- digits.onnx;
- postprocess.zip: a python-backend model giving the top 3 labels (BYTES) and their probabilities.
digits-pipeline.json is its definition, for POST /api/v1/models/digits-pipeline/versions/. `digits_png()` renders
8x8 digits as the PNG images the pipeline takes (tests, the UI's Try it).
textgen.zip is the streaming text generator: a decoupled python-backend model (sample_models/textgen_model.py) around
a character 5-gram (sample_models/textgen.py) trained here, in about half a second, on a public-domain text the
repository ships (sample_models/text/coriolanus.txt); its contract is that of Triton's OpenAI frontend (text_input ->
text_output pieces), every input but text_input declared optional. Written by make_sample_models, and deployed by
the dashboard's "Deploy the sample text generator" (web/samples.py).

scikit-learn and skl2onnx are imported inside functions: they take a second to import.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from modelport.core.signature import Signature, Tensor

if TYPE_CHECKING:
    from sklearn.pipeline import Pipeline

OPSET = 17
ML_OPSET = 1  # ai.onnx.ml: LinearClassifier, Scaler, Normalizer
IR_VERSION = 8
HOLDOUT_FRACTION = 0.2
SPLIT_RANDOM_STATE = 0
RESNET_SEED = 20261129
RESNET_IMAGE_SIZE = 64
RESNET_CLASSES = 10

DIGITS_SIGNATURE = Signature(
    inputs=(Tensor("input", "FP32", (-1, 64)),),
    outputs=(Tensor("label", "INT64", (-1,)), Tensor("probabilities", "FP32", (-1, 10))),
)
RESNET_SIGNATURE = Signature(
    inputs=(Tensor("input", "FP32", (-1, 3, RESNET_IMAGE_SIZE, RESNET_IMAGE_SIZE)),),
    outputs=(Tensor("logits", "FP32", (-1, RESNET_CLASSES)),),
)

# The pipeline's python steps. Images travel one per row as BYTES [batch, 1].
TOP_K = 3
PREPROCESS_SIGNATURE = Signature(
    inputs=(Tensor("image", "BYTES", (-1, 1)),),
    outputs=(Tensor("input", "FP32", (-1, 64)),),
)
POSTPROCESS_SIGNATURE = Signature(
    inputs=(Tensor("probabilities", "FP32", (-1, 10)),),
    outputs=(Tensor("labels", "BYTES", (-1, TOP_K)), Tensor("scores", "FP32", (-1, TOP_K))),
)
PIPELINE_SIGNATURE = Signature(inputs=PREPROCESS_SIGNATURE.inputs, outputs=POSTPROCESS_SIGNATURE.outputs)
SAMPLE_CODE_DIR = Path(__file__).resolve().parent / "sample_models"
EXPORT_RESNET_SCRIPT = SAMPLE_CODE_DIR / "export_resnet.py"
# The three formats of the CNN agree to float32 round-off (different convolution kernels sum in different orders).
RESNET_RTOL = 1e-4
RESNET_ATOL = 1e-4
RESNET_CHECK_SEED = 7
# Digits are drawn this many pixels a side: each of the 8x8 cells becomes a 4x4 block, as in the dataset's bitmaps.
DIGITS_PNG_SIDE = 32
# A fixed timestamp in the zips, so that the same sources give the same bytes (content-addressed storage).
_ZIP_DATE = (2026, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class SampleModel:
    name: str
    filename: str
    format: str
    signature: Signature
    description: str
    sha256: str
    size: int
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "filename": self.filename,
            "format": self.format,
            "signature": self.signature.to_json(),
            "description": self.description,
            "sha256": self.sha256,
            "size": self.size,
            "details": self.details,
        }


def _written(path: Path, name: str, signature: Signature, description: str, details: dict[str, Any],
             fmt: str = "onnx") -> SampleModel:
    data = path.read_bytes()
    return SampleModel(
        name=name,
        filename=path.name,
        format=fmt,
        signature=signature,
        description=description,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        details=details,
    )


def _name_batch_dim(model: onnx.ModelProto) -> None:
    """Call the first dimension of every graph input and output "batch", so the dynamic batch reads as such."""
    for value in list(model.graph.input) + list(model.graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_param = "batch"


# --- digits ----------------------------------------------------------------------------------------------------


def _digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=HOLDOUT_FRACTION, random_state=SPLIT_RANDOM_STATE, stratify=y
    )
    return X_train, X_test, y_train, y_test


def digits_holdout() -> tuple[np.ndarray, np.ndarray]:
    """The 360 held-out images (float32, [N, 64], pixel values 0-16) and their labels (int64, [N])."""
    _, X_test, _, y_test = _digits_split()
    return X_test.astype(np.float32), y_test.astype(np.int64)


@lru_cache(maxsize=1)
def train_digits_classifier() -> Pipeline:
    """The scikit-learn pipeline digits.onnx is converted from (lbfgs is deterministic: same data, same model)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    X_train, _, y_train, _ = _digits_split()
    pipeline = Pipeline([("scale", StandardScaler()), ("classifier", LogisticRegression(max_iter=5000))])
    pipeline.fit(X_train.astype(np.float32), y_train)
    return pipeline


def build_digits_onnx() -> onnx.ModelProto:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    pipeline = train_digits_classifier()
    classifier = pipeline.named_steps["classifier"]
    model = convert_sklearn(
        pipeline,
        name="digits",
        initial_types=[("input", FloatTensorType([None, 64]))],
        # ZipMap would make the scores a sequence of maps, which Triton cannot serve.
        options={id(classifier): {"zipmap": False}},
        target_opset={"": OPSET, "ai.onnx.ml": ML_OPSET},
    )
    # skl2onnx names the graph with a random uuid and may list an opset twice: fix both so the bytes are
    # reproducible and the opset list is clean.
    model.graph.name = "digits"
    opsets = {(o.domain, o.version) for o in model.opset_import}
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(domain, version) for domain, version in sorted(opsets))
    model.ir_version = IR_VERSION
    model.doc_string = "8x8 digit classifier (scikit-learn digits), StandardScaler + LogisticRegression"
    _name_batch_dim(model)
    return model


def make_digits_onnx(path: Path | str) -> SampleModel:
    path = Path(path)
    model = build_digits_onnx()
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    X_test, y_test = digits_holdout()
    accuracy = float((train_digits_classifier().predict(X_test) == y_test).mean())
    details = {
        "dataset": "sklearn.datasets.load_digits (1,797 8x8 images, pixel values 0-16)",
        "split": f"train_test_split(test_size={HOLDOUT_FRACTION}, random_state={SPLIT_RANDOM_STATE}, stratify=y)",
        "holdout_size": len(y_test),
        "holdout_accuracy": round(accuracy, 4),
        "outputs": "label: predicted digit; probabilities: one score per digit 0-9",
    }
    return _written(path, "digits", DIGITS_SIGNATURE, "Handwritten digit classifier (scikit-learn)", details)


# --- resnet ----------------------------------------------------------------------------------------------------


class _GraphBuilder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.flops = 0  # multiply-adds x 2, per image

    def weight(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv_bn(self, x: str, name: str, cin: int, cout: int, kernel: int, stride: int, size: int, relu: bool) -> str:
        """Conv (no bias) + BatchNormalization (+ Relu); `size` is the output's height and width."""
        fan_in = cin * kernel * kernel
        # He initialisation keeps the activations' scale steady through the relus, so the logits stay finite.
        w = self.rng.normal(0.0, np.sqrt(2.0 / fan_in), (cout, cin, kernel, kernel))
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, self.weight(f"{name}.weight", w)],
                [f"{name}.conv"],
                name=f"{name}.conv",
                kernel_shape=[kernel, kernel],
                strides=[stride, stride],
                pads=[kernel // 2] * 4,
            )
        )
        bn = [
            self.weight(f"{name}.bn.scale", 1.0 + 0.1 * self.rng.normal(size=cout)),
            self.weight(f"{name}.bn.bias", 0.1 * self.rng.normal(size=cout)),
            self.weight(f"{name}.bn.mean", 0.1 * self.rng.normal(size=cout)),
            self.weight(f"{name}.bn.var", self.rng.uniform(0.5, 1.5, size=cout)),
        ]
        self.nodes.append(
            helper.make_node("BatchNormalization", [f"{name}.conv", *bn], [f"{name}.bn"], name=f"{name}.bn")
        )
        self.flops += 2 * size * size * cout * fan_in
        if not relu:
            return f"{name}.bn"
        self.nodes.append(helper.make_node("Relu", [f"{name}.bn"], [f"{name}.relu"], name=f"{name}.relu"))
        return f"{name}.relu"

    def residual_block(self, x: str, name: str, cin: int, cout: int, stride: int, size: int) -> str:
        y = self.conv_bn(x, f"{name}.conv1", cin, cout, 3, stride, size, relu=True)
        y = self.conv_bn(y, f"{name}.conv2", cout, cout, 3, 1, size, relu=False)
        shortcut = x
        if stride != 1 or cin != cout:
            shortcut = self.conv_bn(x, f"{name}.project", cin, cout, 1, stride, size, relu=False)
        self.nodes.append(helper.make_node("Add", [y, shortcut], [f"{name}.add"], name=f"{name}.add"))
        self.nodes.append(helper.make_node("Relu", [f"{name}.add"], [f"{name}.out"], name=f"{name}.out"))
        return f"{name}.out"


def build_resnet_onnx(seed: int = RESNET_SEED) -> tuple[onnx.ModelProto, int]:
    """The model and its FLOPs per image."""
    g = _GraphBuilder(seed)
    size = RESNET_IMAGE_SIZE // 2
    x = g.conv_bn("input", "stem", 3, 16, 3, 2, size, relu=True)
    x = g.residual_block(x, "block1", 16, 16, 1, size)
    x = g.residual_block(x, "block2", 16, 32, 2, size // 2)
    x = g.residual_block(x, "block3", 32, 64, 2, size // 4)
    g.nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="pool"))
    g.nodes.append(helper.make_node("Flatten", ["pool"], ["features"], name="flatten", axis=1))
    fc_w = g.rng.normal(0.0, np.sqrt(1.0 / 64), (RESNET_CLASSES, 64))
    fc_b = np.zeros(RESNET_CLASSES)
    g.nodes.append(
        helper.make_node(
            "Gemm",
            ["features", g.weight("fc.weight", fc_w), g.weight("fc.bias", fc_b)],
            ["logits"],
            name="fc",
            transB=1,
        )
    )
    g.flops += 2 * 64 * RESNET_CLASSES
    graph = helper.make_graph(
        g.nodes,
        "resnet",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, RESNET_IMAGE_SIZE, RESNET_IMAGE_SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", RESNET_CLASSES])],
        g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="modelport")
    model.ir_version = IR_VERSION
    model.doc_string = "ResNet-style CNN with random weights (fixed seed), for serving and load tests"
    return model, g.flops


def make_resnet_onnx(path: Path | str) -> SampleModel:
    path = Path(path)
    model, flops = build_resnet_onnx()
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    details = {
        "layers": "stem conv 3->16 stride 2, residual blocks 16@32x32, 32@16x16, 64@8x8, global average pool, gemm",
        "weights": f"random normal (He), numpy default_rng({RESNET_SEED})",
        "flops_per_image": flops,
        "input": f"float32 images, NCHW, {RESNET_IMAGE_SIZE}x{RESNET_IMAGE_SIZE}, any values (e.g. 0-1)",
    }
    return _written(path, "resnet", RESNET_SIGNATURE, "ResNet-style CNN, random weights (load testing)", details)


def resnet_inputs(batch: int, seed: int = RESNET_CHECK_SEED) -> np.ndarray:
    """A batch of images for the CNN (float32, NCHW, values 0-1)."""
    shape = (batch, 3, RESNET_IMAGE_SIZE, RESNET_IMAGE_SIZE)
    return np.random.default_rng(seed).uniform(0.0, 1.0, shape).astype(np.float32)


def resnet_onnx_scores(images: np.ndarray) -> np.ndarray:
    """resnet.onnx's logits for `images`, computed with onnxruntime in this process."""
    import onnxruntime as ort

    model, _ = build_resnet_onnx()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["logits"], {"input": images})[0])


class ExportFailed(RuntimeError):
    """The runtime env could not write the CNN in another format, or its scores differ from resnet.onnx's."""


def _zip_directory(source: Path, top: str) -> bytes:
    files = {f"{top}/{p.relative_to(source).as_posix()}": p.read_bytes()
             for p in sorted(source.rglob("*")) if p.is_file()}
    return _python_zip(files)


def make_resnet_framework_models(directory: Path | str, runtime_python: Path, frameworks: Collection[str], *,
                                 timeout: float = 900) -> list[SampleModel]:
    """resnet.pt (with "torch") and resnet.savedmodel.zip (with "tensorflow"): the CNN of resnet.onnx, written by
    export_resnet.py with `runtime_python` (the runtime env's). Raises ExportFailed unless each one's scores on a
    check batch agree with onnxruntime's on resnet.onnx."""
    directory = Path(directory)
    wanted = [f for f in ("torch", "tensorflow") if f in frameworks]
    if not wanted:
        return []
    model, flops = build_resnet_onnx()
    check_input = resnet_inputs(4)
    with tempfile.TemporaryDirectory(prefix="modelport-export-") as scratch:
        work = Path(scratch)
        arrays: dict[str, Any] = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        np.savez(work / "weights.npz", __check_input__=check_input, **arrays)
        command = [str(runtime_python), str(EXPORT_RESNET_SCRIPT), str(work / "weights.npz"), "--check",
                   str(work / "check.npz")]
        if "torch" in wanted:
            command += ["--torchscript", str(work / "resnet.pt")]
        if "tensorflow" in wanted:
            command += ["--savedmodel", str(work / "resnet")]
        # The runtime env's python with its own bin/ first, none of this process's Python settings.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
        env["PATH"] = os.pathsep.join([str(Path(runtime_python).parent), env.get("PATH", "/usr/bin:/bin")])
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
        if done.returncode != 0:
            raise ExportFailed(f"{EXPORT_RESNET_SCRIPT.name} failed ({done.returncode}): {done.stderr[-2000:]}")
        expected = resnet_onnx_scores(check_input)
        with np.load(work / "check.npz") as check:
            for fmt in check.files:
                if not np.allclose(check[fmt], expected, rtol=RESNET_RTOL, atol=RESNET_ATOL):
                    worst = float(np.abs(check[fmt] - expected).max())
                    raise ExportFailed(f"the {fmt} CNN's scores differ from resnet.onnx's by up to {worst:g}")
        details = {
            "weights": "those of resnet.onnx (the same network, exported by sample_models/export_resnet.py)",
            "flops_per_image": flops,
            "scores": f"agree with resnet.onnx's within rtol={RESNET_RTOL}, atol={RESNET_ATOL}",
        }
        written = []
        if "torch" in wanted:
            shutil.copyfile(work / "resnet.pt", directory / "resnet.pt")
            _signature_file(directory / "resnet.signature.json", RESNET_SIGNATURE)
            written.append(_written(directory / "resnet.pt", "resnet", RESNET_SIGNATURE,
                                    "ResNet-style CNN as TorchScript (torch.jit.script)",
                                    {**details, "signature_file": "resnet.signature.json"}, fmt="torchscript"))
        if "tensorflow" in wanted:
            (directory / "resnet.savedmodel.zip").write_bytes(_zip_directory(work / "resnet", "resnet"))
            written.append(_written(directory / "resnet.savedmodel.zip", "resnet", RESNET_SIGNATURE,
                                    "ResNet-style CNN as a TensorFlow SavedModel (signature serving_default)",
                                    details, fmt="tensorflow_savedmodel"))
        return written


# --- the digits pipeline -------------------------------------------------------------------------------------


def digits_png(images: np.ndarray) -> list[bytes]:
    """PNG bytes of 8x8 digits (rows of 64 or [N, 8, 8], values 0-16 as in load_digits): dark ink on white,
    32x32 grayscale, each cell drawn as a 4x4 block."""
    from PIL import Image

    cells = np.asarray(images, dtype=np.float64).reshape(-1, 8, 8)
    encoded = []
    for cell in cells:
        paper = np.round(255.0 - np.clip(cell, 0, 16) * 255.0 / 16.0).astype(np.uint8)
        image = Image.fromarray(paper).resize((DIGITS_PNG_SIDE, DIGITS_PNG_SIDE), Image.Resampling.NEAREST)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        encoded.append(buffer.getvalue())
    return encoded


def _python_zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in sorted(files.items()):
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def build_preprocess_zip() -> bytes:
    """model.py, its helper module digit_image.py and requirements.txt (Pillow decodes the images)."""
    return _python_zip({
        "model.py": (SAMPLE_CODE_DIR / "preprocess_model.py").read_bytes(),
        "digit_image.py": (SAMPLE_CODE_DIR / "digit_image.py").read_bytes(),
        "requirements.txt": b"numpy\npillow\n",
    })


def build_postprocess_zip() -> bytes:
    return _python_zip({
        "model.py": (SAMPLE_CODE_DIR / "postprocess_model.py").read_bytes(),
        "requirements.txt": b"numpy\n",
    })


def _signature_file(path: Path, signature: Signature) -> None:
    path.write_text(json.dumps(signature.to_json(), indent=2) + "\n")


def make_preprocess_zip(path: Path | str) -> SampleModel:
    """preprocess.zip, and its signature (which a python model cannot carry) beside it: preprocess.signature.json."""
    path = Path(path)
    path.write_bytes(build_preprocess_zip())
    _signature_file(path.with_name("preprocess.signature.json"), PREPROCESS_SIGNATURE)
    details = {
        "signature_file": "preprocess.signature.json",
        "requirements": "numpy, pillow",
        "input": "encoded images (PNG, JPEG, ...), one per row; dark ink on light paper or the reverse",
        "output": "the 64 features digits.onnx takes: averaged to 8x8, ink scaled to 0-16 as in load_digits",
    }
    return _written(path, "preprocess", PREPROCESS_SIGNATURE, "Digit image decoder (python backend, Pillow)",
                    details, fmt="python")


def make_postprocess_zip(path: Path | str) -> SampleModel:
    path = Path(path)
    path.write_bytes(build_postprocess_zip())
    _signature_file(path.with_name("postprocess.signature.json"), POSTPROCESS_SIGNATURE)
    details = {
        "signature_file": "postprocess.signature.json",
        "requirements": "numpy",
        "output": f"the top {TOP_K} labels (strings '0'-'9') and their probabilities, best first",
    }
    return _written(path, "postprocess", POSTPROCESS_SIGNATURE, f"Top-{TOP_K} labels (python backend)",
                    details, fmt="python")


def digits_pipeline_definition(digits: int = 1, preprocess: int = 1, postprocess: int = 1) -> dict[str, Any]:
    """The definition of `digits-pipeline` (image bytes -> top 3 labels), given the step models' versions."""
    return {
        **PIPELINE_SIGNATURE.to_json(),
        "steps": [
            {"model": "preprocess", "version": preprocess, "input_map": {"image": "image"},
             "output_map": {"input": "features"}},
            {"model": "digits", "version": digits, "input_map": {"input": "features"},
             "output_map": {"probabilities": "probabilities"}},
            {"model": "postprocess", "version": postprocess, "input_map": {"probabilities": "probabilities"},
             "output_map": {"labels": "labels", "scores": "scores"}},
        ],
    }


def make_digits_pipeline_json(path: Path | str) -> SampleModel:
    path = Path(path)
    path.write_text(json.dumps(digits_pipeline_definition(), indent=2) + "\n")
    details = {
        "steps": "preprocess -> digits -> postprocess (version 1 of each; change them to the versions you have)",
        "create": "POST /api/v1/models/digits-pipeline/versions/ "
                  '{"format": "ensemble", "definition": <this file>}',
    }
    return _written(path, "digits-pipeline", PIPELINE_SIGNATURE, "Digit images to top-3 labels (pipeline)",
                    details, fmt="ensemble")


# --- the text generator ---------------------------------------------------------------------------------------

# A decoupled (streaming) python model: its signature is the contract of Triton's OpenAI frontend for models other
# than vLLM's. Every input but text_input is optional (the model's defaults: textgen.Params).
TEXTGEN_OPTIONAL_INPUTS = ("max_tokens", "temperature", "top_p", "stream", "stop", "seed")
TEXTGEN_SIGNATURE = Signature(
    inputs=(
        Tensor("text_input", "BYTES", (-1, 1)),
        Tensor("max_tokens", "INT32", (-1, 1), optional=True),
        Tensor("temperature", "FP32", (-1, 1), optional=True),
        Tensor("top_p", "FP32", (-1, 1), optional=True),
        Tensor("stream", "BOOL", (-1, 1), optional=True),
        Tensor("stop", "BYTES", (-1, -1), optional=True),
        Tensor("seed", "INT64", (-1, 1), optional=True),
    ),
    # [1, pieces]: a response carries every piece its stream has ready (textgen_model.py, "Sending").
    outputs=(Tensor("text_output", "BYTES", (-1, -1)),),
)
TEXTGEN_TEXT = SAMPLE_CODE_DIR / "text" / "coriolanus.txt"
# The version's example request (modelport/core/example_request.py gives every input): the trial call at
# inspection sends it instead of zeros, which the model refuses (max_tokens 0, top_p 0).
TEXTGEN_EXAMPLE_REQUEST: dict[str, Any] = {"inputs": [
    {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["First Citizen:\n"]},
    {"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "data": [8]},
    {"name": "temperature", "datatype": "FP32", "shape": [1, 1], "data": [0.8]},
    {"name": "top_p", "datatype": "FP32", "shape": [1, 1], "data": [0.95]},
    {"name": "stream", "datatype": "BOOL", "shape": [1, 1], "data": [True]},
    {"name": "stop", "datatype": "BYTES", "shape": [1, 1], "data": ["\n\n"]},
    {"name": "seed", "datatype": "INT64", "shape": [1, 1], "data": [1]},
]}


@dataclass(frozen=True)
class TrainedTextgen:
    weights: bytes  # textgen.npz
    seconds: float  # CPU time of training, saving and loading back
    held_out_bits_per_char: float
    unigram_bits_per_char: float
    uniform_bits_per_char: float


@lru_cache(maxsize=1)
def train_textgen() -> TrainedTextgen:
    """The character model trained on the first 90% of TEXTGEN_TEXT (about half a second) and how well it predicts
    the other 10%, in bits per character, beside the baselines it must beat."""
    import math
    import time

    from models_registry.sample_models import textgen

    started = time.process_time()
    training, held_out = textgen.split_text(TEXTGEN_TEXT.read_text(encoding="utf-8"))
    counts = textgen.train(training)
    weights = textgen.save(counts)
    model = textgen.CharModel(textgen.load_counts(weights))
    seconds = time.process_time() - started
    model_bits, scored = model.log2_likelihood(held_out)
    unigram_bits, _ = textgen.unigram_log2_likelihood(counts, held_out)
    return TrainedTextgen(weights, seconds, -model_bits / scored, -unigram_bits / scored,
                          math.log2(len(counts.vocab)))


def build_textgen_zip() -> bytes:
    """model.py (decoupled), textgen.py and the weights textgen.npz, trained here from the text the repository
    ships: nothing is downloaded."""
    return _python_zip({
        "model.py": (SAMPLE_CODE_DIR / "textgen_model.py").read_bytes(),
        "textgen.py": (SAMPLE_CODE_DIR / "textgen.py").read_bytes(),
        "textgen.npz": train_textgen().weights,
        # No requirements.txt: numpy is the one it needs, and every python backend has it (the stub imports it);
        # a model with requirements gets no trial call at inspection (models_registry/python_trial.py).
    })


def make_textgen_zip(path: Path | str) -> SampleModel:
    """textgen.zip and textgen.signature.json beside it; upload it with decoupled=true (`model_transaction_policy
    { decoupled: true }`)."""
    from models_registry.sample_models import textgen

    path = Path(path)
    path.write_bytes(build_textgen_zip())
    _signature_file(path.with_name("textgen.signature.json"), TEXTGEN_SIGNATURE)
    trained = train_textgen()
    details = {
        "signature_file": "textgen.signature.json",
        "decoupled": True,
        "model": f"character {textgen.ORDER}-gram, Witten-Bell interpolated, trained on "
                 f"{TEXTGEN_TEXT.relative_to(SAMPLE_CODE_DIR.parent)} (Shakespeare, public domain) minus its last "
                 f"{textgen.HOLDOUT_FRACTION:.0%}",
        "held_out_bits_per_char": round(trained.held_out_bits_per_char, 3),
        "unigram_bits_per_char": round(trained.unigram_bits_per_char, 3),
        "optional_inputs": ", ".join(TEXTGEN_OPTIONAL_INPUTS),
        "output": f"text_output: whole pieces (a word, or up to {textgen.PIECE_MAX_CHARS} characters), one per "
                  "response unless the model's sending fell behind",
    }
    return _written(path, "textgen", TEXTGEN_SIGNATURE, "Streaming text generator (python backend, decoupled)",
                    details, fmt="python")


# --- the samples the portal deploys with one click (web/samples.py) -------------------------------------------

# The first held-out image (digits_holdout()[0], a 7; a test keeps the two equal), so that Try it and the sample
# PNG need no scikit-learn at page time.
SAMPLE_DIGIT_LABEL = 7
SAMPLE_DIGIT_PIXELS: tuple[int, ...] = (
    0, 0, 2, 13, 16, 9, 0, 0, 0, 0, 12, 12, 7, 16, 3, 0, 0, 1, 14, 3, 0, 16, 4, 0, 0, 0, 0, 4, 10, 16, 6, 0,
    0, 0, 0, 13, 16, 16, 9, 0, 0, 0, 0, 5, 13, 1, 0, 0, 0, 0, 0, 11, 9, 0, 0, 0, 0, 0, 1, 16, 4, 0, 0, 0,
)


@dataclass(frozen=True)
class SampleArtifact:
    """One sample model as an upload would send it: a file name, its bytes, and what the uploader declares."""

    name: str
    filename: str
    data: bytes
    format: str
    description: str
    signature: Signature | None = None  # declared (python models carry none); None: read from the file
    decoupled: bool = False  # it streams (uploaded with decoupled=true)
    example_request: dict[str, Any] | None = None  # the version's example request (the trial call sends it)


@lru_cache(maxsize=1)
def _digits_onnx_bytes() -> bytes:
    model = build_digits_onnx()
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def sample_artifacts(which: str) -> list[SampleArtifact]:
    """The models behind "Deploy the sample digits classifier" ("digits"), "... image pipeline" ("pipeline") and
    "... text generator" ("textgen"), in the order they must be created (a pipeline's steps first). Built in memory;
    the classifier and the text generator are trained once per process (about a second, half a second)."""
    if which == "textgen":
        return [SampleArtifact("textgen", "textgen.zip", build_textgen_zip(), "python",
                               "Streaming text generator (a character model of Shakespeare's Coriolanus, python "
                               "backend, decoupled), a Modelport sample", TEXTGEN_SIGNATURE, decoupled=True,
                               example_request=TEXTGEN_EXAMPLE_REQUEST)]
    digits = SampleArtifact("digits", "digits.onnx", _digits_onnx_bytes(), "onnx",
                            "Handwritten digit classifier (scikit-learn), a Modelport sample")
    if which == "digits":
        return [digits]
    if which == "pipeline":
        return [
            SampleArtifact("preprocess", "preprocess.zip", build_preprocess_zip(), "python",
                           "Digit image decoder (python backend, Pillow), a Modelport sample", PREPROCESS_SIGNATURE),
            digits,
            SampleArtifact("postprocess", "postprocess.zip", build_postprocess_zip(), "python",
                           f"Top-{TOP_K} labels (python backend), a Modelport sample", POSTPROCESS_SIGNATURE),
        ]
    raise ValueError(f"unknown sample {which!r}: use 'digits', 'pipeline' or 'textgen'")


def sample_digit_png() -> bytes:
    """SAMPLE_DIGIT_PIXELS as the PNG the pipeline takes."""
    return digits_png(np.asarray(SAMPLE_DIGIT_PIXELS, dtype=np.float32))[0]


# --- a sample directory ----------------------------------------------------------------------------------------


def _readme(samples: list[SampleModel]) -> str:
    lines = ["# Modelport sample models", "", "Written by `python manage.py make_sample_models DIR`.", ""]
    for sample in samples:
        lines += [f"## {sample.filename} ({sample.format})", "", sample.description, ""]
        for kind, tensors in (("input", sample.signature.inputs), ("output", sample.signature.outputs)):
            for tensor in tensors:
                lines.append(f"- {kind} `{tensor.name}`: {tensor.datatype} {list(tensor.dims)}")
        lines.append("")
        lines += [f"- {key}: {value}" for key, value in sample.details.items()]
        lines += [f"- sha256: {sample.sha256}", ""]
    lines += ["Dimensions of -1 are dynamic; the first one is the batch.", ""]
    return "\n".join(lines)


def write_samples(directory: Path | str, *, runtime_python: Path | None = None,
                  frameworks: Collection[str] = ()) -> list[SampleModel]:
    """Write digits.onnx, resnet.onnx, preprocess.zip, postprocess.zip and textgen.zip (with their signature
    files), digits-pipeline.json, samples.json and README.md into `directory` (created if needed); and resnet.pt /
    resnet.savedmodel.zip for the `frameworks` ("torch", "tensorflow") that the runtime env at `runtime_python`
    has."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    samples = [
        make_digits_onnx(directory / "digits.onnx"),
        make_resnet_onnx(directory / "resnet.onnx"),
        make_preprocess_zip(directory / "preprocess.zip"),
        make_postprocess_zip(directory / "postprocess.zip"),
        make_digits_pipeline_json(directory / "digits-pipeline.json"),
        make_textgen_zip(directory / "textgen.zip"),
    ]
    if runtime_python is not None:
        samples += make_resnet_framework_models(directory, runtime_python, frameworks)
    (directory / "samples.json").write_text(json.dumps([s.to_json() for s in samples], indent=2) + "\n")
    (directory / "README.md").write_text(_readme(samples))
    return samples
