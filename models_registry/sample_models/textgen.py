"""The sample text generator's language model: a character n-gram with Witten-Bell interpolation, trained in well
under a second on text the repository ships (text/coriolanus.txt). Plain numpy, no Triton: the portal trains it
(models_registry/samples.py) and the python-backend model (textgen_model.py, zipped beside this file as model.py)
loads it and generates.

A stream yields *pieces*: the characters up to and including a whitespace, or PIECE_MAX_CHARS of them, whichever
comes first, so a piece is about a word. `max_tokens` counts pieces.

The weights are counts saved as .npz with plain arrays only (no pickle: pickle is code). Loading turns them into one
dense probability row per seen context, so that one generation step for many streams is one gather and a few
vectorised operations on a [streams, vocabulary] matrix: batching streams makes each step cheaper per stream.
"""

from __future__ import annotations

import io
import math
import zipfile
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

ORDER = 5  # characters of context plus the one predicted: 5 scored best on the held-out text (4-8 tried)
PIECE_MAX_CHARS = 8
HOLDOUT_FRACTION = 0.1  # the end of the text, never trained on, for the log-likelihood tests
MAX_STOPS = 4  # as OpenAI's API
MAX_STOP_CHARS = 64
MAX_TOKENS_LIMIT = 1024
MAX_TEMPERATURE = 2.0
WEIGHTS_VERSION = 1
_ZIP_DATE = (2026, 1, 1, 0, 0, 0)


class BadRequest(ValueError):
    """A generation request that cannot be honoured; the message says what to fix."""


@dataclass(frozen=True)
class Counts:
    """What training learns: how often each character followed each context of 1..order-1 characters."""

    vocab: str
    order: int
    unigram: np.ndarray  # int64 [V]
    contexts: dict[str, Counter[int]] = field(repr=False)


def split_text(text: str, holdout_fraction: float = HOLDOUT_FRACTION) -> tuple[str, str]:
    """(training text, held-out text), cut at a line break so the held-out part starts a line."""
    cut = text.rfind("\n", 0, int(len(text) * (1 - holdout_fraction))) + 1
    return text[:cut], text[cut:]


def train(text: str, order: int = ORDER) -> Counts:
    if order < 1:
        raise ValueError(f"order must be at least 1, got {order}")
    if not text:
        raise ValueError("cannot train on an empty text")
    vocab = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(vocab)}
    ids = [index[c] for c in text]
    unigram = np.bincount(ids, minlength=len(vocab)).astype(np.int64)
    contexts: dict[str, Counter[int]] = {}
    for k in range(1, order):
        for i in range(k, len(text)):
            contexts.setdefault(text[i - k:i], Counter())[ids[i]] += 1
    return Counts(vocab=vocab, order=order, unigram=unigram, contexts=contexts)


def save(counts: Counts) -> bytes:
    """The counts as .npz bytes: contexts in one fixed-width unicode array, their followers in CSR form."""
    names = sorted(counts.contexts)
    offsets = np.zeros(len(names) + 1, dtype=np.int64)
    followers: list[int] = []
    amounts: list[int] = []
    for row, name in enumerate(names):
        counter = counts.contexts[name]
        for char_id in sorted(counter):
            followers.append(char_id)
            amounts.append(counter[char_id])
        offsets[row + 1] = len(followers)
    arrays = {
        "version": np.array(WEIGHTS_VERSION),
        "order": np.array(counts.order),
        "vocab": np.array(list(counts.vocab)),
        "unigram": counts.unigram,
        "contexts": np.array(names if names else [""]),
        "offsets": offsets,
        "followers": np.array(followers, dtype=np.int32),
        "amounts": np.array(amounts, dtype=np.int64),
    }
    # np.savez stamps the time into the zip; a fixed one makes the same text give the same bytes.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w") as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
    return buffer.getvalue()


def load_counts(data: bytes) -> Counts:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        if int(npz["version"]) != WEIGHTS_VERSION:
            raise ValueError(f"weights version {int(npz['version'])}, this code reads {WEIGHTS_VERSION}")
        vocab = "".join(npz["vocab"].tolist())
        offsets, followers, amounts = npz["offsets"], npz["followers"], npz["amounts"]
        names = npz["contexts"].tolist()[: len(offsets) - 1]
        contexts = {
            name: Counter(dict(zip(followers[offsets[row]:offsets[row + 1]].tolist(),
                                   amounts[offsets[row]:offsets[row + 1]].tolist(), strict=True)))
            for row, name in enumerate(names)
        }
        return Counts(vocab=vocab, order=int(npz["order"]), unigram=npz["unigram"].astype(np.int64),
                      contexts=contexts)


