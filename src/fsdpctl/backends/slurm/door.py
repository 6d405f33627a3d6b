"""The door to Slurm's client commands (sbatch, scontrol, scancel) through `fsdpctl.adapters.shell`:
each call bounded by REQUEST_TIMEOUT (a slurmctld that does not answer is named, never waited on
forever), each refusal one line with Slurm's own words. They find the cluster as a user's shell does
(SLURM_CONF, or /etc/slurm/slurm.conf; `scontrol ping` answers for it)."""

from __future__ import annotations

from dataclasses import dataclass

from fsdpctl.adapters import shell
from fsdpctl.backends.slurm import states
from fsdpctl.errors import FsdpctlError
from fsdpctl.job import owner, shape

HINT = "is slurmctld up? `scontrol ping` and `sinfo` say; SLURM_CONF names the cluster's slurm.conf"


class Forgotten(FsdpctlError):
    """slurmctld no longer knows the job: an answer (it ended long enough ago), not silence."""

    def __init__(self, command: str):
        super().__init__(f"`{command}`: Invalid job id specified")


@dataclass(frozen=True)
class Slurm:
    timeout: float  # REQUEST_TIMEOUT: per command

    def _capture(self, argv: list[str], env: dict[str, str] | None = None) -> shell.Captured:
        """The command's output; past REQUEST_TIMEOUT one line naming it (a client command retries
        an unreachable slurmctld for MessageTimeout and more: 18 s for sbatch here)."""
        try:
            return shell.capture(argv, timeout=self.timeout, env=env)
        except shell.ToolTimeout as e:
            raise FsdpctlError(str(e), hint=f"{HINT}; REQUEST_TIMEOUT sets the wait") from e

    def _call(self, *argv: str, env: dict[str, str] | None = None) -> shell.Captured:
        got = self._capture(list(argv), env)
        if got.rc != 0:
            said = (got.stderr or got.stdout).strip().splitlines()
            raise FsdpctlError(
                f"`{' '.join(argv[:2])}` failed: {said[-1] if said else f'exit {got.rc}'}",
                hint=HINT,
            )
        return got

    def submit(self, script: str, env: dict[str, str] | None = None) -> int:
        """sbatch --parsable prints `jobid[;cluster]` (sbatch(1) --parsable); the id is checked for
        a Slurm job id's shape before anything uses it (shape.slurm_id)."""
        out = self._call("sbatch", "--parsable", script, env=env).stdout.strip()
        return shape.slurm_id(out.split(";")[0], "sbatch --parsable")

    def job(self, job_id: int) -> dict[str, str]:
        """The job's `scontrol -o show job` record, checked (its JobId the one asked, a JobState, a
        count of Restarts). Forgotten once slurmctld has forgotten it (MinJobAge after its end:
        "Invalid job id specified"); FsdpctlError naming the command when it fails, answers nothing
        or answers something else: what Slurm did not say is never taken for an end."""
        command = f"scontrol -o show job {job_id}"
        got = self._capture(
            ["scontrol", "-o", "show", "job", str(shape.slurm_id(str(job_id), command))]
        )
        if got.rc != 0:
            if "Invalid job id" in got.stderr:
                raise Forgotten(command)
            said = got.stderr.strip().splitlines()
            raise FsdpctlError(
                f"`{command}` failed: {said[-1] if said else f'exit {got.rc}'}", hint=HINT
            )
        line = next((x for x in got.stdout.splitlines() if x.startswith("JobId=")), "")
        if not line:
            raise FsdpctlError(f"`{command}` answered no job record (exit 0)", hint=HINT)
        record = states.parse_record(line)
        if shape.slurm_id(record.get("JobId", ""), command, "JobId") != job_id:
            raise shape.Unshaped(command, "JobId", record["JobId"], f"{job_id}, the job asked for")
        if not record.get("JobState"):
            raise shape.Unshaped(command, "JobState", "", "a job state")
        shape.count(record.get("Restarts", "0"), command, "Restarts")
        return record

    def mine(self, token: str) -> list[int]:
        """The ids of this user's jobs whose comment carries the owner token `token` (squeue(1)
        --me: "Equivalent to --user=<my username>"; -o %i the job id, %k "Comment associated with
        the job"), shaped: a line of another shape is not an id to act on. Another user's job is
        never listed, whatever its comment says."""
        command = "squeue --me -h -o '%i %k'"
        got = self._call("squeue", "--me", "-h", "-o", "%i %k")
        found = []
        for line in got.stdout.splitlines():
            job_id, _, said = line.strip().partition(" ")
            if owner.of_comment(said).token == token:
                found.append(shape.slurm_id(job_id, command))
        return found

    def signal(self, job_id: int, sig: str = "TERM") -> None:
        """scancel --signal: the job's steps get it, not the batch shell (scancel(1) --batch,
        --full), so the trainers checkpoint and end, then the script does."""
        self._call("scancel", f"--signal={sig}", str(shape.slurm_id(str(job_id), "scancel")))

    def cancel(self, job_id: int) -> None:
        self._call("scancel", str(shape.slurm_id(str(job_id), "scancel")))
