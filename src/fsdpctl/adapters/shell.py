"""Adapter: every outside command line (eksctl, terraform, docker) runs through `run`, which also implements
--dry-run (print the exact command, run nothing) and logs the output to a file while streaming it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINTS = {
    "eksctl": "install eksctl: https://eksctl.io/installation/ (a single binary; `eksctl version` to check)",
    "terraform": "install terraform >= 1.6: https://developer.hashicorp.com/terraform/install",
    "docker": "install Docker (Debian: apt-get install docker.io) and start the engine",
}


class ToolMissing(RuntimeError):
    def __init__(self, tool: str):
        super().__init__(f"{tool} is not installed or not on PATH")
        self.hint = INSTALL_HINTS.get(tool, f"install {tool}")


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]  # only what is added to the caller's environment
    cwd: Path | None = None

    def shell_line(self) -> str:
        import shlex

        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cd = f"cd {shlex.quote(str(self.cwd))} && " if self.cwd else ""
        return cd + (prefix + " " if prefix else "") + shlex.join(self.argv)


def run(
    cmd: Command,
    *,
    log_file: Path,
    on_line: Callable[[str], None] | None = None,
    stdin_text: str | None = None,
) -> int:
    """Run to completion, streaming each output line to `on_line` and appending it to `log_file`.
    `stdin_text` (a password for `docker login --password-stdin`) goes to the process only, never to the log."""
    exe = shutil.which(cmd.argv[0])
    if exe is None:
        raise ToolMissing(cmd.argv[0])
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a") as log:
        log.write(f"$ {cmd.shell_line()}\n")
        proc = subprocess.Popen(
            [exe, *cmd.argv[1:]],
            env={**os.environ, **cmd.env},
            cwd=cmd.cwd,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL if stdin_text is None else subprocess.PIPE,
        )
        if stdin_text is not None:
            proc.stdin.write(stdin_text)
            proc.stdin.close()
        for line in proc.stdout:
            log.write(line)
            if on_line:
                on_line(line.rstrip("\n"))
        return proc.wait()
