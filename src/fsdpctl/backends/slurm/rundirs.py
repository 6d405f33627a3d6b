"""The Slurm backend's files on the shared file system: each run's directory (its script and logs,
`script.paths`) and the job's checkpoint directory, made by submit and removed by cleanup only
when their owner file names this home (owned.run_dir_refusal)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fsdpctl import files
from fsdpctl.backends.slurm import owned
from fsdpctl.backends.slurm.logs import Seen
from fsdpctl.backends.slurm.state import SlurmState
from fsdpctl.job import owner
from fsdpctl.job.owner import Owner
from fsdpctl.job.reports import FINAL, Phase

RUN_DIR_MODE = (
    0o700  # the run's script and logs: the submitting user's, as its jobs run as that user
)


def own_checkpoints(root: Path, mine: Owner) -> None:
    """The job's checkpoint directory, made when missing, with an owner file when it has none (the
    first home that trains the job there owns it; another home's is left as it is)."""
    files.make_dirs(root)
    if owner.read_file(root).home is None and not os.path.lexists(root / owner.OWNER_FILE):
        owner.write_file(root, mine)


def remove(path: Path) -> None:
    """A file or a link (itself, never what it points to) or a directory tree (rmtree follows no
    link inside it)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def remove_made(made: list[Path]) -> None:
    """What a failed submit made, deepest first: the run's directory (its script), then each parent
    it had to make while that is empty."""
    if made:
        shutil.rmtree(made[0], ignore_errors=True)
    for folder in made[1:]:
        try:
            folder.rmdir()
        except OSError:
            return


def remove_made_empty(made: list[Path], mark: str) -> None:
    """The checkpoint directory a failed submit made, deepest first, while it holds nothing but the
    owner file (`mark`) this submit wrote: a run of the job from elsewhere that wrote into it since
    keeps it and what it holds."""
    for folder in made:
        try:
            if [p.name for p in folder.iterdir()] in ([], [mark]):
                (folder / mark).unlink(missing_ok=True)
            folder.rmdir()
        except OSError:
            return


def remove_if_empty(folder: Path) -> None:
    """The job's directory on the shared file system once its last run directory went (another
    home's runs, or anything else in it, keep it)."""
    try:
        folder.rmdir()
    except OSError:
        pass


def run_dirs(job_root: Path) -> list[str]:
    """The run ids with a directory under the job's own directory on the shared file system
    (directories of a run id's shape, reached without a link)."""
    try:
        entries = sorted(job_root.iterdir())
    except OSError:
        return []
    return [
        e.name
        for e in entries
        if files.RUN_ID.fullmatch(e.name) and not e.is_symlink() and e.is_dir()
    ]


def kept_why(st: SlurmState, seen: Seen, root: Path, force: bool) -> str:
    """Why the job's files stay: "running"; its end unknown (no answer, or the id names
    another's job); or slurmctld no longer knows it ("Invalid job id") while its run's files
    (at `root`) were written within owned.QUIET_GRACE_S, which is not proof it ended (a controller
    that lost its state forgets running jobs too). `force` keeps only a running job; "" to clean."""
    if seen.phase not in FINAL and seen.phase != Phase.UNKNOWN:
        return "running"
    if force:
        return ""
    again = "`fsdpctl cleanup --force` removes its files all the same"
    if seen.phase == Phase.UNKNOWN:
        return f"whether it still runs is unknown ({seen.unknown}); {again}"
    if seen.forgotten and (quiet := owned.quiet_for(root)) < owned.QUIET_GRACE_S:
        return (
            f"slurmctld no longer knows Slurm job {st['slurm_job']} (Invalid job id) and its "
            f"run's files at {root} were written {quiet:.0f} s ago (under the "
            f"{owned.QUIET_GRACE_S // 60} min grace): it may still run; {again}"
        )
    return ""


def owned_dirs(
    job_root: Path, me: str, name: str, ckpt: Path | None, notes: list[str]
) -> list[tuple[Path, str]]:
    """The run directories under the job's directory (and the checkpoint directory `ckpt` when
    given and there) whose owner file names this home and job, each with its owner in words; the
    others are `notes`, kept."""
    dirs = [job_root / run for run in run_dirs(job_root)]
    if ckpt is not None and os.path.lexists(ckpt):
        dirs.append(ckpt)
    mine = []
    for d in dirs:
        if why := owned.run_dir_refusal(d, me, name):
            notes.append(why + f" (remove it by hand if it is yours: rm -r {d})")
        else:
            mine.append((d, f"owner: {owner.read_file(d).describe()}"))
    return mine
