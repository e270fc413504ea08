"""What the CLI writes: JSON for machines on stdout, an upload progress bar on stderr."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO


def print_json(value: Any, stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    stream.write(json.dumps(value, indent=2, sort_keys=True) + "\n")
    stream.flush()


_verbose = False


def set_verbose(on: bool) -> None:
    """Whether info() writes: main() turns it on for --verbose or a terminal on stderr."""
    global _verbose
    _verbose = on


def info(message: str) -> None:
    """Human notes go to stderr, so that stdout stays what a script captures (a version number, JSON); and only
    when wanted (set_verbose), so that on failure the error is the one line a script finds on stderr."""
    if _verbose:
        print(message, file=sys.stderr, flush=True)


def human_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


class Progress:
    """Bytes, percent and speed of an upload. On a terminal one line redrawn in place; in a CI log (not a TTY) a
    plain line at every tenth, so that a large upload neither floods the log nor stays silent."""

    REDRAW_SECONDS = 0.1

    def __init__(self, total: int, label: str, stream: TextIO | None = None) -> None:
        self.total = total
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self.first: int | None = None  # bytes the server had before this run (a resumed upload)
        self.last_draw = 0.0
        self.last_tenth = -1
        self.done = 0

    def update(self, done: int) -> None:
        if self.first is None:
            self.first = done
            if done:
                self._write_line(f"{self.label}: resuming at {human_size(done)} of {human_size(self.total)}")
        self.done = done
        if self.tty:
            now = time.monotonic()
            if now - self.last_draw >= self.REDRAW_SECONDS or done >= self.total:
                self.last_draw = now
                self.stream.write("\r" + self._line(bar=True) + "\x1b[K")
                self.stream.flush()
            return
        tenth = 10 * done // self.total if self.total else 10
        if tenth > self.last_tenth:
            self.last_tenth = tenth
            self._write_line(self._line(bar=False))

    def note(self, message: str) -> None:
        """A line of its own (a retry, say) without breaking the bar: clear it, print, and let update() redraw."""
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.last_draw = 0.0
        self._write_line(f"{self.label}: {message}")

    def finish(self) -> None:
        if self.tty and self.first is not None:
            self.stream.write("\r" + self._line(bar=True) + "\x1b[K\n")
            self.stream.flush()

    def _speed(self) -> float:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        return (self.done - (self.first or 0)) / elapsed

    def _line(self, bar: bool) -> str:
        fraction = self.done / self.total if self.total else 1.0
        sizes = f"{human_size(self.done)} / {human_size(self.total)}"
        speed = f"{human_size(self._speed())}/s"
        if bar:
            width = 24
            filled = int(width * fraction)
            return f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {sizes} {fraction:4.0%} {speed}"
        return f"{self.label}: {sizes} ({fraction:.0%}), {speed}"

    def _write_line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()
