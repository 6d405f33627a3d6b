"""fsdpctl's own files: where they live (FSDPCTL_HOME) and writing them so a reader never sees half of one."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """Jobs, clusters, caches: FSDPCTL_HOME, default ./.fsdpctl."""
    return Path(os.environ.get("FSDPCTL_HOME", ".fsdpctl")).resolve()


def write_atomic(path: Path, text: str) -> None:
    """A temp file beside the target, then os.replace; the parent is created, the temp file never left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
