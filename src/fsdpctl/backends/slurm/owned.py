"""What proves a Slurm job or a run directory is this home's, before fsdpctl signals, cancels,
records or removes it (fsdpctl.job.owner holds the identity; this is its Slurm side, pure but for
reading the shared file system).

A Slurm job is this run's when its `scontrol -o show job` record says so three ways: JobName is
the job's (sbatch --job-name), UserId is the user who submitted it (recorded in the state as
`slurm_user`), and Comment carries this home's owner identity for the run (sbatch --comment).
SchedMD/slurm at slurm-22-05-8-1, src/api/job_info.c slurm_sprint_job_info: `UserId=%s(%u)` (line
425) and, when the job has one, `Comment=%s` (line 929); src/squeue/opts.c: `--me` (line 119) and
the `%k` field, the comment (line 758). A job id alone proves nothing: slurmctld hands ids out again after it
loses its state (FirstJobId, StateSaveLocation), so a recorded id may name another user's job of
the same name.

A run directory on the shared file system is this home's when its owner file says so
(owner.write_file, written by submit): two FSDPCTL_HOMEs on one SHARED_VOLUME_PATH derive the
same directories for a job of one name, and only the owner file tells them apart.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from fsdpctl.job import owner

# the record's UserId: "name(uid)" (a name slurmctld cannot resolve is printed as the uid alone)
_USER = re.compile(r"(?:[^()\s]*\()?(\d{1,10})\)?")
# the comment a run submitted before the owner identity carried (fsdpctl-run:<run id>)
LEGACY_COMMENT = "fsdpctl-run:{run_id}"
# how long a run's files must have been quiet before a job slurmctld no longer knows ("Invalid job
# id") is taken as ended by cleanup: slurmctld forgets an ended job MinJobAge (default 300 s)
# after its end, and forgets a running one when it loses its state; a trainer writes its log at
# every step, and a checkpoint save (the longest quiet stretch of a live run) takes minutes.
QUIET_GRACE_S = 15 * 60


def user_of(record: dict[str, str]) -> int | None:
    """The uid in a record's UserId ("alice(1000)"); None when it has none of that shape."""
    m = _USER.fullmatch(record.get("UserId", "").strip())
    return int(m.group(1)) if m else None


def not_this_run(record: dict[str, str], st: dict[str, Any], home: str) -> str:
    """Why the Slurm job `record` is not the run the state `st` names, made from this `home` (its
    job, run id and user; this home, never the home a state says: a state copied from another
    home names that home's jobs); "" when it is. A state from before the owner identity (no
    `owner_home`) also accepts the comment it was submitted with, from this user."""
    job, run_id = st["job"], st["run_id"]
    name, comment = record.get("JobName"), record.get("Comment")
    want_uid = st.get("slurm_user", os.getuid())
    uid = user_of(record)
    if name != job:
        why = f"its name is {name!r}"
    elif uid != want_uid:
        why = f"it is user {record.get('UserId', '?')!r}'s, not uid {want_uid}'s"
    elif "owner_home" not in st and comment == LEGACY_COMMENT.format(run_id=run_id):
        return ""
    else:
        mine = owner.Owner(home, job, run_id)
        found = owner.of_comment(comment)
        why = owner.why_not_ours(found, mine.home, job, mine.token) or ""
        if not why:
            return ""
        why = f"its comment {comment!r}: {why}"
    return (
        f"Slurm job {st['slurm_job']} is not run {run_id} of job {job} ({why}): nothing is done "
        "to it"
    )


def run_dir_refusal(directory: Path, home: str, job: str) -> str:
    """Why the run directory is not this home's job's (its owner file); "" when it is."""
    why = owner.why_not_ours(owner.read_file(directory), home, job)
    return f"{directory} kept: {why}" if why else ""


def quiet_for(directory: Path, now: float | None = None) -> float:
    """Seconds since anything in the run's directory (its logs, the trainers' end files) was last
    written, reached without following a link; 0 when it cannot be read (not quiet: unknown)."""
    newest = 0.0
    try:
        for top, dirs, names in os.walk(directory, followlinks=False):
            for n in [*names, *dirs]:
                newest = max(newest, os.lstat(os.path.join(top, n)).st_mtime)
        newest = max(newest, os.lstat(directory).st_mtime)
    except OSError:
        return 0.0
    return max(0.0, (now or time.time()) - newest)