class CharModel:
    """P(next character | the last order-1 characters), Witten-Bell interpolated down to an add-one unigram."""

    def __init__(self, counts: Counts) -> None:
        self.vocab = counts.vocab
        self.order = counts.order
        self.char_ids = {c: i for i, c in enumerate(counts.vocab)}
        size = len(counts.vocab)
        unigram = (counts.unigram + 1.0) / (counts.unigram.sum() + size)
        # Row 0 is the empty context. Shorter contexts come first, so each one's suffix already has its row.
        names = sorted(counts.contexts, key=lambda name: (len(name), name))
        self.rows = {"": 0}
        table = np.empty((len(names) + 1, size), dtype=np.float64)
        table[0] = unigram
        for row, name in enumerate(names, start=1):
            counter = counts.contexts[name]
            seen = np.zeros(size)
            seen[list(counter)] = list(counter.values())
            total, types = seen.sum(), len(counter)
            # Witten-Bell: the weight of the shorter context is how often this one was followed by a new character.
            table[row] = (seen + types * table[self.rows[name[1:]]]) / (total + types)
            self.rows[name] = row
        self.table = table

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def row_of(self, text: str) -> int:
        """The row of the longest seen context that ends `text` (characters the model never saw end a context)."""
        tail = text[-(self.order - 1):] if self.order > 1 else ""
        for start in range(len(tail) + 1):
            row = self.rows.get(tail[start:])
            if row is not None:
                return row
        return 0  # unreachable: "" is always there

    def log2_likelihood(self, text: str, prompt: str = "") -> tuple[float, int]:
        """Total log2 P of `text`'s known characters after `prompt`, and how many were scored."""
        total, scored, context = 0.0, 0, prompt
        for char in text:
            char_id = self.char_ids.get(char)
            if char_id is not None:
                total += math.log2(self.table[self.row_of(context), char_id])
                scored += 1
            context = (context + char)[-self.order:]
        return total, scored


def unigram_log2_likelihood(counts: Counts, text: str) -> tuple[float, int]:
    """The baseline a learned model must beat: each character's add-one frequency, with no context."""
    probabilities = (counts.unigram + 1.0) / (counts.unigram.sum() + len(counts.vocab))
    ids = [counts.vocab.index(c) for c in text if c in counts.vocab]
    return float(np.log2(probabilities[ids]).sum()), len(ids)


# --- generation --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    """One request's settings, checked: build with make_params()."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


