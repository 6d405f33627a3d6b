"""Exit codes and the errors that carry them (converted once, at the CLI boundary)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILURE = 1
    BAD_INPUT = 2
    # `job wait` tells the outcome of the job it waited for
    JOB_FAILED = 3
    JOB_NOT_FOUND = 4
    JOB_TIMED_OUT = 5
    JOB_STOPPED = 6
    INTERRUPTED = 130


class FsdpctlError(Exception):
    """A failure with a one-line message and, where there is one, the command that fixes it."""

    code = ExitCode.FAILURE

    def __init__(self, message: str, hint: str | None = None, code: ExitCode | None = None):
        super().__init__(message)
        self.hint = hint
        if code is not None:
            self.code = code


class BadInput(FsdpctlError):
    code = ExitCode.BAD_INPUT


class SettingsError(Exception):
    """Bad settings: each line names a key, its value and the fix."""

    def __init__(self, lines: list[str], warnings: tuple[str, ...] = ()):
        super().__init__("\n".join(lines))
        self.lines, self.warnings = lines, warnings
