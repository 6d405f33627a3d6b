"""Adapter: the Docker engine, through the `docker` command line (DOCKER_HOST and DOCKER_CONFIG as the user
has them). Commands are built as `shell.Command`s so that --dry-run prints exactly what would run."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from fsdpctl.adapters.shell import Command, ToolMissing

DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")


class EngineDown(RuntimeError):
    pass


def build_command(tag: str, context: Path, build_args: dict[str, str], network: str = "") -> Command:
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
        r = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError as e:
        raise ToolMissing("docker") from e
    except subprocess.TimeoutExpired as e:
        raise EngineDown("the Docker engine did not answer within 30 s") from e
    if r.returncode != 0 or not r.stdout.strip():
        reason = (r.stderr.strip().splitlines() or ["no answer"])[-1]
        raise EngineDown(f"the Docker engine is not reachable: {reason}")
    return r.stdout.strip()


def pushed_digest(line: str) -> str:
    """The manifest digest from `docker push`'s last line ('TAG: digest: sha256:... size: N'), or ''."""
    m = DIGEST.search(line)
    return m.group(1) if m else ""


def image_exists(ref: str) -> bool:
    return (
        subprocess.run(["docker", "image", "inspect", ref], capture_output=True, timeout=60).returncode == 0
    )
