"""The Slurm backend: the job's batch script (`script.render_script`) submitted with sbatch, watched
with scontrol, stopped with scancel; the trainers' output in one file per node on the shared file
system.

fsdpctl runs where the cluster's client commands work and SHARED_VOLUME_PATH is mounted (a login or
head node: HyperPod and ParallelCluster mount FSx there too), so it reads the logs itself. What it
keeps here:

FSDPCTL_HOME/slurm/<job>.json    the job's current run: run id, Slurm job id, where its files are
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

from fsdpctl import files, jobpolicy, record_store
from fsdpctl.backends import KeptRecord, LogLine, Started, save_placement
from fsdpctl.backends.slurm import states
from fsdpctl.backends.slurm.door import Slurm
from fsdpctl.backends.slurm.script import Paths, paths, render_script
from fsdpctl.errors import BadInput, ExitCode, FsdpctlError
from fsdpctl.files import home, write_atomic
from fsdpctl.progress import across_runs, parse_events, progress, run_outcome, stage, stalled
from fsdpctl.reports import FINAL, Failure, Phase, Report, Waited
from fsdpctl.settings import Config
from fsdptrain import disruption, events


class SlurmBackend:
    name = "slurm"
    poll_s = 2.0

    def __init__(self, cfg: Config):
        self.cfg = cfg

    @cached_property
    def slurm(self) -> Slurm:
        return Slurm(self.cfg.request_timeout)

    # ---- run -------------------------------------------------------------------------------------------
    def run(
        self, *, run_id: str | None, replace: bool, dry_run: bool, server_dry_run: bool
    ) -> Started:
        cfg = self.cfg
        if server_dry_run:
            raise BadInput(
                "--dry-run=server needs a Kubernetes API server", hint="use --dry-run on Slurm"
            )
        run_id = files.run_id(run_id) if run_id is not None else jobpolicy.new_run_id(cfg.job_name)
        where = paths(cfg, run_id)
        if dry_run:
            lines = [f"sbatch --parsable {where.script}", *render_script(cfg, run_id).splitlines()]
            return Started(cfg.job_name, run_id, f"sbatch would submit {where.script}", lines)
        render_script(
            cfg, run_id
        )  # a setting Slurm cannot honour: refused before anything is written
        current = self._record_or_none(cfg.job_name)
        if current is not None and self._phase(current) not in FINAL:
            if not replace:
                raise FsdpctlError(
                    f"job {cfg.job_name} is running as Slurm job {current['slurm_job']}",
                    hint="`fsdpctl job stop` it, or run with --replace",
                    code=ExitCode.BAD_INPUT,
                )
            self.stop(cfg.job_name, wait=True, dry_run=False)
        rec = record_store.new(cfg, run_id)
        text = render_script(cfg, run_id, rec["id"])  # the trainer's start line names its record
        saved = record_store.save({**rec, "manifests": text})
        made = [p for p in (Path(where.root), *Path(where.root).parents) if not p.exists()]
        try:
            # sbatch --output's directory must exist
            Path(where.root).mkdir(parents=True, exist_ok=True)
            write_atomic(Path(where.script), text)
            job_id = self.slurm.submit(where.script, env=_submit_env(cfg))
        except (OSError, FsdpctlError) as e:
            record_store.discard(saved)
            _remove_made(made)
            if isinstance(e, OSError):
                raise FsdpctlError(
                    f"cannot write the batch script at {where.script}: {e.strerror}",
                    hint="run fsdpctl where SHARED_VOLUME_PATH is the cluster's shared file system",
                ) from e
            raise
        state = {"job": cfg.job_name, "run_id": run_id, "slurm_job": job_id, "root": where.root}
        state |= {"nodes": cfg.job_nodes, "max_restarts": cfg.max_restarts, "created": time.time()}
        write_atomic(_record_path(cfg.job_name), json.dumps(state, indent=1) + "\n")
        save_placement(cfg)
        return Started(cfg.job_name, run_id, f"Slurm job {job_id}; logs in {where.root}")

    # ---- what Slurm and the logs say -------------------------------------------------------------------
    def _record_or_none(self, name: str) -> dict[str, Any] | None:
        path = _record_path(files.job_name(name))
        try:
            data = files.read_json(path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise FsdpctlError(
                f"{path} {files.why(e)}", hint="remove it", code=ExitCode.BAD_INPUT
            ) from e
        if not _record_ok(data):
            raise FsdpctlError(
                f"{path} is not a record fsdpctl wrote", hint="remove it", code=ExitCode.BAD_INPUT
            )
        return dict(data)

    def _record(self, name: str) -> dict[str, Any]:
        rec = self._record_or_none(name)
        if rec is None:
            raise FsdpctlError(
                f"no Slurm job named {name!r} started from here",
                hint="`fsdpctl job list` shows the jobs; `fsdpctl job run` starts one",
                code=ExitCode.JOB_NOT_FOUND,
            )
        return rec

    def _phase(self, rec: dict[str, Any]) -> Phase:
        return self._phase_of(rec, self.slurm.job(rec["slurm_job"]))

    def _phase_of(self, rec: dict[str, Any], job: dict[str, str] | None) -> Phase:
        stopping = os.path.exists(Paths(rec["root"]).stop_file)
        if (
            job is None
        ):  # forgotten by slurmctld (MinJobAge after its end; no accounting): the log says
            return _phase_from_log(rec, stopping)
        return states.phase(job, stop_requested=stopping)

    def report(self, name: str, stall_after: float = float("inf")) -> Report:
        return self._report(self._record(name), stall_after)

    def _report(self, rec: dict[str, Any], stall_after: float) -> Report:
        found = self.slurm.job(rec["slurm_job"])
        phase = self._phase_of(rec, found)
        job = found or {}
        leader = Path(Paths(rec["root"]).node_log(0))
        recs = parse_events(_texts(leader))
        now = time.time()
        prog = progress(recs, now)
        restarts = int(job.get("Restarts", "0") or 0)
        reason = states.reason_words(job.get("Reason", "None")) if phase != Phase.SUCCEEDED else ""
        nodes = job.get("NodeList") or None
        r: Report = {
            **prog,
            "job": rec["job"],
            "backend": self.name,
            "phase": phase,
            "run_id": rec["run_id"],
            "nodes": rec["nodes"],
            "nodes_running": rec["nodes"] if job.get("JobState") == "RUNNING" else 0,
            "restarts": restarts,
            "age_s": now - rec["created"],
            "leader": "node-0" if leader.exists() else None,
            "leader_log": str(leader) if leader.exists() else None,
            "checkpoint_dir": jobpolicy.checkpoint_dir(self.cfg, rec["job"]),
            "reason": reason or None,
            "problems": [],
            "stalled": False,
            "labels": {
                "fsdpctl.io/job": rec["job"],
                "fsdpctl.io/run-id": rec["run_id"],
                "fsdpctl.io/backend": self.name,
            },
            "prestep": None,
            "network": None,
            "scheduler_job": {
                "id": rec["slurm_job"],
                "state": job.get("JobState"),
                "nodes": None if nodes in (None, "(null)") else nodes,
            },
        }
        if phase == Phase.FAILED:
            r["failure"] = _failure(job, Paths(rec["root"]).batch_log)
        if not prog["max_steps"]:
            waiting = phase in (Phase.PENDING, Phase.RESTARTING)
            r["stage"] = "waiting for nodes" if waiting else stage(recs, None, rec["nodes"])
        r["stalled"] = stalled(phase, prog, now - rec["created"], stall_after)
        if restarts:
            r["problems"].append(
                f"requeued {restarts} time(s) (of MAX_RESTARTS={rec['max_restarts']}) after a node failure: "
                "each run resumes from the last checkpoint"
            )
        return r

    def logs(
        self,
        name: str,
        *,
        follow: bool,
        all_: bool,
        node: int | None,
        pod: str | None,
        tail: int | None = None,
        since_s: float | None = None,
    ) -> Iterator[LogLine]:
        if pod is not None:
            raise BadInput("--pod names a pod on Kubernetes", hint="on Slurm, use --node N")
        if since_s is not None:  # srun's output files hold the lines alone
            raise BadInput(
                "--since needs each line's time: Slurm's node logs have none", hint="use --tail N"
            )
        rec = self._record(name)
        p = Paths(rec["root"])
        chosen = range(rec["nodes"]) if all_ else [node or 0]
        offsets = {n: 0 for n in chosen}
        first = True
        while True:
            active = follow and self._phase(rec) not in FINAL
            for n in chosen:
                lines, offsets[n] = _read_from(Path(p.node_log(n)), offsets[n])
                if first and tail is not None:
                    lines = lines[-tail:] if tail else []
                yield from (LogLine({"node": f"node-{n}"}, text) for text in lines)
            first = False
            if not active:
                return
            time.sleep(1.0)

    def tail(self, name: str, lines: int) -> list[str]:
        rec = self._record(name)
        batch = _texts(Path(Paths(rec["root"]).batch_log))
        return (_texts(Path(Paths(rec["root"]).node_log(0))) or batch)[-lines:]

    def history(self, name: str) -> list[events.Event]:
        rec = self._record(name)
        return across_runs([parse_events(_texts(Path(Paths(rec["root"]).node_log(0))))])

    def outcomes(self, name: str) -> dict[str, str]:
        rec = self._record(name)
        return {rec["run_id"]: run_outcome(self.history(name), self._phase(rec))}

    def tensorboard_dir(self, name: str) -> str | None:
        self._record(name)
        return jobpolicy.tensorboard_dir(self.cfg, name)

    def tensorboard_elsewhere(self, name: str, argv: list[str]) -> list[str] | None:
        return None  # on the shared file system, mounted here: TensorBoard runs here

    def run_lines(self, job: str, run_id: str) -> list[str] | None:
        """The leader's log of that run, on the shared file system (None once it is gone)."""
        log = Path(paths(self.cfg.model_copy(update={"job_name": job}), run_id).node_log(0))
        return _texts(log) if log.is_file() else None

    def here(self, path: str) -> str | None:
        return path  # the cluster's shared file system is mounted here where the nodes mount it

    def kept_record(self, job: str) -> KeptRecord | None:
        return None  # Slurm keeps none: this machine's records are the job's (fsdpctl.record_store)

    def stop(
        self, name: str, *, wait: bool, dry_run: bool, say: Callable[[str], None] | None = None
    ) -> str:
        """The stop request on the shared file system, then SIGTERM to the job's steps (scancel
        --signal): the trainers finish their step, checkpoint and exit 0
        (fsdptrain.disruption.pod_exit), so the job COMPLETES, Stopped. A job with nothing running
        yet is cancelled."""
        rec = self._record(name)
        job = self.slurm.job(rec["slurm_job"])
        phase = self._phase_of(rec, job)
        if phase in FINAL:
            return f"job {name} is not running ({phase}); nothing to stop"
        sid = rec["slurm_job"]
        if dry_run:
            return f"dry run: would write {Paths(rec['root']).stop_file} and `scancel --signal=TERM {sid}`"
        stop_file = Path(Paths(rec["root"]).stop_file)
        write_atomic(stop_file, f'{disruption.STOP_ANNOTATION}="{time.time():.0f}"\n')
        if job is not None and job.get("JobState") == "RUNNING":
            self.slurm.signal(sid, "TERM")
        else:
            self.slurm.cancel(sid)
        if not wait:
            return f"job {name}: stopping (Slurm job {sid})"
        if say is not None:
            say(f"Slurm job {sid}: the trainers' stop checkpoint, then the job's end")
        return f"job {name}: {self.wait(name, None)}"

    def interrupt(self, name: str) -> Report | None:
        """Ctrl-C while following detaches: the job is slurmctld's, it keeps running."""
        return None

    def list_jobs(self) -> list[Report]:
        folder = home() / "slurm"
        names = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
        return [self._report(rec, float("inf")) for n in names if (rec := self._record_or_none(n))]

    def wait(self, name: str, timeout: float | None) -> Waited:
        rec = self._record(name)
        deadline = None if timeout is None else time.monotonic() + timeout
        while (phase := self._phase(rec)) not in FINAL:
            if deadline is not None and time.monotonic() > deadline:
                return phase
            time.sleep(self.poll_s)
        return phase

    def cleanup(self, *, checkpoints: bool, dry_run: bool) -> list[str]:
        """Each ended job's record here and its run's files on the shared file system (script,
        logs); with `checkpoints` its checkpoint directory too."""
        removed = []
        for job in self.list_jobs():
            if job["phase"] not in FINAL:
                continue
            rec = self._record(job["job"])
            targets = [Path(rec["root"]), _record_path(job["job"])]
            if checkpoints:
                targets.append(Path(jobpolicy.checkpoint_dir(self.cfg, job["job"])))
            for t in (t for t in targets if t.exists()):
                removed.append(str(t))
                if dry_run:
                    continue
                if t.is_dir():
                    shutil.rmtree(t)
                else:
                    t.unlink()
        return removed


