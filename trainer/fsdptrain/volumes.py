"""`python -m fsdptrain.volumes --owner UID:GID [--share ROOT]... DIR...`: the pre-step's first
container, run as root, which prepares the shared volume before anything of the job writes to it,
and does nothing else.

Why: a new FSx for Lustre file system's root directory is owned by root with mode 0755 (Lustre
creates it so: lustre-release lustre/mdd/mdd_device.c, mdd_prepare, `S_IFDIR | 0755`), and the
kubelet never hands a ReadWriteMany FSx claim to the pod's fsGroup: the FSx CSI driver declares
`fsGroupPolicy: ReadWriteOnceWithFSType` (aws-fsx-csi-driver deploy/kubernetes/base/csidriver.yaml),
under which "if a fstype is defined and the volume's access mode contains ReadWriteOnce, then the
defined fsGroup will be applied" (k8s.io/api storage/v1 FSGroupPolicy) and only then. A trainer or a
download running as uid 1000 got EACCES on /fsx/hf-cache.

So, idempotently and without recursion (a job's checkpoints may be terabytes):
- each `--share ROOT` (a volume's mount point) gets the group GID and mode 2775: the job's user can
  create its directories there, and new ones inherit the group (setgid), whoever makes them;
- each DIR is made if missing and given owner UID:GID and mode 2775.
The trainers run with umask 002, so what a root trainer (EFA pods run as root) writes there stays
writable by the group: a later non-root run can prune it, the cleanup pod can remove it.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

MODE = 0o2775  # rwxrwsr-x: the group writes, new entries inherit the group


def prepare(path: Path, uid: int, gid: int, *, own: bool) -> None:
    """Make `path` (parents too, each given the same treatment when made here) and set its group and
    mode; with `own`, also its owner."""
    missing = []
    at = path
    while not at.exists():
        missing.append(at)
        at = at.parent
    for p in reversed(missing):
        p.mkdir(exist_ok=True)
        _set(p, uid, gid, own=True)
    _set(path, uid, gid, own=own)


def _set(path: Path, uid: int, gid: int, *, own: bool) -> None:
    st = path.stat()
    want_uid = uid if own else st.st_uid
    if (st.st_uid, st.st_gid) != (want_uid, gid):
        os.chown(path, want_uid, gid)
    if stat.S_IMODE(path.stat().st_mode) != MODE:
        os.chmod(path, MODE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fsdptrain.volumes", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--owner", required=True, help="UID:GID the job's processes run as")
    parser.add_argument(
        "--share", action="append", default=[], help="a volume's root: group-writable"
    )
    parser.add_argument("dirs", nargs="*", type=Path, help="directories the job writes to")
    args = parser.parse_args(argv)
    uid, _, gid = args.owner.partition(":")
    try:
        for root in args.share:
            prepare(Path(root), int(uid), int(gid or uid), own=False)
        for d in args.dirs:
            prepare(d, int(uid), int(gid or uid), own=True)
    except OSError as e:
        print(
            f"fsdptrain.volumes: error: cannot prepare {e.filename} ({e.strerror}): the shared "
            "volume must be mounted read-write, and root in this container must be root on it "
            "(no root squash)",
            file=sys.stderr,
        )
        return 1
    ready = f"{len(args.share)} volume(s), {len(args.dirs)} directories"
    print(f"fsdptrain.volumes: {ready} ready for {args.owner}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
