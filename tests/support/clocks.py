"""Clocks that tests move by hand."""

from __future__ import annotations

from datetime import UTC, datetime


class UrlClock:
    """The time the runtime measures URL expiry with, and botocore signs URLs with: tests move it."""

    def __init__(self) -> None:
        self.time = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.time