def _remove_made(made: list[Path]) -> None:
    """What a failed submit made, deepest first: the run's directory (its script), then each parent
    it had to make while that is empty."""
    if made:
        shutil.rmtree(made[0], ignore_errors=True)
    for folder in made[1:]:
        try:
            folder.rmdir()
        except OSError:
            return


def _record_path(job: str) -> Path:
    return home() / "slurm" / f"{job}.json"


def _record_ok(data: Any) -> bool:
    kinds = {
        "job": str,
        "run_id": str,
        "slurm_job": int,
        "root": str,
        "nodes": int,
        "max_restarts": int,
    }
    if not isinstance(data, dict) or not all(isinstance(data.get(k), t) for k, t in kinds.items()):
        return False
    return isinstance(data.get("created"), int | float) and data["root"].startswith("/")


def _submit_env(cfg: Config) -> dict[str, str] | None:
    """sbatch passes the submitting environment to the job (--export=ALL): the token set as HF_TOKEN
    goes that way, never into the script."""
    token = cfg.hf_token.get_secret_value()
    return {**os.environ, "HF_TOKEN": token} if token else None


def _texts(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def _read_from(path: Path, offset: int) -> tuple[list[str], int]:
    """The whole lines after `offset` and the offset after them (a line still being written waits)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return data[:end].decode(errors="replace").splitlines(), offset + end


def _phase_from_log(rec: dict[str, Any], stopping: bool) -> Phase:
    recs = parse_events(_texts(Path(Paths(rec["root"]).node_log(0))))
    summary = next((e for e in reversed(recs) if isinstance(e, events.Summary)), None)
    if summary is None:
        return Phase.STOPPED if stopping else Phase.FAILED
    return Phase.STOPPED if summary.stopped or stopping else Phase.SUCCEEDED


def _failure(job: dict[str, str], log: str) -> Failure:
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
