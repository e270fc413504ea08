"""The windows the performance panel offers, by name. Plain code."""

from __future__ import annotations

from datetime import timedelta

WINDOWS: dict[str, timedelta] = {
    "5m": timedelta(minutes=5),
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
}
DEFAULT_WINDOW = "15m"
LONGEST = max(WINDOWS.values())


def parse_window(text: str | None) -> timedelta | None:
    """The window named `text` (None for the default), or None when it names none."""
    return WINDOWS.get(DEFAULT_WINDOW if text is None else text)


def allowed() -> str:
    return ", ".join(WINDOWS)
