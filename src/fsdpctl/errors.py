"""Exit codes and the errors that carry them (converted once, at the CLI boundary)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """fsdpctl's one table of exit codes (docs/reference/output.md "Exit codes";
    tests/test_exit_codes.py holds the two equal).

    1 and 2 follow click (UsageError.exit_code = 2, a usage error; anything else that failed, 1) and
    kubectl's DefaultErrorExitCode = 1 for a failure at runtime. Unlike kubectl (1 for an
    AlreadyExists too), everything refused before anything changed is 2: bad input, a job already
    running or already existing without --replace, a prompt answered "n" or not at all. 130 is 128 +
    SIGINT, what a shell reports for a command Ctrl-C stopped."""

    OK = 0  # done (or, with --dry-run, would be done)
    # failed at runtime: an outside system said no or is unreachable, a check failed, a defect
    FAILURE = 1
    BAD_INPUT = 2  # refused before anything changed: usage, settings, a conflict, a prompt declined
    # what `job wait` (and `job run`, `quickstart` that follow the job) tell of the job they waited
    # for
    JOB_FAILED = 3
    JOB_NOT_FOUND = 4  # also any command naming a job that does not exist
    JOB_TIMED_OUT = 5
    JOB_STOPPED = 6
    HUNG_UP = 129  # SIGHUP to a followed `job run` or `quickstart` (the terminal closed)
    INTERRUPTED = 130  # Ctrl-C (SIGINT)
    # stdout's reader went away (`fsdpctl job logs | head`): silent, 128 + SIGPIPE as Unix tools end
    BROKEN_PIPE = 141
    TERMINATED = 143  # SIGTERM to a followed `job run` or `quickstart` (CI's timeout, kill)


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
