"""What the Slurm backend reads of a run: Slurm's word on its job (`Seen`), the trainers' logs on
the shared file system (one file per node, `script.paths`), and the job's report built of both."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from fsdpctl import files
from fsdpctl.backends.slurm import states
from fsdpctl.backends.slurm.script import Paths
from fsdpctl.backends.slurm.state import SlurmState
from fsdpctl.job import policy as jobpolicy
from fsdpctl.job import world
from fsdpctl.job.progress import parse_events, progress, stage, stalled
from fsdpctl.job.reports import FINAL, Failure, Phase, Report, SchedulerJob
from fsdpctl.settings import Config
from fsdptrain import events


@dataclass
class Seen:
    """What Slurm said of a job: its scontrol record (None: slurmctld no longer knows it), its
    phase, and why the phase is Unknown when Slurm gave no answer that says."""

    record: dict[str, str] | None
    phase: Phase
    unknown: str = ""
    outside: str = ""  # a forgotten job's leader ended on a SIGTERM fsdpctl did not send
    forgotten: bool = False  # slurmctld said "Invalid job id": the phase is the log's reading


LOG_MAX = 64 * 1024 * 1024


def texts(path: Path) -> list[str]:
    """A log's lines (a regular file only, its last LOG_MAX bytes; nothing when it is not there)."""
    try:
        data, _ = files.read_tail(path, LOG_MAX)
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()


def read_from(path: Path, offset: int) -> tuple[list[str], int]:
    """The whole lines after `offset` and the offset after them (a line still being written
    waits)."""
    try:
        with files.open_regular(path) as f:
            f.seek(offset)
            data = f.read(LOG_MAX)
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return data[:end].decode(errors="replace").splitlines(), offset + end


def run_texts(p: Paths) -> list[str]:
    """Every node's log of the run (node 0's first, then by node index) and the batch log last:
    rank 0 alone prints events, wherever it sat; srun's node failures are in the batch log."""

    def index(f: Path) -> int:
        n = f.stem.removeprefix("node-")
        return int(n) if n.isdigit() else 1 << 30

    nodes = sorted(Path(p.root).glob("node-*.log"), key=index)
    return [line for f in [*nodes, Path(p.batch_log)] for line in texts(f)]


def seen_in_log(p: Paths, stopping: bool) -> Seen:
    """A job slurmctld has forgotten ended; how, its leader's summary says (none: it failed). A
    leader that stopped on a SIGTERM (stop_reason "disrupted", fsdptrain.disruption) with no stop
    request from fsdpctl was ended from outside: a `scancel` or a preemption, named as such."""
    recs = parse_events(texts(Path(p.node_log(0))))
    summary = next((e for e in reversed(recs) if isinstance(e, events.Summary)), None)
    if summary is None:
        return Seen(None, Phase.STOPPED if stopping else Phase.FAILED)
    if not summary.stopped and not stopping:
        return Seen(None, Phase.SUCCEEDED)
    outside = summary.stop_reason == "disrupted" and not stopping
    return Seen(None, Phase.STOPPED, outside=states.OUTSIDE["CANCELLED"] if outside else "")


def reason(seen: Seen, stopping: bool) -> str:
    """Why the job is in its phase, in words: Slurm's reason, or an end nobody asked fsdpctl for
    (states.outside_cancel: CANCELLED or PREEMPTED without a stop request)."""
    job = seen.record or {}
    outside = seen.outside or states.outside_cancel(job, stop_requested=stopping)
    if outside:
        return f"{outside}; `fsdpctl job resume` continues from its last checkpoint"
    if seen.record is None and seen.phase in FINAL:
        return (
            "slurmctld no longer knows the job (MinJobAge after its end): its leader's log says how"
        )
    return states.reason_words(job.get("Reason", "None")) if seen.phase != Phase.SUCCEEDED else ""


def failure(job: dict[str, str], log: str) -> Failure:
    """Why the job failed as Slurm says it: its exit code and signal (ExitCode=code:signal), its
    reason."""
    code = states.exit_code(job)
    words = states.reason_words(job.get("Reason", ""))
    said = f"Slurm job state {job.get('JobState', 'unknown')}" + (f": {words}" if words else "")
    return {
        "rank": None,
        "exitcode": code[0] if code else None,
        "error_file": None,
        "error": said,
        "line": None,
        "raised": None,
        "node": None,
        "log": log,
    }


def report_of(cfg: Config, st: SlurmState, seen: Seen, p: Paths, stall_after: float) -> Report:
    """The job's report: Slurm's record of it (`seen`, not Unknown) and its leader's log at `p`."""
    job = seen.record or {}
    leader = Path(p.node_log(0))
    recs = parse_events(texts(leader))
    now = time.time()
    prog = progress(recs, now)
    restarts = int(job.get("Restarts", "0"))  # checked by the door: a count
    r: Report = {
        **prog,
        "job": st["job"],
        "backend": "slurm",
        "phase": seen.phase,
        "run_id": st["run_id"],
        "nodes": st["nodes"],
        "nodes_running": st["nodes"] if job.get("JobState") == "RUNNING" else 0,
        "restarts": restarts,
        "age_s": now - st["created"],
        "leader": "node-0" if leader.exists() else None,
        "leader_log": str(leader) if leader.exists() else None,
        "checkpoint_dir": jobpolicy.checkpoint_dir(cfg, st["job"]),
        "reason": reason(seen, os.path.exists(p.stop_file)) or None,
        "problems": [],
        "stalled": False,
        "labels": _labels(st),
        "prestep": None,
        "network": None,
        "scheduler_job": _scheduler_job(st, job),
        "world_changes": [world.text(c) for c in world.changes(run_texts(p))],
    }
    if seen.phase == Phase.FAILED:
        r["failure"] = failure(job, p.batch_log)
    if not prog["max_steps"]:
        waiting = seen.phase in (Phase.PENDING, Phase.RESTARTING)
        r["stage"] = "waiting for nodes" if waiting else stage(recs, None, st["nodes"])
    r["stalled"] = stalled(seen.phase, prog, now - st["created"], stall_after)
    if restarts:
        r["problems"].append(
            f"requeued {restarts} time(s) (of MAX_RESTARTS={st['max_restarts']}) after a node "
            "failure: each run resumes from the last checkpoint"
        )
    return r


def _labels(st: SlurmState) -> dict[str, str]:
    return {
        "fsdpctl.io/job": st["job"],
        "fsdpctl.io/run-id": st["run_id"],
        **st.get("labels", {}),
        "fsdpctl.io/backend": "slurm",
    }


def _scheduler_job(st: SlurmState, job: dict[str, str]) -> SchedulerJob:
    return {
        "id": st["slurm_job"],
        "state": job.get("JobState"),
        "nodes": None if job.get("NodeList") in (None, "(null)") else job["NodeList"],
    }
