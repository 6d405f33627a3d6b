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


# The XDG Base Directory Specification (https://specifications.freedesktop.org/basedir-spec/latest/):
# "$XDG_STATE_HOME defines the base directory relative to which user-specific state files should be stored.
# If $XDG_STATE_HOME is either not set or empty, a default equal to $HOME/.local/state should be used", and
# "all paths set in these environment variables must be absolute. If an implementation encounters a relative
# path in any of these variables it should consider the path invalid and ignore it."
OLD_DEFAULT = Path(".fsdpctl")  # before: under the current directory, so a `cd` lost every job


def default_home() -> Path:
    """fsdpctl's directory under the user's state base: one place, whatever the current directory."""
    xdg = os.environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "fsdpctl"


def home() -> Path:
    """Jobs, clusters, caches: FSDPCTL_HOME, default $XDG_STATE_HOME/fsdpctl (~/.local/state/fsdpctl). Bad
    input when it (or the nearest part of it that exists) is not a directory: every path under it would fail
    later, half-written."""
    raw = os.environ.get("FSDPCTL_HOME") or str(default_home())
    try:
        path = Path(raw).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop: RuntimeError up to Python 3.12, then ELOOP
        raise BadInput(
            f"FSDPCTL_HOME={raw!r} cannot be resolved ({e})",
            hint="point FSDPCTL_HOME at a directory (a symlink that leads to one), or unset it",
        ) from e
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "" if existing == path else f": {existing} is a file"
        raise BadInput(
            f"FSDPCTL_HOME={raw!r} is not a directory{where}",
            hint="point FSDPCTL_HOME at a directory, or unset it (default $XDG_STATE_HOME/fsdpctl, "
            "else ~/.local/state/fsdpctl)",
        )
    return path


def _has_jobs(root: Path) -> bool:
    jobs = root / "jobs"
    return jobs.is_dir() and any(JOB_NAME.fullmatch(p.name) for p in jobs.iterdir())


def old_home_notice() -> str | None:
    """One line when ./.fsdpctl (the old default) holds jobs but the state directory in use holds none: the
    jobs are not moved (a move behind the user's back could split a running job from its supervisor), but
    the user is told where state lives now and how to keep the old place."""
    if os.environ.get("FSDPCTL_HOME"):
        return None
    try:
        if not _has_jobs(OLD_DEFAULT) or _has_jobs(default_home()):
            return None
    except OSError:  # an unreadable directory: no notice rather than a failure before the command
        return None
    return (
        f"state now lives in {default_home()} (no jobs there yet); ./.fsdpctl holds jobs from before: "
        "to keep using it, set FSDPCTL_HOME=./.fsdpctl"
    )


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
