"""What Slurm says of a job, in fsdpctl's terms (pure): `scontrol -o show job` records parsed, job
states as phases, pending reasons in words. Sources: Slurm 22.05 (SchedMD/slurm, tag
slurm-22-05-8-1) doc/man/man1/squeue.1 "JOB STATE CODES" and "JOB REASON CODES",
src/common/slurm_protocol_defs.c (job_state_string, job_reason_string)."""

from __future__ import annotations

import re

from fsdpctl.job.reports import Phase

# JobState -> phase. A requeued job passes COMPLETING, then PENDING with Restarts>0 (`phase` says
# Restarting then); what ended is final.
PHASES: dict[str, Phase] = {
    "PENDING": Phase.PENDING,
    "CONFIGURING": Phase.PENDING,  # allocated, nodes booting (HyperPod, cloud nodes)
    "RUNNING": Phase.RUNNING,
    # some processes still active; the state that follows says how it ended
    "COMPLETING": Phase.RUNNING,
    "SIGNALING": Phase.RUNNING,
    "STAGE_OUT": Phase.RUNNING,
    "RESIZING": Phase.RUNNING,
    "SUSPENDED": Phase.SUSPENDED,
    "STOPPED": Phase.SUSPENDED,  # SIGSTOP, its CPUs kept
    "REQUEUED": Phase.RESTARTING,
    "REQUEUE_HOLD": Phase.RESTARTING,
    "REQUEUE_FED": Phase.RESTARTING,
    "SPECIAL_EXIT": Phase.RESTARTING,
    "COMPLETED": Phase.SUCCEEDED,
    "CANCELLED": Phase.STOPPED,
    "FAILED": Phase.FAILED,
    "NODE_FAIL": Phase.FAILED,
    "BOOT_FAIL": Phase.FAILED,
    "TIMEOUT": Phase.FAILED,
    "DEADLINE": Phase.FAILED,
    "OUT_OF_MEMORY": Phase.FAILED,
    "PREEMPTED": Phase.FAILED,
    "REVOKED": Phase.FAILED,
    "RESV_DEL_HOLD": Phase.PENDING,
}

# squeue(1) JOB REASON CODES, in words a user acts on
REASONS = {
    "Resources": "waiting for nodes: the partition has too few free nodes for the job",
    "Priority": "waiting behind higher-priority jobs in the partition",
    "ReqNodeNotAvail": "a node the job needs is not available (in use, reserved, DOWN, DRAINED or not "
    "responding)",
    "BeginTime": "waiting for its earliest start time (a requeued job waits out the credential lifetime)",
    "Cleaning": "being requeued: still cleaning up from its previous run",
    "Dependency": "waiting for a job it depends on",
    "DependencyNeverSatisfied": "depends on a job that will never satisfy it: cancel it",
    "JobHeldUser": "held by its user: `scontrol release <id>` lets it start",
    "JobHeldAdmin": "held by an administrator",
    "JobHoldMaxRequeue": "requeued more than slurmctld's MAX_BATCH_REQUEUE times, and held",
    "NodeDown": "a node the job needs is DOWN",
    "PartitionDown": "its partition is DOWN",
    "PartitionInactive": "its partition is inactive",
    "PartitionNodeLimit": "asks for more nodes than its partition allows now (or they are DOWN or DRAINED): "
    "lower JOB_NODES",
    "PartitionTimeLimit": "its time limit exceeds the partition's",
    "BadConstraints": "its constraints cannot be satisfied",
    "Reservation": "waiting for its reservation",
    "Licenses": "waiting for a license",
    "Prolog": "its PrologSlurmctld is still running",
    "JobLaunchFailure": "could not be launched (a file system problem, a missing program)",
    "NonZeroExitCode": "ended with a non-zero exit code",
    "TimeLimit": "reached its time limit",
    "SystemFailure": "a failure of Slurm, a file system or the network",
    "InactiveLimit": "reached the system's InactiveLimit",
    "InvalidAccount": "its account is invalid",
    "InvalidQOS": "its QOS is invalid",
    "WaitingForScheduling": "waiting for the scheduler to look at it",
    "None": "",
}
_LIMIT = re.compile(r"^(Assoc|QOS)(Grp|Max)?\w*(Limit|Threshold)$")


def parse_record(line: str) -> dict[str, str]:
    """One `scontrol -o show job` record: `Key=value` fields separated by spaces, where a value may
    itself hold spaces (a Reason's free text, a Command's arguments): a field starts at ` Key=`."""
    fields = re.split(r" (?=[A-Za-z][A-Za-z0-9_:/]*=)", line.strip())
    pairs = (f.split("=", 1) for f in fields if "=" in f)
    return {key: value.strip() for key, value in pairs}


def reason_words(reason: str) -> str:
    """A pending (or end) reason in words. scontrol writes free text with `_` for spaces; squeue's
    %r keeps them; a ReqNodeNotAvail names the nodes it waits for
    (`ReqNodeNotAvail,_UnavailableNodes:node1`)."""
    text = reason.replace("_", " ").strip()
    code, _, rest = text.partition(",")
    if code in REASONS:
        said = REASONS[code]
        nodes = rest.strip().removeprefix("UnavailableNodes:")
        return f"{code}: {said}" + (f" (unavailable: {nodes})" if nodes else "") if said else ""
    if _LIMIT.match(code):
        return f"{code}: an account or QOS limit holds it (sacctmgr show assoc / qos)"
    return text


def phase(job: dict[str, str], *, stop_requested: bool) -> Phase:
    """The job's phase from its record. A stop ends the trainer cleanly (exit 0), so a COMPLETED job
    that was asked to stop is Stopped; a PENDING job that ran before (Restarts>0) is Restarting. A
    state this table does not know (a later Slurm's) counts as Pending: not final, so `wait` keeps
    looking."""
    state = job.get("JobState", "").split("+")[0]
    found = PHASES.get(state, Phase.PENDING)
    if found == Phase.PENDING and int(job.get("Restarts", "0") or 0) > 0:
        return Phase.RESTARTING
    if stop_requested and found in (Phase.SUCCEEDED, Phase.FAILED):
        return Phase.STOPPED
    if stop_requested and found in (Phase.RUNNING, Phase.RESTARTING):
        return Phase.STOPPING
    return found


# what ended a job that fsdpctl did not stop (squeue(1) JOB STATE CODES: CANCELLED "Job was
# explicitly cancelled by the user or system administrator", PREEMPTED "terminated due to
# preemption"); `scancel JOB` sends SIGTERM then SIGKILL after KillWait (scancel(1))
OUTSIDE = {
    "CANCELLED": "cancelled outside fsdpctl (`scancel` by a user or an administrator, or a "
    "preemption that cancels): the trainers checkpointed on its SIGTERM if KillWait let them",
    "PREEMPTED": "preempted by a higher-priority job (the partition's PreemptMode): the trainers "
    "checkpointed on its SIGTERM if the grace time let them",
}


def outside_cancel(job: dict[str, str], *, stop_requested: bool) -> str | None:
    """Why the job ended when something outside fsdpctl ended it: CANCELLED or PREEMPTED without
    fsdpctl's stop request (`job stop` writes it first, then signals or cancels the job); None for
    a stop, or any other end."""
    state = job.get("JobState", "").split("+")[0]
    return None if stop_requested else OUTSIDE.get(state)


def exit_code(job: dict[str, str]) -> tuple[int, int] | None:
    """ExitCode=code:signal (doc/html/job_exit_code.shtml)."""
    m = re.fullmatch(r"(\d+):(\d+)", job.get("ExitCode", ""))
    return (int(m[1]), int(m[2])) if m else None
