"""A fingerprint of the files a run reads (its dataset, its tokenizer): which files, their sizes,
and a hash of each one's first HEAD_BYTES. Cheap on a data set of any size (it reads the head of at
most HASHED files) and independent of where the files are mounted (names are relative to the root
given), so the data a pod reads at /fsx/data and the same files under FSDPCTL_HOME/volumes on this
machine have one digest.

Standard library only: the trainer computes it at start (the `start` event) and fsdpctl again before
`job rerun`, and the two must agree byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HEAD_BYTES = (
    1 << 20
)  # the first MiB of each file: a changed header, a re-tokenised shard, a truncation
HASHED = 256  # files whose heads are hashed; later ones count by name and size only
LISTED = 20  # files named in the fingerprint itself (the digest covers all of them)


def _files(root: Path) -> list[Path]:
    """Every regular file under a directory in name order; dot-directories (.cache, .git) are not
    data."""
    found = (f for f in root.rglob("*") if f.is_file())
    return sorted(
        f for f in found if not any(part.startswith(".") for part in f.relative_to(root).parts)
    )


def _head_sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read(HEAD_BYTES)).hexdigest()


def fingerprint(source: str, path: str | None = None) -> dict[str, Any]:
    """The fingerprint of `path` (default: `source`, the setting's value, e.g. a hub id resolved to
    its cached snapshot). A source with no files on this machine (a hub id read as a stream) is
    named only: `local` False, no digest."""
    where = Path(path or source).expanduser()
    if not where.exists():
        return {"source": source, "local": False}
    files = _files(where) if where.is_dir() else [where]
    entries = []
    for i, f in enumerate(files):
        name = str(f.relative_to(where)) if where.is_dir() else f.name
        entries.append(
            {
                "name": name,
                "size": f.stat().st_size,
                "head_sha256": _head_sha256(f) if i < HASHED else None,
            }
        )
    canonical = json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()
    return {
        "source": source,
        "local": True,
        "files": len(entries),
        "bytes": sum(e["size"] for e in entries),
        "digest": hashlib.sha256(canonical).hexdigest(),
        "listed": entries[:LISTED],
    }


def well_formed(fp: Any) -> bool:
    """Whether `fp` has the shape `fingerprint` returns (what a reader of a log or a record may rely
    on)."""
    if (
        not isinstance(fp, dict)
        or not isinstance(fp.get("source"), str)
        or not isinstance(fp.get("local"), bool)
    ):
        return False
    if not fp["local"]:
        return True
    counts = all(
        isinstance(fp.get(k), int) and not isinstance(fp.get(k), bool) for k in ("files", "bytes")
    )
    listed = fp.get("listed", [])
    entries = isinstance(listed, list) and all(
        isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("size"), int)
        for e in listed
    )
    return counts and isinstance(fp.get("digest"), str) and entries


def difference(recorded: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> str | None:
    """How two fingerprints of one input differ, in words; None when they agree (or either is
    unknown)."""
    if not recorded or not now or not recorded.get("local") or not now.get("local"):
        return None
    if recorded["digest"] == now["digest"]:
        return None
    old = {e["name"]: e for e in recorded.get("listed", [])}
    new = {e["name"]: e for e in now.get("listed", [])}
    changed = sorted(n for n in old.keys() & new.keys() if old[n] != new[n])
    gone, added = sorted(old.keys() - new.keys()), sorted(new.keys() - old.keys())
    parts = [
        f"{recorded['files']} files/{recorded['bytes']} bytes then, "
        f"{now['files']}/{now['bytes']} now"
    ]
    parts += [
        f"{what}: {', '.join(names[:3])}"
        for what, names in (("changed", changed), ("gone", gone), ("new", added))
        if names
    ]
    return "; ".join(parts)