def make_params(max_tokens: int | None = None, temperature: float | None = None, top_p: float | None = None,
                stop: Sequence[str] = (), seed: int | None = None) -> Params:
    """Params from a request's optional values (None: the default); raises BadRequest naming what to fix."""
    defaults = Params()
    max_tokens = defaults.max_tokens if max_tokens is None else int(max_tokens)
    if not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise BadRequest(f"max_tokens must be between 1 and {MAX_TOKENS_LIMIT}, got {max_tokens}")
    # Rounded to float32, as the model's FP32 inputs carry them: the same settings sample the same text in-process.
    temperature = defaults.temperature if temperature is None else float(np.float32(temperature))
    if not 0.0 <= temperature <= MAX_TEMPERATURE:  # NaN fails both comparisons
        raise BadRequest(f"temperature must be between 0 and {MAX_TEMPERATURE}, got {temperature}")
    top_p = defaults.top_p if top_p is None else float(np.float32(top_p))
    if not 0.0 < top_p <= 1.0:
        raise BadRequest(f"top_p must be greater than 0 and at most 1, got {top_p}")
    stops = tuple(stop)
    if len(stops) > MAX_STOPS:
        raise BadRequest(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
    for s in stops:
        if not 1 <= len(s) <= MAX_STOP_CHARS:
            raise BadRequest(f"each stop string must have 1 to {MAX_STOP_CHARS} characters, got {len(s)}")
    if seed is not None and not 0 <= int(seed) < 2**63:
        raise BadRequest(f"seed must be between 0 and 2**63-1, got {seed}")
    return Params(max_tokens, temperature, top_p, stops, None if seed is None else int(seed))


@dataclass
class Stream:
    """One request's generation: the context it continues, what it generated, what was already handed out."""

    prompt: str
    params: Params
    rng: np.random.Generator
    text: str = ""  # generated so far
    sent: int = 0  # characters of `text` already in pieces
    piece_chars: int = 0  # characters generated since the last piece ended
    pieces_generated: int = 0
    done: bool = False

    def context(self, order: int) -> str:
        """The last order-1 characters of prompt + text, without copying a long prompt at every step."""
        want = order - 1
        if want <= 0:
            return ""
        tail = self.text[-want:]
        missing = want - len(tail)
        return self.prompt[-missing:] + tail if missing and self.prompt else tail


def new_stream(prompt: str, params: Params) -> Stream:
    # No seed: fresh entropy from the OS, as an API without a seed gives.
    return Stream(prompt=prompt, params=params, rng=np.random.default_rng(params.seed))


def choose(probabilities: np.ndarray, temperatures: np.ndarray, top_ps: np.ndarray,
           uniforms: np.ndarray) -> np.ndarray:
    """One character id per row of `probabilities` [B, V]: temperature 0 takes the most likely, otherwise the
    distribution is sharpened by 1/temperature, cut to its top_p nucleus and sampled with the row's uniform draw."""
    greedy = probabilities.argmax(axis=1)
    warm = temperatures > 0
    if not warm.any():
        return greedy
    p, t = probabilities[warm], temperatures[warm][:, None]
    logits = np.log(p) / t
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    order = np.argsort(-p, axis=1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=1)
    before = np.cumsum(sorted_p, axis=1) - sorted_p  # mass of the more likely characters
    sorted_p = np.where(before < top_ps[warm][:, None], sorted_p, 0.0)  # the first one is always kept
    cumulative = np.cumsum(sorted_p, axis=1)
    draws = uniforms[warm][:, None] * cumulative[:, -1:]
    picked = np.minimum((cumulative <= draws).sum(axis=1), p.shape[1] - 1)
    chosen = greedy.copy()
    chosen[warm] = order[np.arange(len(order)), picked]
    return chosen


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could be the start of a stop string (kept back until known)."""
    longest = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:k]):
                longest = k
                break
    return longest


def step(model: CharModel, streams: Sequence[Stream]) -> list[str | None]:
    """Generate one character for every unfinished stream; per stream, the piece it completed ("" never), or None.
    A stream is done when it has generated max_tokens pieces or a stop string (which the text leaves out)."""
    active = [s for s in streams if not s.done]
    out: list[str | None] = [None] * len(streams)
    if not active:
        return out
    rows = np.fromiter((model.row_of(s.context(model.order)) for s in active), dtype=np.int64, count=len(active))
    chosen = choose(
        model.table[rows],
        np.array([s.params.temperature for s in active]),
        np.array([s.params.top_p for s in active]),
        np.array([s.rng.random() for s in active]),
    )
    position = {id(s): i for i, s in enumerate(streams)}
    for stream, char_id in zip(active, chosen.tolist(), strict=True):
        out[position[id(stream)]] = _advance(stream, model.vocab[char_id])
    return out


def _advance(stream: Stream, char: str) -> str | None:
    stream.text += char
    params = stream.params
    for s in params.stop:
        if stream.text.endswith(s):
            stream.text = stream.text[: -len(s)]
            stream.done = True
            return _take(stream, len(stream.text))
    stream.piece_chars += 1
    if not (char.isspace() or stream.piece_chars >= PIECE_MAX_CHARS):
        return None
    stream.piece_chars = 0
    stream.pieces_generated += 1
    if stream.pieces_generated >= params.max_tokens:
        stream.done = True
        return _take(stream, len(stream.text))
    return _take(stream, len(stream.text) - _held_back(stream.text[stream.sent:], params.stop))


def _take(stream: Stream, end: int) -> str | None:
    piece = stream.text[stream.sent:end]
    stream.sent = max(stream.sent, end)
    return piece or None


def generate(model: CharModel, prompt: str, params: Params) -> Iterator[str]:
    """The pieces of one stream, one by one (for a single caller; a server steps many streams at once)."""
    stream = new_stream(prompt, params)
    while not stream.done:
        (piece,) = step(model, [stream])
        if piece is not None:
            yield piece
