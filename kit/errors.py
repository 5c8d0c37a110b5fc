"""The one error type the CLI turns into a message and an exit code.

Anything else is a bug and keeps its traceback (the pipx rule).
"""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # the operation ran and failed (stack unhealthy, probe failed)
    BAD_INPUT = 2  # spec, CLI argument, model directory or credential is wrong; nothing written


class KitError(Exception):
    """A failure with a message for the operator: what is wrong and how to fix it."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, *, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return self.message if not self.fix else f"{self.message}\n  fix: {self.fix}"


class BadInput(KitError):
    """Bad spec, argument, model directory or credentials: exit 2, nothing written."""

    exit_code = ExitCode.BAD_INPUT
