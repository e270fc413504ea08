"""Kubernetes resource quantities ("2", "500m", "4Gi", "1.5e3"), parsed exactly and bounded.

A deployment's `resources.cpu` and `resources.memory` come from team members and end up in a pod spec: a string
the API server refuses (or, worse, accepts: 400 nines of cores) must be a 400 naming the field when the spec is
written, not a failed rollout later. The grammar is Kubernetes' own (k8s.io/apimachinery resource.Quantity):

    quantity = number suffix;  number = digits | digits "." [digits] | "." digits
    suffix   = "" | "m" | "k" | "M" | "G" | "T" | "P" | "E"        (powers of 1000)
             | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"              (powers of 1024)
             | ("e" | "E") ["+" | "-"] digits                       (a decimal exponent)

Signs are left out on purpose: no resource here may be negative, and "+2" is nobody's intent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, localcontext

# Longer strings are refused before any parsing: "9" * 400 costs nothing to refuse.
MAX_LENGTH = 32
_QUANTITY_RE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                          r"(?P<suffix>[KMGTPE]i|[mkMGTPE]|[eE][+-]?[0-9]{1,3})?")
_MULTIPLIERS: dict[str, Decimal] = {
    "": Decimal(1), "m": Decimal("0.001"),
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate("kMGTPE")},
    **{f"{s}i": Decimal(1024) ** (i + 1) for i, s in enumerate("KMGTPE")},
}
_SUFFIXES = "m, k, M, G, T, P, E (powers of 1000) or Ki, Mi, Gi, Ti, Pi, Ei (powers of 1024)"


class QuantityError(ValueError):
    """Not a Kubernetes quantity, or out of the bounds of its kind; the message says what to write instead."""


def parse_quantity(text: str) -> Decimal:
    """The exact value of a quantity (cores, bytes), or QuantityError."""
    if len(text) > MAX_LENGTH:
        raise QuantityError(f"a value of {len(text)} characters is not a Kubernetes quantity (at most {MAX_LENGTH})")
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity: write a number with an optional suffix "
                            f"{_SUFFIXES}{_hint(text)}")
    suffix = match["suffix"] or ""
    with localcontext(prec=200):  # exact: at most 32 digits, exponents of at most 3 digits
        number = Decimal(match["number"])
        if suffix not in _MULTIPLIERS:  # a decimal exponent ("E" alone is exa)
            return number.scaleb(int(suffix[1:]))
        return number * _MULTIPLIERS[suffix]


def _hint(text: str) -> str:
    """What a common mistake probably meant."""
    if text.strip().startswith("-"):
        return ", and not negative"
    typo = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([A-Za-z]+)\s*", text)
    guess = _GUESSES.get(typo[2].lower()) if typo else None
    return f" (did you mean \"{typo[1]}{guess}\"?)" if typo and guess else ""


_GUESSES = {"kb": "k", "mb": "M", "gb": "G", "tb": "T", "kib": "Ki", "mib": "Mi", "gib": "Gi", "tib": "Ti",
            "ki": "Ki", "mi": "Mi", "gi": "Gi", "ti": "Ti", "g": "G", "t": "T"}


@dataclass(frozen=True)
class Bounds:
    """The sane range of one kind of resource, and the smallest step Kubernetes represents for it."""

    minimum: Decimal
    maximum: Decimal
    step: Decimal
    minimum_text: str
    maximum_text: str
    step_text: str
    examples: str


CPU = Bounds(minimum=Decimal("0.001"), maximum=Decimal(1024), step=Decimal("0.001"),
             minimum_text="1m, a thousandth of a core", maximum_text="1024 cores",
             step_text="a thousandth of a core (1m)", examples='"2", "0.5" or "500m"')
MEMORY = Bounds(minimum=Decimal(2**20), maximum=Decimal(16 * 2**40), step=Decimal(1),
                minimum_text="1Mi", maximum_text="16Ti", step_text="one byte", examples='"512Mi", "4Gi" or "16G"')


def check_quantity(text: str, bounds: Bounds) -> Decimal:
    """The value of `text` within `bounds`, or QuantityError saying what to change."""
    value = parse_quantity(text)
    if value > bounds.maximum:
        raise QuantityError(f"{text!r} is more than a deployment may ask for (at most {bounds.maximum_text})")
    if value < bounds.minimum:
        if bounds is MEMORY and text.endswith("m"):
            why = f"{text!r} is {value} bytes (m means thousandths; Mi is mebibytes)"
        elif bounds is MEMORY and "." not in text and text.isdigit():
            why = f"{text!r} is {value} bytes: memory needs a unit"
        else:
            why = f"{text!r} is less than a deployment may ask for (at least {bounds.minimum_text})"
        raise QuantityError(f"{why}; for example {bounds.examples}")
    if value % bounds.step:
        raise QuantityError(f"{text!r} is more precise than Kubernetes allows: the smallest step is {bounds.step_text}")
    return value
