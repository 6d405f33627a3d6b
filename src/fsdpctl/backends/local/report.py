"""A local job's status report (fsdpctl.job.reports.Report) from its state file and its logs:
progress from the leader's lines, the restarts, the pre-step, and why it failed in the failing
rank's own words."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TypedDict

from fsdpctl import files
from fsdpctl.backends.local import engine as local
from fsdpctl.backends.local.state import LocalState
from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.files import home
from fsdpctl.job import crilog, failures, kstatus, prestep, world
from fsdpctl.job.progress import (
    RENDEZVOUS_JOIN,
    parse_events,
    progress,
    stage,
    stalled,
)
from fsdpctl.job.reports import Failure, Phase, PrestepReport, Progress, Report
from fsdptrain import events, fetch


def run_events(log_dir: Path) -> list[events.Event]:
    """A run's trainer events: only the leader (global rank 0) prints them, so every node's log
    together holds just its (the relay's CRI lines, as text)."""
    return parse_events(
        line for f in sorted(log_dir.glob("node-*.log")) for line in crilog.texts(f)
    )


def job_report(st: LocalState, stall_after: float) -> Report:
    """Everything `status` shows, from the state file and the leader's log."""
    leader = local.leader_log(st)
    lines = crilog.texts(leader) if leader else []
    now = time.time()
    prog = progress(parse_events(lines), now)
    phase = local.phase_of(st)
    alive = local.launchers_alive(st)
    worlds = world.changes([x for f in local.log_files(st) for x in crilog.texts(f)])
    report: Report = {
        "job": st["job"],
        "backend": "local",
        "phase": phase,
        "run_id": st["run_id"],
        "nodes": st["replicas"],
        "nodes_running": alive,
        # a node back is a new round, not a failure: restarts as users count them
        "restarts": max(0, _restarts(st) - world.grew(worlds)),
        "world_changes": [world.text(c) for c in worlds],
        "age_s": now - st["created"],
        "leader": leader.stem if leader else None,
        "leader_log": str(leader) if leader else None,
        "checkpoint_dir": _checkpoint_shown(st),
        "network": local.network_note(st),
        "identity": st.get("identity"),
        "prestep": _prestep(st, phase),
        "stalled": False,
        **prog,
        "reason": local.orphan_note(st) if phase == Phase.ORPHANED else st.get("reason"),
        "failure": _failure(st) if phase == Phase.FAILED else None,
        "problems": [],
        "labels": {
            "fsdpctl.io/job": st["job"],
            "fsdpctl.io/run-id": st["run_id"],
            **st.get("labels", {}),
            "fsdpctl.io/backend": "local",
        },
    }
    if not prog["max_steps"]:  # before the first step: how far the start got
        joined = sum(
            any(RENDEZVOUS_JOIN in x for x in crilog.texts(f)) for f in local.log_files(st)
        )
        report["stage"] = stage(parse_events(lines), joined, st["replicas"])
    report["stalled"] = _stalled(report, st, prog, now, stall_after)
    _add_problems(report, st, phase)
    return report


def _stalled(
    report: Report, st: LocalState, prog: Progress, now: float, stall_after: float
) -> bool:
    """No step for stall_after s while running; never while the trainers wait for the pre-step."""
    idle = now - st.get("started", st["created"])
    if (
        report["prestep"]
        and report["prestep"]["phase"] in ("Pending", "Running")
        and not report["step"]
    ):
        return False  # no step yet because the trainers wait for the pre-step, not a hang
    return stalled(report["phase"] or "", prog, idle, stall_after)


def _add_problems(report: Report, st: LocalState, phase: Phase) -> None:
    """What the report's reader should act on: a hung collective's flight-recorder dumps, restarts
    (the restart policy), and the restart budget spent (in front of the reason)."""
    if report["stalled"]:  # a hung collective: what the flight recorder wrote, on this machine
        where = (st.get("nccl_traces") or ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"])[0]
        dumps = [str(d) for d in local.nccl_dumps(st)]
        report["problems"].append(kstatus.flight_recorder_note(where, dumps))
    if report["restarts"]:
        report["problems"].append(kstatus.on_failure("PyTorchJob", st.get("max_restarts", 0)))
    gave_up = bool(report["failure"] and report["failure"].get("exitcode") is not None)
    if spent := failures.budget_spent(
        phase, report["restarts"], st.get("max_restarts", 0), gave_up
    ):
        report["reason"] = f"{spent}; {report['reason']}" if report["reason"] else spent


def no_logs(name: str, logs: Path) -> FsdpctlError:
    """No log to show: the log directory is not there yet (exit 1), or something else is in its
    place (exit 2), named either way."""
    if os.path.lexists(logs) and (logs.is_symlink() or not logs.is_dir()):
        return FsdpctlError(
            f"{logs} is not the job's log directory (it is {files.kind_of(logs)})",
            hint=f"remove it; `fsdpctl job run` of {name} writes new logs",
            code=ExitCode.BAD_INPUT,
        )
    if not files.reached_without_link(logs, home()):
        return FsdpctlError(
            f"{logs} is reached through a symbolic link fsdpctl did not make",
            hint="remove the link",
            code=ExitCode.BAD_INPUT,
        )
    return FsdpctlError(
        f"job {name!r} has no such log yet in {logs}", hint="`fsdpctl job status` shows its nodes"
    )


def _checkpoint_shown(st: LocalState) -> str | None:
    """The checkpoint directory as it is in this home (a copied home's own), else as recorded."""
    found = local.in_home(st, st["checkpoint_dir"])
    return str(found) if found else st["checkpoint_dir"]


def _restarts(st: LocalState) -> int:
    """Restarts of the job, not of its nodes: rendezvous rounds after the first, over every node's
    log (kstatus.job_restarts); a node recreated that never reached a round still counts once."""
    logs = [crilog.texts(f) for f in local.log_files(st)]
    relaunched = max((lz.get("relaunches", 0) for lz in st.get("launchers", [])), default=0)
    return max(kstatus.job_restarts(logs), relaunched)


def _failed_node(st: LocalState) -> int | None:
    """The node whose launcher failed the job: the one the supervisor judged (its state's
    `failed_node`), else the first that exited with a code other than 0 (a launcher the supervisor
    stopped afterwards may have one too)."""
    if (node := st.get("failed_node")) is not None:
        return int(node)
    failed = [lz["node"] for lz in st.get("launchers", []) if lz.get("rc") not in (0, None)]
    return min(failed) if failed else None


def failed_log(st: LocalState) -> Path | None:
    if local.effective_phase(st) != Phase.FAILED or (node := _failed_node(st)) is None:
        return None
    return next((f for f in local.log_files(st) if f.stem == f"node-{node}"), None)


def _failure(st: LocalState) -> Failure | None:
    """Why the job failed, in the failing rank's words: on the node the supervisor judged,
    torchrun's root cause (the rank, its error file) and that rank's first error line wherever it is
    in the node's log."""
    log = failed_log(st)
    if log is None:
        return None
    found = failures.failure(crilog.texts(log), _read_error_file)
    return {**found, "node": _failed_node(st), "log": str(log)}


ERROR_FILE_MAX = 1024 * 1024  # torch's error file holds one exception and its traceback


def _read_error_file(path: str) -> str | None:
    """A worker's TORCHELASTIC_ERROR_FILE, where torchrun put it on this machine (its log_dir under
    the temporary directory); None once it is gone. Its path comes from a log: read only if it is a
    regular file of an error file's size (never a FIFO, a link, a device)."""
    try:
        return files.read_regular(Path(path), ERROR_FILE_MAX).decode("utf-8", "replace")
    except OSError:
        return None


def _prestep(st: LocalState, phase: str | None) -> PrestepReport | None:
    """The pre-step's progress from its log, its outcome from its marker (the file the trainers wait
    for)."""
    pre = st.get("prestep")
    if not pre:
        return None
    log = local.log_dir(st) / "prestep.log"
    lines = crilog.texts(log)
    verdict = _marker(local.in_home(st, pre["marker"]))
    if verdict is not None:
        return prestep.report(
            fetch.parse(lines), "Succeeded" if verdict["ok"] else "Failed", verdict["error"]
        )
    last = next((x for x in reversed(lines) if x.strip() and not x.startswith("{")), None)
    if phase in local.ACTIVE and pre.get("rc") in (None, 0):
        return prestep.report(fetch.parse(lines), "Running" if lines else "Pending")
    return prestep.report(
        fetch.parse(lines), "Failed", last or f"ended without a verdict: see {log}"
    )


class PrestepVerdict(TypedDict):
    """What the pre-step's marker says (fsdptrain.fetch.write_marker; the two fields read here)."""

    ok: bool
    error: str | None


def _marker(path: Path | None) -> PrestepVerdict | None:
    """The pre-step's verdict (fsdptrain.fetch.write_marker): None while there is none, or when what
    is there is not one (a marker outside this home, not a regular file, not its shape) - said once.
    """
    if path is None:
        return None
    try:
        found = files.read_json(path, limit=1024 * 1024)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        files.skipped(path, files.why(e))
        return None
    ok = isinstance(found, dict) and isinstance(found.get("ok"), bool)
    if not ok or not isinstance(found.get("error"), str | None):
        files.skipped(path, "is not the pre-step's marker")
        return None
    return {"ok": found["ok"], "error": found.get("error")}  # checked above
