"""Adapter: git, for the code version a run record names (the checkout fsdpctl and fsdptrain run
from)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TypedDict

from fsdpctl.adapters import shell

TIMEOUT_S = 10


def _git(root: Path, *args: str) -> str | None:
    try:
        r = shell.capture(["git", "-C", str(root), *args], timeout=TIMEOUT_S)
    except (shell.ToolMissing, shell.ToolTimeout):
        return None
    return r.stdout if r.rc == 0 else None


class CodeVersion(TypedDict):
    """fsdpctl.job.record.CodeVersion's shape (an adapter imports no domain module: the two are
    one type to mypy, key by key)."""

    fsdpctl: str
    fsdptrain: str
    commit: str | None
    dirty: bool | None
    diff_sha256: str | None


def code_version() -> CodeVersion:
    """fsdpctl's and fsdptrain's versions, and the commit of the checkout they run from with whether
    (and how) it differs from that commit: `git diff HEAD` over tracked files, hashed, so two dirty
    checkouts of one commit compare equal only with the same changes. No commit when not run from a
    git checkout (an installed wheel), or git is missing."""
    import fsdpctl
    import fsdptrain

    root = Path(fsdpctl.__file__).resolve().parent
    ours, theirs = fsdpctl.__version__, fsdptrain.__version__
    head = _git(root, "rev-parse", "HEAD")
    if head is None:
        return {
            "fsdpctl": ours,
            "fsdptrain": theirs,
            "commit": None,
            "dirty": None,
            "diff_sha256": None,
        }
    changes = _git(root, "diff", "HEAD", "--binary") or ""
    return {
        "fsdpctl": ours,
        "fsdptrain": theirs,
        "commit": head.strip(),
        "dirty": bool(changes),
        "diff_sha256": hashlib.sha256(changes.encode()).hexdigest() if changes else None,
    }
