"""--memory and --cpu: Kubernetes quantities ("512Mi", "2Gi", "500m", "1.5"), checked on the command line so that a
typo is exit 2 before anything is sent.

The portal's rule is modelport/core/quantity.py (the CLI is its own distribution and imports nothing of the
portal); a test keeps the two agreeing on what is accepted. The portal checks again: its answer is the one that
counts, this one only says sooner and in the command line's words.
"""

from __future__ import annotations

import argparse
import re
from decimal import Decimal, InvalidOperation, localcontext

MAX_LENGTH = 32
_QUANTITY_RE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                          r"(?P<suffix>[KMGTPE]i|[mkMGTPE]|[eE][+-]?[0-9]{1,3})?")
_MULTIPLIERS: dict[str, Decimal] = {
    "": Decimal(1), "m": Decimal("0.001"),
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate("kMGTPE")},
    **{f"{s}i": Decimal(1024) ** (i + 1) for i, s in enumerate("KMGTPE")},
}
# What people write for a unit that Kubernetes spells otherwise.
_GUESSES = {"kb": "k", "mb": "M", "gb": "G", "tb": "T", "kib": "Ki", "mib": "Mi", "gib": "Gi", "tib": "Ti",
            "ki": "Ki", "mi": "Mi", "gi": "Gi", "ti": "Ti", "g": "G", "t": "T"}

MEMORY_MIN = Decimal(2**20)  # 1Mi
MEMORY_MAX = Decimal(16 * 2**40)  # 16Ti
CPU_MIN = Decimal("0.001")  # 1m
CPU_MAX = Decimal(1024)
MEMORY_EXAMPLES = "512Mi, 4Gi or 16G"
CPU_EXAMPLES = "2, 0.5 or 500m"


def _value(text: str, what: str, examples: str) -> Decimal:
    """The exact value of a quantity, or a usage error that says how to write one."""
    if len(text) > MAX_LENGTH:
        raise argparse.ArgumentTypeError(f"{len(text)} characters is not {what} (at most {MAX_LENGTH})")
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        typo = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([A-Za-z]+)\s*", text)
        guess = _GUESSES.get(typo[2].lower()) if typo else None
        hint = f" (did you mean {typo[1]}{guess}?)" if typo and guess else (
            ", and not negative" if text.strip().startswith("-") else "")
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}: write e.g. {examples}{hint}")
    suffix = match["suffix"] or ""
    try:
        with localcontext(prec=200):  # exact: at most 32 digits and a 3-digit exponent
            number = Decimal(match["number"])
            if suffix not in _MULTIPLIERS:  # a decimal exponent ("E" alone is exa)
                return number.scaleb(int(suffix[1:]))
            return number * _MULTIPLIERS[suffix]
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}: write e.g. {examples}") from None


def memory(text: str) -> str:
    """--memory: per server, 1Mi to 16Ti in whole bytes."""
    value = _value(text, "a memory size", MEMORY_EXAMPLES)
    if value > MEMORY_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is more than a deployment may ask for (at most 16Ti)")
    if value < MEMORY_MIN:
        if text.endswith("m"):
            why = f"{text!r} is {value} bytes (m means thousandths; Mi is mebibytes)"
        elif re.fullmatch(r"[0-9.]+", text):
            why = f"{text!r} is {value} bytes: memory needs a unit"
        else:
            why = f"{text!r} is less than a deployment may ask for (at least 1Mi)"
        raise argparse.ArgumentTypeError(f"{why}; write e.g. {MEMORY_EXAMPLES}")
    if value % 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bytes; write e.g. {MEMORY_EXAMPLES}")
    return text


def cpu(text: str) -> str:
    """--cpu: cores per server, 1m (a thousandth of a core) to 1024."""
    value = _value(text, "a number of cores", CPU_EXAMPLES)
    if value > CPU_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is more than a deployment may ask for (at most 1024 cores)")
    if value < CPU_MIN:
        raise argparse.ArgumentTypeError(f"{text!r} is less than a deployment may ask for (at least 1m, a "
                                         f"thousandth of a core); write e.g. {CPU_EXAMPLES}")
    if value % CPU_MIN:
        raise argparse.ArgumentTypeError(f"{text!r} is more precise than Kubernetes allows: the smallest step is a "
                                         "thousandth of a core (1m)")
    return text
