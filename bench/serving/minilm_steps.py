"""Pre- and post-processing of the sentence-embedding workload (all-MiniLM-L6-v2), shared by every server.

The same two functions run in the hand-rolled servers, in the in-process bound and, zipped beside model.py, in
the Triton python models `minilm-tokenize` and `minilm-pool`, so every server does exactly the same work around
the ONNX transformer. Only numpy and the `tokenizers` library: it runs in Triton's runtime env too.

What sentence-transformers does for this model (modules.json: Transformer, Pooling, Normalize):
- tokenize with the model's tokenizer.json (BERT WordPiece, lower case), truncated to max_seq_length 256;
- the transformer gives one 384-wide vector per token (`last_hidden_state`);
- mean pooling over the tokens the attention mask keeps, then L2 normalization.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

MAX_SEQ_LENGTH = 256  # sentence_bert_config.json of the model
EMBEDDING_SIZE = 384


def load_tokenizer(path: Path | str) -> Tokenizer:
    # Imported here: the pooling step needs only numpy, so its Triton model does not require `tokenizers`.
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(MAX_SEQ_LENGTH)
    # Pad to the longest text of a call, as sentence-transformers does; one text per call gets no padding.
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    return tokenizer


def tokenize(tokenizer: Tokenizer, texts: list[str]) -> dict[str, np.ndarray]:
    """input_ids, attention_mask, token_type_ids: int64 [len(texts), tokens]."""
    encodings = tokenizer.encode_batch(texts)
    return {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }


def mean_pool(last_hidden_state: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """float32 [batch, 384]: the mean of the kept tokens' vectors, L2-normalized (sentence-transformers' Pooling
    with pooling_mode_mean_tokens, then Normalize)."""
    mask = attention_mask.astype(np.float32)[:, :, None]
    summed = (last_hidden_state.astype(np.float32) * mask).sum(axis=1)
    mean = summed / np.clip(mask.sum(axis=1), 1e-9, None)
    norm = np.linalg.norm(mean, axis=1, keepdims=True)
    return (mean / np.clip(norm, 1e-12, None)).astype(np.float32)


def texts_from_bytes(values: np.ndarray) -> list[str]:
    """A BYTES tensor's elements (bytes, or str from a JSON request) as strings."""
    return [v.decode("utf-8") if isinstance(v, bytes | bytearray | np.bytes_) else str(v) for v in values.reshape(-1)]
