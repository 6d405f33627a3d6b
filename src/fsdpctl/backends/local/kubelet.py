"""Adapter: the kubelet's part of running a pod on a simulated node of the local backend (issue 27),
so that a local job meets the volumes, users and signals a cluster's pods meet:

- a claim is a directory that starts as a new FSx for Lustre file system's root does: owned by root,
  mode 0755 (lustre-release lustre/mdd/mdd_device.c, mdd_prepare), and the kubelet gives it no
  fsGroup (the FSx CSIDriver's fsGroupPolicy ReadWriteOnceWithFSType); only the pre-step's root
  volume-prep makes it writable for the job's user;
- an emptyDir is made 0777 (kubelet pkg/volume/emptydir/empty_dir.go, `perm`), the node's /local
  scratch 1777 (the node's user data, render.SCRATCH_SCRIPT), a downward API volume holds the pod's
  annotations as `key="value"` lines (what `job stop` adds its request to);
- a container's processes run as its securityContext says (runAsUser, runAsGroup; the container's
  over the pod's), through util-linux's setpriv, when this machine lets us: as root, with setpriv,
  and every path the pod reads reachable for that user. Otherwise they run as this user, and `job
  status` says why.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fsdpctl import files

EMPTY_DIR_MODE = 0o777
SCRATCH_MODE = 0o1777
CLAIM_MODE = 0o755
RUN_AS_ENV = "FSDPCTL_LOCAL_RUN_AS"  # 0: every pod runs as this user, whatever its securityContext


def make_claim(path: Path) -> None:
    """A claim's directory as a new file system's root: root's, 0755 (as root; else this user's)."""
    if path.exists():
        return
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, CLAIM_MODE)
    if os.geteuid() == 0:
        os.chown(path, 0, 0)


def make_pod_dirs(dirs: Mapping[str, str], kinds: Mapping[str, str]) -> None:
    """The pod's own volumes on its node, before its containers start: emptyDirs and downward API
    volumes (fresh with every pod) and hostPaths (the node's, kept)."""
    for mount, directory in dirs.items():
        kind, path = kinds.get(mount), Path(directory)
        if kind in ("emptyDir", "downwardAPI"):
            _make(path, EMPTY_DIR_MODE if kind == "emptyDir" else 0o755)
        elif kind == "hostPath":
            _make(path, SCRATCH_MODE)


def _make(path: Path, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)


def write_annotations(directory: str, annotations: Mapping[str, str]) -> None:
    """The downward API file `annotations`: one `key="value"` line per annotation, sorted, the value
    quoted (kubernetes pkg/fieldpath/fieldpath.go, FormatMap, %q), replaced whole as the kubelet's
    atomic writer does."""
    lines = "".join(f"{key}={_quoted(value)}\n" for key, value in sorted(annotations.items()))
    path = Path(directory, "annotations")
    fd, tmp = files.temp_beside(path, 0o644)  # a random name: nothing planted is written through
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(lines)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def run_as(pod: Mapping[str, Any], container: Mapping[str, Any]) -> tuple[int, int] | None:
    """(uid, gid) the container runs as by its securityContext (its own over the pod's); None for
    root or an image default this machine cannot know."""
    pod_ctx, ctx = pod.get("securityContext") or {}, container.get("securityContext") or {}
    uid = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
    gid = ctx.get("runAsGroup", pod_ctx.get("runAsGroup", uid))
    if not isinstance(uid, int) or uid == 0:
        return None
    return uid, gid if isinstance(gid, int) else uid


def as_user(ids: tuple[int, int] | None, needs: Iterable[str]) -> tuple[list[str], str | None]:
    """(argv prefix that runs a command as `ids`, why not when it cannot): setpriv as root, when
    `ids` reaches every path in `needs` (the interpreter, the packages, the pod's volumes and data).
    """
    if ids is None:
        return [], None
    uid, gid = ids
    if os.environ.get(RUN_AS_ENV) == "0":
        return [], f"{RUN_AS_ENV}=0"
    if os.geteuid() != 0:
        return [], f"not root: pods run as uid {os.geteuid()}, not {uid}"
    if not shutil.which("setpriv"):
        return [], "no setpriv (util-linux) to switch users"
    for path in needs:
        blocked = unreachable(Path(path), uid, gid)
        if blocked is not None:
            return (
                [],
                f"uid {uid} cannot reach {path}: {blocked} is mode {stat.filemode(blocked.stat().st_mode)}",
            )
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"], None


def unreachable(path: Path, uid: int, gid: int) -> Path | None:
    """The first directory on the way to `path` (which must exist) that `uid`/`gid` may not search,
    by its mode bits as the kernel checks them (owner, else group, else others)."""
    if not path.exists():
        return None
    for at in [*reversed(path.resolve().parents), path.resolve()]:
        if not at.is_dir():
            continue
        st = at.stat()
        bit = (
            stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH
        )
        if not st.st_mode & bit:
            return at
    return None
