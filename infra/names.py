"""The one naming rule for everything that becomes a Triton model name, a Kubernetes object name or an S3 key."""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError

# Checked with fullmatch: with match(), "$" also matches before a trailing newline, so "digits\n" would pass.
NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
NAME_RULE = (
    "use 1 to 63 characters: lowercase letters a-z, digits and hyphens, "
    "starting and ending with a letter or digit (like a DNS label)"
)


# Words the portal's own pages use in their URLs (/models/upload/, /deployments/new/).
RESERVED_NAMES = frozenset({"upload", "new"})


def name_error(name: object) -> str | None:
    """Why `name` is not allowed, or None if it is."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        return f"{name!r} is not a valid name: {NAME_RULE}."
    if name in RESERVED_NAMES:
        return f"{name!r} is reserved by the portal; choose another name."
    return None


def validate_name(name: object) -> None:
    error = name_error(name)
    if error:
        raise ValidationError(error, code="invalid_name")
