"""Untrusted JSON, bounded: no more nesting than any Modelport document needs.

Python's json module recurses once per level and raises RecursionError (not ValueError) near 1,000 levels, which
DRF's parser and most validators do not catch: a body of 10,000 `[` was a 500 in every JSON endpoint. Every
request body and every JSON-in-a-form-field (a signature, a pipeline definition) goes through `loads` or
`check_depth` here, and too deep is an ordinary ValueError with a message saying so.
"""

from __future__ import annotations

import json
from typing import Any

# The deepest Modelport document (a deployment spec with a warmup inside a model) is under 10 levels.
MAX_DEPTH = 32


class TooDeep(ValueError):
    pass


def _too_deep() -> TooDeep:
    return TooDeep(f"JSON nested deeper than {MAX_DEPTH} levels; no Modelport document needs more")


def check_depth(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Raise TooDeep if `value` nests lists and objects more than `max_depth` levels. Iterative, so that it cannot
    itself run out of stack, and it stops at the first container too deep."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > max_depth:
            raise _too_deep()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))


def loads(text: str | bytes) -> Any:
    """json.loads for untrusted text: ValueError (TooDeep) instead of RecursionError or an over-deep value."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep() from None
    check_depth(value)
    return value
