"""Bounded reads of what uploaded code writes: Triton's logs (the local files, a pod's log), pip's output, and the
excerpts of them copied into events and statuses.

A model may write one line of 300 MiB without a newline, so nothing here reads a log by lines alone: a tail is read
by seeking back from the end at most `max_bytes`, and every line is cut to `line_max` bytes with a visible marker.
What a caller gets is therefore at most about `max_bytes` whatever the log holds. Plain functions, no Django: the
callers pass the limits in (settings LOG_TAIL_MAX_BYTES, LOG_LINE_MAX_BYTES, LOG_EXCERPT_MAX_CHARS).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

DEFAULT_MAX_BYTES = 1024**2
DEFAULT_LINE_MAX = 16 * 1024
DEFAULT_EXCERPT_CHARS = 4000
# Lines of an excerpt (an event, a status) are cut shorter than a log's: an excerpt is read on a status page.
EXCERPT_LINE_MAX = 1000
_BLOCK = 64 * 1024
# C0 controls but tab and newline, DEL and C1: a hostile model's escape sequences must not reach a user's terminal
# (`modelport logs` prints the log as it is) nor blow up in JSON ("\u0000" is six bytes for one). The line and
# paragraph separators too: str.splitlines() breaks at them, so a name printed by another team's model into a shared
# pool's log could start a line there that reads as the server's own.
_CONTROL_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


# The prefix of a line Triton itself writes (`I1201 14:45:15.484194 1 file.cc:472] ...`): a line a model's process
# printed (onnxruntime's warnings, a model.py's prints), whose words the model's uploader chose, has none.
TRITON_LINE_RE = re.compile(r"^([IWE])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]]*\] ?")


def cut_marker(cut: int, *, more: bool = False) -> str:
    """The visible sign that a line was cut: `more` when the line began before what was read."""
    return f"… ({'more than ' if more else ''}{cut:,} bytes cut)"


def read_tail(paths: Sequence[Path], lines: int, *, max_bytes: int = DEFAULT_MAX_BYTES,
              line_max: int = DEFAULT_LINE_MAX) -> str:
    """The last `lines` lines of the log written to `paths` (oldest file first, e.g. a rotated file then the current
    one; missing files are skipped), read from the end and never more than `max_bytes` of them, each line cut to
    `line_max` bytes. "" when there is nothing yet."""
    chunks: list[bytes] = []
    budget = max_bytes
    newlines = 0
    at_start = True  # whether what was read begins at the start of a line
    for path in reversed(paths):
        if newlines > lines:
            break
        if budget <= 0:
            at_start = at_start and not path.exists()  # an older file goes on the line read last
            break
        data, whole = _read_end(path, budget, lines - newlines)
        if not data:
            continue
        chunks.append(data)
        budget -= len(data)
        newlines += data.count(b"\n")
        at_start = whole
    return _format(b"".join(reversed(chunks)), lines, line_max, partial_first=not at_start)


def tail_text(text: str | bytes, lines: int, *, max_bytes: int = DEFAULT_MAX_BYTES,
              line_max: int = DEFAULT_LINE_MAX) -> str:
    """read_tail() for output already in memory (a pod's log as the API server sent it, pip's output)."""
    data = text.encode("utf-8", "replace") if isinstance(text, str) else text
    partial = len(data) > max_bytes
    return _format(data[-max_bytes:] if partial else data, lines, line_max, partial_first=partial)


def excerpt(text: str, max_chars: int = DEFAULT_EXCERPT_CHARS, *, line_max: int = EXCERPT_LINE_MAX) -> str:
    """At most `max_chars` of `text` for an event or a status: its start (the sentence that says what happened
    comes first), each line cut to `line_max` characters, with a marker where anything was cut."""
    if len(text) <= max_chars and all(len(line) <= line_max for line in text.split("\n")):
        return text
    kept: list[str] = []
    size = 0
    lines = text.split("\n")
    for index, line in enumerate(lines):
        room = max_chars - size
        if room <= 0:
            kept.append(cut_marker(len("\n".join(lines[index:]).encode("utf-8", "replace"))))
            break
        limit = min(line_max, room)
        if len(line) > limit:
            line = line[:limit] + cut_marker(len(line[limit:].encode("utf-8", "replace")))
        kept.append(line)
        size += len(line) + 1
    return "\n".join(kept)


def _read_end(path: Path, budget: int, lines: int) -> tuple[bytes, bool]:
    """Up to `budget` bytes from the end of `path`, read backwards in blocks until they hold more than `lines`
    newlines; and whether they begin at the file's start."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # not there (yet, or any more), or no file that can be read: nothing to show
        return b"", True
    try:
        end = os.fstat(fd).st_size
        position = end
        blocks: list[bytes] = []
        newlines = 0
        while position > 0 and end - position < budget and newlines <= lines:
            size = min(_BLOCK, position, budget - (end - position))
            position -= size
            block = os.pread(fd, size, position)
            blocks.append(block)
            newlines += block.count(b"\n")
        return b"".join(reversed(blocks)), position == 0
    finally:
        os.close(fd)


def _format(data: bytes, lines: int, line_max: int, *, partial_first: bool) -> str:
    if not data or lines < 1:
        return ""
    parts = data.split(b"\n")
    ends_with_newline = parts[-1] == b""
    if ends_with_newline:
        parts.pop()
    first_is_partial = partial_first
    if len(parts) > lines:
        parts = parts[-lines:]
        first_is_partial = False
    elif partial_first and len(parts) > 1:
        parts = parts[1:]  # a line that began before what was read: the next ones are whole
        first_is_partial = False
    out = [_line(part, line_max, more=first_is_partial and i == 0) for i, part in enumerate(parts)]
    return "\n".join(out) + ("\n" if ends_with_newline else "")


def _line(raw: bytes, line_max: int, *, more: bool) -> str:
    cut = len(raw) - line_max
    text = raw[:line_max].decode("utf-8", "replace") if cut > 0 else raw.decode("utf-8", "replace")
    text = _CONTROL_RE.sub("\ufffd", text.removesuffix("\r"))
    if cut > 0:
        return text + cut_marker(cut, more=more)
    return text + (cut_marker(max(cut, 0), more=True) if more else "")
