"""What a local job may write to or delete on a shared place: only what its owner file proves is this
home's job (fsdpctl.job.owner).

A claim (`$FSDPCTL_HOME/volumes/<claim>`) stands for an FSx file system, which two homes (two
laptops, one FSx mounted at the same place) may share; their jobs may carry one name, so a path
derived from the name (`checkpoints/<job>`) is no proof. The job's checkpoint directory on a claim
gets an owner file (`.fsdpctl-owner.json`: home id, job, run id, token) when `job run` starts a run
in it, and:

- `job run` (with or without --replace) refuses a directory another home's or another job's owner
  file names: its run would resume and overwrite their checkpoints;
- `cleanup --checkpoints` removes only a directory whose owner file names this home and the job;
  one with none is kept with a line saying how to remove it by hand (or removed with --force);
- a directory with no owner file (made before fsdpctl wrote them, or seeded by hand) is adopted by
  the next `job run` of the job from this home: it is at the path this home derives for the job and
  the user asked to run the job on it, which is how its checkpoints resumed before; the owner file
  written then makes every later decision a proof.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import TYPE_CHECKING

from fsdpctl import files
from fsdpctl.backends.local import kubelet
from fsdpctl.backends.local import state as local_state
from fsdpctl.backends.local.pods import mapped_env
from fsdpctl.job import owner
from fsdpctl.job.owner import Mark, Owner
from fsdpctl.job.prestep import TRAINER_UID
from fsdptrain import volumes

if TYPE_CHECKING:
    from fsdpctl.job.render import Obj

this_home = owner.this_home


def checkpoint_dir(spec: Obj, job: str) -> Path | None:
    """The job's checkpoint directory on a claim as node 0 sees it (`volumes/<claim>/checkpoints/<job>`
    or `volumes/<claim>/<job>`): CHECKPOINT_DIR mapped, up past a CHECKPOINT_SUBDIR to the job's own
    directory, the one `cleanup --checkpoints` deletes. None without a claim (pod-local checkpoints
    live in the job's own directory of this home, shared with nobody)."""
    mapped = mapped_env(dict(spec), 0).get("CHECKPOINT_DIR")
    if not mapped:
        return None
    for candidate in (Path(mapped), *Path(mapped).parents):
        found = local_state.checkpoint_dir(
            {"job": job, "checkpoint_dir": str(candidate), "log_dir": ""}
        )
        if found is not None:
            rel = found.relative_to(files.home()).parts
            return found if rel[0] == "volumes" else None
    return None


def refusal(directory: Path | None, job: str) -> str | None:
    """Why `job run` of `job` must not write into `directory` (owner.dir_refusal)."""
    return owner.dir_refusal(directory, job)


def claim(directory: Path | None, mine: Owner) -> None:
    """The run's owner file in the job's checkpoint directory (made if missing, as the claim's root
    and parents the kubelet and volume-prep would make): written before the run starts, so nothing
    of the run is on the shared volume without it."""
    if directory is None or not files.reached_without_link(directory, files.home()):
        return  # a claim linked elsewhere: neither written through nor ever cleaned (cleanup keeps it)
    claim_root = files.home() / Path(*directory.relative_to(files.home()).parts[:2])
    kubelet.make_claim(claim_root)
    try:
        if os.geteuid() == 0:  # what the pre-step's volume-prep (run as root) makes: the trainer's
            volumes.prepare(directory, TRAINER_UID, TRAINER_UID, own=True)
        else:
            files.make_dirs(directory)
        owner.write_file(directory, mine)
    except OSError as e:
        if e.errno != errno.EROFS:
            raise
        # A claim mounted read-only holds nothing of the run and nobody's run can harm it through
        # this one: the job starts as on a cluster, where the pre-step's volume-prep meets EROFS
        # and fails the run with its reason (tests/test_lifecycle.py plays it).


def verdict(directory: Path, job: str, *, force: bool) -> tuple[bool, str, Mark]:
    """Whether `cleanup --checkpoints` may remove the job's `directory`, why not, and its owner."""
    found = owner.read_file(directory)
    mine = this_home()
    if found.home is None:
        if force:
            return True, "", found
        return (
            False,
            (
                f"it has no owner file ({owner.OWNER_FILE}: made before fsdpctl wrote them, or by hand), "
                f"so nothing proves it is this home's: remove it by hand (rm -r {directory}) or pass --force"
            ),
            found,
        )
    why = owner.why_not_ours(found, mine or "", job)
    if why is None:
        return True, "", found
    return False, f"{why}: fsdpctl leaves it to its owner (rm -r {directory} by hand)", found
