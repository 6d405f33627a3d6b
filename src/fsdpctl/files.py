"""fsdpctl's own files: where they live (FSDPCTL_HOME) and writing them so a reader never sees half of one."""

from __future__ import annotations

import os
import re
from pathlib import Path

from fsdpctl.errors import BadInput
from fsdpctl.redact import redact

# A job name becomes a directory (and, on a cluster, a DNS label): a Kubernetes DNS-1123 label, so no '/',
# '..' or NUL walks out of FSDPCTL_HOME. A run id becomes a directory too (logs/<run-id>), and the rdzv id.
JOB_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
RUN_ID = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,126}[A-Za-z0-9])?")


def home() -> Path:
    """Jobs, clusters, caches: FSDPCTL_HOME, default ./.fsdpctl. Bad input when it (or the nearest part of it
    that exists) is not a directory: every path under it would fail later, half-written."""
    raw = os.environ.get("FSDPCTL_HOME", ".fsdpctl")
    path = Path(raw).resolve()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "" if existing == path else f": {existing} is a file"
        raise BadInput(
            f"FSDPCTL_HOME={raw!r} is not a directory{where}",
            hint="point FSDPCTL_HOME at a directory, or unset it (default ./.fsdpctl)",
        )
    return path


def job_name(value: str) -> str:
    """`value` if it is a job name; bad input otherwise, before any path is built from it."""
    if not JOB_NAME.fullmatch(value):
        raise BadInput(
            f"job name {value!r} is not a valid name",
            hint="use lowercase letters, digits and '-', at most 63 characters (a DNS label)",
        )
    return value


def run_id(value: str) -> str:
    """`value` if it is a run id (a directory name and the rendezvous id); bad input otherwise."""
    if not RUN_ID.fullmatch(value) or ".." in value:
        raise BadInput(
            f"--run-id {value!r} is not a valid run id",
            hint="use letters, digits, '-', '_' and '.', at most 128 characters, no '..'",
        )
    return value


def write_atomic(path: Path, text: str) -> None:
    """A temp file beside the target, then os.replace; the parent is created, the temp file never left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(redact(text))  # no secret is ever written, whatever key it was pasted into
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
