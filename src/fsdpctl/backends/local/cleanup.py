"""`job cleanup` on the local backend: an ended job's files, under its lock, and its checkpoint
directory only when its owner file proves it this home's job's (README "What cleanup may delete")."""

from __future__ import annotations

import shutil
from pathlib import Path

from fsdpctl import files
from fsdpctl.backends.local import engine as local
from fsdpctl.backends.local import owned
from fsdpctl.backends.local import state as local_state
from fsdpctl.backends.local.state import LocalState
from fsdpctl.files import home
from fsdpctl.job import lock
from fsdpctl.job.owner import Mark


def clean_job(
    st: LocalState,
    *,
    checkpoints: bool,
    dry_run: bool,
    notes: list[str],
    kept: list[str],
    force: bool,
) -> list[str]:
    """One ended job's files, with its lock held (no `job run` of it starts meanwhile); none while
    its supervisor holds the lock or any process of the job lives. The lock file stays: a starter
    may hold it. What goes is derived, never read from the state (README "What cleanup may delete"):
    the entries of the job's own directory (a link among them is removed, never followed) and, with
    `checkpoints`, the checkpoint directory fsdpctl derives for the job (state.checkpoint_dir) when
    its owner file proves it this home's job's (owned.verdict)."""
    jdir = local.job_dir(st["job"])
    with lock.held(jdir, wait_s=0, create=not dry_run):
        if local.effective_phase(st) in local.ACTIVE or local.job_processes(st["job"]):
            return []
        left = local.leftovers(
            st
        )  # outside its directory: a network its supervisor did not tear down
        if not dry_run:
            local.end_leftovers(st)
        doomed = sorted(p for p in jdir.iterdir() if p.name != lock.NAME)
        doomed = [p for p in doomed if checkpoints or p.name != "checkpoints"]
        # the job's own directory is this home's by where it is (FSDPCTL_HOME/jobs/<job>)
        here = Mark(
            owned.this_home() or "(this home, no home-id yet)", st["job"], run_id=st["run_id"]
        )
        items = [f"{p} (owner: {here.describe()})" for p in doomed]
        if checkpoints:
            for path in _checkpoints_of(st, notes):
                ours, why, mark = owned.verdict(path, st["job"], force=force)
                if ours:
                    doomed.append(path)
                    items.append(f"{path} (owner: {mark.describe()})")
                else:
                    kept.append(f"{path}: {why} (owner: {mark.describe()})")
        for path in doomed if not dry_run else []:
            _remove(path)
        return [f"{x} (owner: {here.describe()})" for x in left] + items


def _checkpoints_of(st: LocalState, notes: list[str]) -> list[Path]:
    """The job's checkpoint directory, if the state names the one fsdpctl derives for it and it is
    reached without a link; anything else it names is kept, with a note."""
    recorded = st.get("checkpoint_dir")
    found = local_state.checkpoint_dir(st)
    if found is not None and files.reached_without_link(found, home()) and found.is_dir():
        return [found]
    if recorded and found is None:
        notes.append(
            f"{local.job_dir(st['job']) / 'state.json'} names checkpoint directory {recorded!r}, not the one "
            f"fsdpctl makes for job {st['job']} in FSDPCTL_HOME: kept"
        )
    elif found is not None and found.exists() and not files.reached_without_link(found, home()):
        notes.append(f"{found} is reached through a symbolic link fsdpctl did not make: kept")
    return []


def _remove(path: Path) -> None:
    """A file, a link (itself, never what it points to) or a directory tree (rmtree never follows a
    link inside it); gone already is fine."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)
