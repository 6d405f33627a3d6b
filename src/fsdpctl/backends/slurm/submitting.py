"""How the Slurm backend submits a run exactly once: sbatch, whose answer is believed only when the
job it names carries the run's owner token and this user (owned.not_this_run); otherwise the job
is found by its token (squeue --me), and several found are all cancelled."""

from __future__ import annotations

import os

from fsdpctl.backends.slurm import owned
from fsdpctl.backends.slurm.door import Slurm
from fsdpctl.errors import FsdpctlError
from fsdpctl.job import shape
from fsdpctl.job.owner import Owner
from fsdpctl.settings import Config


def submit(slurm: Slurm, cfg: Config, script: str, mine: Owner) -> tuple[int, str]:
    """sbatch, its answer not believed on its own: the id it prints must name a job whose
    Comment carries this run's token and whose UserId is this user (scontrol). When it does
    not (another user's id, garbage, nothing), this user's job carrying the token is found with
    squeue --me and recorded, the line saying so; none found: the error, nothing submitted.
    sbatch failing or timing out raises: the core then finds the job by its token and cancels
    it (submit.cancel_found)."""
    try:
        job_id = slurm.submit(script, env=submit_env(cfg))
    except shape.Unshaped as e:
        return _found_instead(slurm, mine, str(e), e.hint)
    why = _not_mine(slurm, job_id, mine)
    if not why:
        return job_id, ""
    return _found_instead(slurm, mine, f"sbatch printed Slurm job {job_id}, {why}", None)


def _not_mine(slurm: Slurm, job_id: int, mine: Owner) -> str:
    """Why the job sbatch named is not this submit's; "" when its record proves it is."""
    try:
        record = slurm.job(job_id)
    except FsdpctlError as e:
        return f"whose record could not be read ({e})"
    st = {"job": mine.job, "run_id": mine.run_id, "slurm_job": job_id}
    st |= {"owner_home": mine.home, "slurm_user": os.getuid()}
    return owned.not_this_run(record, st, mine.home).removesuffix(": nothing is done to it")


def _found_instead(slurm: Slurm, mine: Owner, said: str, hint: str | None) -> tuple[int, str]:
    """The job this submit queued, found by its token when sbatch's answer did not name it."""
    found = slurm.mine(mine.token)
    if len(found) == 1:
        return found[0], f" (sbatch's answer was not it: {said}; found by the run's token)"
    for job_id in found:  # several carry one token: none is trusted to be the one
        slurm.cancel(job_id)
    did = (
        f"; the jobs carrying the run's token (Slurm job {', '.join(map(str, found))}) were "
        "cancelled"
        if found
        else "; no job of this user carries the run's token, so none was left submitted"
    )
    raise FsdpctlError(said + did, hint=hint)


# The job's file-creation mask: slurmstepd creates the batch output (and the batch shell, whose srun
# steps inherit it, runs) under the SLURM_UMASK the job carries, which sbatch takes from the
# submitting shell's umask unless it is already set (sbatch(1) OUTPUT ENVIRONMENT VARIABLES; Slurm's
# own test "propagation of umask to spawned tasks"): a submitter under umask 000 would otherwise
# leave the run's logs writable by everyone.
JOB_UMASK = "0022"


def submit_env(cfg: Config) -> dict[str, str]:
    """sbatch passes the submitting environment to the job (--export=ALL): the token set as HF_TOKEN
    goes that way, never into the script; the job's umask is fsdpctl's, not the submitter's."""
    token = cfg.hf_token.get_secret_value()
    return {**os.environ, "SLURM_UMASK": JOB_UMASK, **({"HF_TOKEN": token} if token else {})}
