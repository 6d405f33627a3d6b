"""The Slurm layout from before the job core: FSDPCTL_HOME/slurm/<job>.json, one file per job with
its current run (written by fsdpctl up to commit 23c4b24's parent):

    {"job": ..., "run_id": ..., "slurm_job": <id>, "root": "<SHARED_VOLUME_PATH>/fsdpctl/slurm/
     <job>/<run id>", "nodes": ..., "max_restarts": ..., "created": <epoch s>}

Read once and adopted into the core (jobs/<job>/state.json; the old file renamed `<job>.json.
adopted` beside it, so it is never read again and nothing is lost), so `job list` shows the job
and `job run` finds the run it would start a second copy beside. A file that cannot be adopted
(damaged, another job's, a core state already there, files under another SHARED_VOLUME_PATH) is
refused with one line saying how to move it by hand; nothing is written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fsdpctl import files
from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.job import home, shape
from fsdpctl.job import state as core

FOLDER = "slurm"
DONE = ".adopted"


def path_of(job: str) -> Path:
    return files.home() / FOLDER / f"{files.job_name(job)}.json"


def pending() -> list[str]:
    """The jobs with a pre-core file not yet adopted (names of a job's shape only)."""
    folder = files.home() / FOLDER
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return []
    stems = [n.removesuffix(".json") for n in names if n.endswith(".json")]
    return [s for s in stems if files.JOB_NAME.fullmatch(s)]


def adopt(job: str, shared_volume_path: str) -> bool:
    """The job's pre-core file made its core state; True when it adopted one. FsdpctlError (exit 2)
    naming the file and how to move it when it cannot. Without the job's lock: verbs call it with
    the lock held (stop) and without (list), and every step is atomic; two adopting at once write
    the same state, and a state already there for the same Slurm job is this adoption's."""
    old = path_of(job)
    if not os.path.lexists(old):
        return False
    data = _read(old, job)
    jdir = home.job_dir(job)
    now = core.read(jdir)
    same = now is not None and (now["run_id"], now.get("slurm_job")) == (
        data["run_id"],
        data["slurm_job"],
    )
    if now is not None and not same:
        raise _refused(old, f"and {jdir / core.NAME} both hold job {job}", job)
    if now is None:
        _same_volume(old, data, shared_volume_path)
        core.write(jdir, _core_state(data))
    try:
        os.replace(old, old.with_name(old.name + DONE))
    except FileNotFoundError:  # another fsdpctl adopted it meanwhile
        pass
    return True


def _read(old: Path, job: str) -> dict[str, Any]:
    try:
        data = files.read_json(old, 64 * 1024)
    except (OSError, ValueError) as e:
        raise _refused(old, files.why(e), job) from e
    ok = (
        isinstance(data, dict)
        and data.get("job") == job
        and isinstance(data.get("run_id"), str)
        and bool(files.RUN_ID.fullmatch(data["run_id"]))
        and shape.is_slurm_id(data.get("slurm_job"))
        and isinstance(data.get("root"), str)
        and all(isinstance(data.get(k), int) for k in ("nodes", "max_restarts"))
        and isinstance(data.get("created"), int | float)
    )
    if not ok:
        raise _refused(old, "is not a pre-core Slurm record of this job (bad or missing keys)", job)
    return data


def _same_volume(old: Path, data: dict[str, Any], shared_volume_path: str) -> None:
    """The core derives a run's files from SHARED_VOLUME_PATH: the old record's root must be where
    this command's settings put it."""
    want = f"{shared_volume_path.rstrip('/')}/fsdpctl/slurm/{data['job']}/{data['run_id']}"
    if data["root"] != want:
        tail = f"/fsdpctl/slurm/{data['job']}/{data['run_id']}"
        then = data["root"].removesuffix(tail) if data["root"].endswith(tail) else None
        raise FsdpctlError(
            f"{old}: job {data['job']}'s files are at {data['root']!r}, not under "
            f"SHARED_VOLUME_PATH={shared_volume_path!r}",
            hint=f"set SHARED_VOLUME_PATH={then} and run the command again"
            if then
            else f"check `squeue -j {data['slurm_job']}`, then move {old} aside",
            code=ExitCode.BAD_INPUT,
        )


def _core_state(data: dict[str, Any]) -> dict[str, Any]:
    """The core's state of the old record (no `owner_home`: its Slurm job carries the comment it
    was submitted with, `fsdpctl-run:<run id>`, which the ownership check accepts from this user)."""
    return {
        "job": data["job"],
        "backend": "slurm",
        "run_id": data["run_id"],
        "created": data["created"],
        "slurm_job": data["slurm_job"],
        "nodes": data["nodes"],
        "max_restarts": data["max_restarts"],
    }


def _refused(old: Path, why: str, job: str) -> FsdpctlError:
    return FsdpctlError(
        f"{old} (the layout before the job core) {why}: not adopted",
        hint=f"check `squeue --me -n {job}`: if its run still runs, move the file aside "
        f"(mv {old} {old}{DONE}) and stop that run with `scancel`; else remove it",
        code=ExitCode.BAD_INPUT,
    )
