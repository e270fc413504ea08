"""The depth check of an inference request's JSON: whether it nests arrays and objects deeper than the gateway's
limit (GATEWAY_MAX_JSON_DEPTH), found without a Python loop over the bytes. Triton's parser overflows its stack on
~300,000 levels, so this runs before any parser sees the body (gateway/protocol.py's parse_json_header, the fast
path's check_json). Its plain reference, the regex over strings it was first written as, is
gateway/fastpath/reference.py's `depth_steps` and `too_deep`; the property tests compare the two.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

# A JSON string, or an unterminated one up to the end: every match attempt succeeds in one pass (possessive, and
# no failure to restart from), so hostile input such as '"\\"\\"\\"...' stays linear.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")  # +1 / -1 as int8
_NUMPY_COUNT_BYTES = 4096


def _openers(data: bytes) -> int:
    """How many '[' and '{' bytes `data` holds. bytes.count steps a byte at a time (about 0.07 ms a pass over the
    CNN sample's 253 KB request, and it takes two); numpy compares many bytes per instruction, and one pass counts
    both, since '[' (0x5B) with bit 5 set is '{' (0x7B) and no other byte is (0.024 ms). Short JSON headers keep
    the plain count, which has no numpy call to pay for."""
    if len(data) < _NUMPY_COUNT_BYTES:
        return data.count(b"[") + data.count(b"{")
    return int(np.count_nonzero((np.frombuffer(data, dtype=np.uint8) | 0x20) == 0x7B))


# Up to this many brackets, _few_openers counts them by jumping from one to the next; past it numpy counts them all.
_FIND_OPENERS_MAX = 256


def _few_openers(data: bytes, limit: int) -> bool:
    """Whether `data` holds at most `limit` '[' and '{' bytes. A real request holds a few (the CNN sample's 253 KB
    holds 5), so bytes.find jumps from one to the next (memchr, many bytes per instruction, 0.007 ms over that
    request against 0.04-0.07 ms for _openers' numpy pass, which writes two 253 KB temporaries), stopping at the
    first over the limit. Past _FIND_OPENERS_MAX (a limit set that high), _openers counts them in one go."""
    if limit > _FIND_OPENERS_MAX:
        return _openers(data) <= limit
    left = limit
    for opener in (b"[", b"{"):
        at = data.find(opener)
        while at >= 0:
            if not left:
                return False
            left -= 1
            at = data.find(opener, at + 1)
    return True


def json_too_deep(data: bytes, limit: int) -> bool:
    """True when `data` nests arrays and objects deeper than `limit` (or its brackets outside strings do not
    balance, which json.loads would refuse anyway).

    No Python loop over the bytes, and no step per string: a count first (real requests rarely hold more brackets
    than the limit), else the brackets outside strings are found with numpy and bytes operations and numpy finds
    the deepest point of their running sum. A million '[' takes a few milliseconds, and so do a million strings."""
    if _few_openers(data, limit):
        return False
    if len(data) < _NUMPY_COUNT_BYTES:  # a short body: the regex, to which a few strings cost nothing
        steps = _bracket_steps(_JSON_STRING.sub(b"", data) if b'"' in data else data)
    else:
        steps = _depth_steps(_without_escapes(data) if b"\\" in data else data)
    return _unbalanced_or_deeper(steps, limit)


def _without_escapes(data: bytes) -> bytes:
    """`data` with its escaped backslashes and escaped quotes taken out, so that every quote left opens or closes a
    string. In JSON a backslash stands only inside a string, where it escapes the byte after it: a run of them
    escapes pairwise from its start (as bytes.replace takes them), and an odd one left escapes what follows.
    bytes.replace runs in C at memchr speed; the regex it replaces spent about 2 us per string, so a body of
    millions of short strings held the event loop for seconds (an attacker's reading of issue 23's depth check).
    Where a backslash stands outside a string the body is not JSON: the parser after this check refuses it either
    way (with this check's message or its own, both 400s)."""
    return data.replace(b"\\\\", b"").replace(b'\\"', b"")


def _bracket_steps(text: bytes) -> np.ndarray[Any, np.dtype[np.int8]]:
    """The +1 / -1 of every bracket in `text`, in order (its strings already taken out)."""
    return np.frombuffer(text.translate(None, _NOT_BRACKETS).translate(_DEPTH_STEP), dtype=np.int8)


def _unbalanced_or_deeper(steps: np.ndarray[Any, np.dtype[np.int8]], limit: int) -> bool:
    """Whether the running sum of the brackets' +1 / -1 goes past `limit`, below 0, or ends other than at 0. In
    slices of _DEPTH_SLICE steps, so that a body of nothing but brackets needs 8 MB for the sums, not 8 bytes a
    bracket."""
    depth = 0
    for start in range(0, len(steps), _DEPTH_SLICE):
        running = np.cumsum(steps[start:start + _DEPTH_SLICE], dtype=np.int64)
        running += depth
        if running.max() > limit or running.min() < 0:
            return True
        depth = int(running[-1])
    return depth != 0


_DEPTH_SLICE = 1 << 20
# Up to this many candidate brackets their positions are kept (8 bytes each, about 60 ns each to work with); past
# it the body's bytes outside strings are kept instead (a few bytes per byte of the body, 2-3 ns a byte).
_MAX_BRACKET_POSITIONS = 16384
# Up to this many quotes their positions are kept; past it their running parity (a byte per byte of the body,
# 0.85 ns a byte: too slow for a few quotes, bounded for millions).
_MAX_QUOTE_POSITIONS = 16384


def _depth_steps(data: bytes) -> np.ndarray[Any, np.dtype[np.int8]]:
    """The +1 / -1 of each bracket outside strings, in order, for a body whose every quote opens or closes a
    string (the second closes what the first opened, and so on, the last running to the end when they are odd in
    number): a bracket after an odd number of quotes is inside one. The same steps as blanking the strings with
    _JSON_STRING and dropping all but the brackets, in numpy passes over the bytes instead of a regex pass and two
    byte translations: the CNN request written as nested lists (as `tensor.tolist()` writes it, 196 of them)
    took 0.45 ms that way (docs/benchmarks.md, "The depth check of nested data").

    One body-sized temporary at a time where it can be, each made in place: with two or three alive, the
    allocator handed each back to the kernel and took it again per request, and the page faults cost more than
    the passes themselves."""
    raw = np.frombuffer(data, dtype=np.uint8)
    # x | 0x26 is 0x7F for the four brackets (and for 'Y', '_', 'y', DEL, dropped below), so one comparison finds
    # the candidates; the comparison is written over its own input.
    work = np.bitwise_or(raw, 0x26)
    found = np.equal(work, 0x7F, out=work.view(np.bool_))
    if np.count_nonzero(found) > _MAX_BRACKET_POSITIONS:
        del work, found  # before the next body-sized temporary
        return _depth_steps_by_bytes(data)
    candidates = np.flatnonzero(found)
    del work, found
    folded = raw[candidates] | 0x20  # '[' | 0x20 is '{', ']' | 0x20 is '}'
    opens = folded == 0x7B
    brackets = opens | (folded == 0x7D)
    positions = candidates[brackets]
    steps = np.where(opens[brackets], np.int8(1), np.int8(-1))
    quoted = np.equal(raw, 0x22)
    count = np.count_nonzero(quoted)
    if not count:
        return steps
    if count <= _MAX_QUOTE_POSITIONS:  # their positions, and how many precede each bracket
        inside = np.searchsorted(np.flatnonzero(quoted), positions) & 1
    else:
        inside = _quote_parity(quoted)[positions]
    return steps[inside == 0]


def _depth_steps_by_bytes(data: bytes) -> np.ndarray[Any, np.dtype[np.int8]]:
    """_depth_steps for a body crowded with brackets: the bytes outside strings kept, then the brackets' steps."""
    raw = np.frombuffer(data, dtype=np.uint8)
    quoted = np.equal(raw, 0x22)
    if np.count_nonzero(quoted):
        outside = np.logical_not(_quote_parity(quoted), out=quoted)  # a quote's own byte is no bracket
        data = raw[outside].tobytes()
        del outside, quoted
    return _bracket_steps(data)


def _quote_parity(quoted: np.ndarray[Any, np.dtype[np.bool_]]) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Whether an odd number of quotes stand at or before each byte (inside a string, for any byte but a quote),
    computed over `quoted` in place."""
    parity = quoted.view(np.uint8)
    np.bitwise_xor.accumulate(parity, out=parity)
    return quoted
