"""An inference answer's repeated "parameters" keys, dropped before the caller gets it (issue 31).

Triton has been seen answering a pipeline (an ensemble) with the same key twice in its "parameters" object
(`"parameters":{"sequence_id":0,...,"sequence_id":0}`): a JSON object with a repeated key, which strict readers
refuse and others read differently (the first wins in rapidjson, the last in Python's json). The Triton here (2.51)
did not repeat it when probed with the test pipelines (plain, with sequence parameters, binary in and out), so this
acts only where a key does repeat.

Cost on the common path, measured by gateway/tests/test_answer_params.py on 800 KB answers: about 1 µs for a single
model's (two `bytes.find` over the part before "outputs"), a few µs for an ensemble's (its small parameters object
parsed alone); the answer is copied only when a key repeats. Only the answer's own parameters are looked at, not
its outputs' (a binary_data_size each, never seen repeated).
"""

from __future__ import annotations

import json
from typing import Any

# Triton writes compact JSON: the key, a colon and the object's brace with nothing between. Inside a JSON string the
# quotes would be escaped, so the marker is always a real key.
MARKER = b'"parameters":{'
OUTPUTS = b'"outputs":['
# A parameter's value is a scalar (bool, number, string); a string holding "}" ends the first try early: a few more
# closing braces are tried before the object is left as it came.
_TRIES = 8
# A model's python backend may set its own response parameters: at most this much of them is parsed (on the event
# loop every team's requests share); a larger object is passed on as it came.
MAX_OBJECT_BYTES = 64 * 1024


def without_repeated_keys(payload: bytes, header_length: int | None) -> tuple[bytes, int | None] | None:
    """(payload, new header length) with each "parameters" object's repeated keys said once, keeping the value
    read last (what Python's json, and so tritonclient, read before: a caller sees the same values), or None when
    no key repeats (nothing copied). `header_length`: the JSON part's length in a binary answer (None: all JSON)."""
    end = len(payload) if header_length is None else header_length
    # Triton writes the answer's own parameters before its outputs: the scan stops there, so that an answer of
    # megabytes of JSON numbers costs what a small one does.
    outputs = payload.find(OUTPUTS, 0, end)
    end = end if outputs < 0 else outputs
    at = payload.find(MARKER, 0, end)
    if at < 0:
        return None
    pieces: list[bytes] = []
    kept_from = 0
    while at >= 0:
        opening = at + len(MARKER) - 1
        found = _object_at(payload, opening, end)
        if found is None:
            at = payload.find(MARKER, opening + 1, end)
            continue
        pairs, closing = found
        if len({key for key, _ in pairs}) != len(pairs):
            once: dict[str, Any] = {}
            for key, value in pairs:
                once.pop(key, None)
                once[key] = value  # the last value, at the place of its last occurrence
            pieces += [payload[kept_from:opening], json.dumps(once, separators=(",", ":"),
                                                              ensure_ascii=False).encode()]
            kept_from = closing
        at = payload.find(MARKER, closing, end)
    if not pieces:
        return None
    rewritten = b"".join([*pieces, payload[kept_from:]])
    shrunk = len(payload) - len(rewritten)
    return rewritten, (None if header_length is None else header_length - shrunk)


def _object_at(payload: bytes, opening: int, end: int) -> tuple[list[tuple[str, Any]], int] | None:
    """The flat object that opens at `opening`, as its (key, value) pairs in order, and the offset just past it; None
    where it is not one (a nested object, a string value holding many braces, bytes that are no JSON)."""
    closing = opening
    end = min(end, opening + MAX_OBJECT_BYTES)
    for _ in range(_TRIES):
        closing = payload.find(b"}", closing + 1, end)
        if closing < 0:
            return None
        try:
            pairs = json.loads(payload[opening:closing + 1], object_pairs_hook=list)
        except ValueError:
            continue
        if isinstance(pairs, list) and not any(isinstance(v, list) for _, v in pairs):
            return pairs, closing + 1
        return None
    return None
