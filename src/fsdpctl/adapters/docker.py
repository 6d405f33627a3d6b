"""Adapter: the Docker engine, through the `docker` command line (DOCKER_HOST and DOCKER_CONFIG as
the user has them) and the shell adapter. Commands are built as `shell.Command`s so that --dry-run
prints exactly what would run."""

from __future__ import annotations

import re
from pathlib import Path

from fsdpctl.adapters import shell
from fsdpctl.adapters.shell import Command
from fsdpctl.errors import FsdpctlError

DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")
ENGINE_TIMEOUT = 30.0


class EngineDown(FsdpctlError):
    def __init__(self, reason: str):
        super().__init__(
            reason, hint="start it (`sudo systemctl start docker`) or point DOCKER_HOST at one"
        )


def build_command(
    tag: str, context: Path, build_args: dict[str, str], network: str = ""
) -> Command:
    argv = ["docker", "build", "-f", str(context / "docker" / "Dockerfile"), "-t", tag]
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    if network:
        argv += ["--network", network]
    return Command(argv + [str(context)], {})


def login_command(registry: str, user: str) -> Command:
    """The password goes on stdin (`run(..., stdin_text=...)`): never in argv, `ps` or a log."""
    return Command(["docker", "login", "--username", user, "--password-stdin", registry], {})


def push_command(uri: str) -> Command:
    return Command(["docker", "push", uri], {})


def engine_version() -> str:
    """The engine's version; EngineDown with docker's own reason when no engine answers."""
    try:
        r = shell.capture(
            ["docker", "version", "--format", "{{.Server.Version}}"], timeout=ENGINE_TIMEOUT
        )
    except shell.ToolTimeout as e:
        raise EngineDown(f"the Docker engine did not answer within {ENGINE_TIMEOUT:.0f} s") from e
    if r.rc != 0 or not r.stdout.strip():
        reason = (r.stderr.strip().splitlines() or ["no answer"])[-1]
        raise EngineDown(f"the Docker engine is not reachable: {reason}")
    return r.stdout.strip()


def pushed_digest(line: str) -> str:
    """The manifest digest from `docker push`'s last line ('TAG: digest: sha256:... size: N'), or
    ''."""
    m = DIGEST.search(line)
    return m.group(1) if m else ""


def image_exists(ref: str) -> bool:
    return shell.capture(["docker", "image", "inspect", ref], timeout=60).rc == 0
