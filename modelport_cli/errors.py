"""Exit codes and the one error type that main() turns into `error: <reason>` on stderr."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Distinct codes, so that a CI job can tell a bad model from a broken portal without parsing text."""

    OK = 0
    ERROR = 1  # the API refused, the network failed, anything else
    USAGE = 2  # the command line or a file it names is wrong (argparse also exits 2)
    INVALID_MODEL = 3  # the portal rejected the pushed model
    DEPLOYMENT_FAILED = 4
    TIMEOUT = 5


class CliError(Exception):
    """A failure with its exit code. The message must fit on one line; `one_line()` makes sure of it."""

    def __init__(self, message: str, code: ExitCode = ExitCode.ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def one_line(text: str) -> str:
    """Collapse whitespace and newlines: CI logs show the error line as it is, and scripts read exactly one line."""
    return " ".join(str(text).split())
