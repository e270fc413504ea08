"""modelport: the command line client of a Modelport portal, for CI jobs (needs only `requests`)."""

from __future__ import annotations

__version__ = "0.1.0"
