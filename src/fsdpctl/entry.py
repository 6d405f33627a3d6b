"""The `fsdpctl` executable's first code: a Ctrl-C while the CLI is still being imported (a few
hundred milliseconds of typer, rich and pydantic) is one line and exit 130, as one a command catches
is. Python's default SIGINT handler would raise KeyboardInterrupt inside whichever import runs and
print its traceback. Imports nothing but the standard library until the handler is in place."""

from __future__ import annotations

import os
import signal

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it (fsdpctl.errors.ExitCode.INTERRUPTED)


def _interrupted(signum: int, frame: object) -> None:
    os.write(2, b"interrupted\n")
    os._exit(INTERRUPTED)


def main() -> None:
    signal.signal(signal.SIGINT, _interrupted)
    from fsdpctl.cli.streams import guard_std_descriptors

    guard_std_descriptors()  # before anything opens a file that could take a closed stdout's number
    from fsdpctl.cli import main as run

    run()  # it hands Ctrl-C to the commands once they are built


if __name__ == "__main__":
    main()
