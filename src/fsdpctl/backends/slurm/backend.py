"""The Slurm backend: the job's batch script (`script.render_script`) submitted with sbatch, watched
with scontrol, stopped with scancel; the trainers' output in one file per node on the shared file
system. It only translates: the job's state, lock and run record are the job core's (fsdpctl.job),
as every backend's.

fsdpctl runs where the cluster's client commands work and SHARED_VOLUME_PATH is mounted (a login or
head node: HyperPod and ParallelCluster mount FSx there too), so it reads the logs itself. What the
job's state records of it (FSDPCTL_HOME/jobs/<job>/state.json, besides the core's keys):

    slurm_job      the Slurm job id sbatch gave the current run (checked: 1 to 0xfffffffd), proven
                   this run's before it was recorded (its Comment carries the run's owner token,
                   its UserId is this user: `owned`)
    slurm_user     the uid that submitted it; owner_home the home id its comment carries
    nodes          its node count, max_restarts its requeue budget

Before any scancel or signal (stop, --replace, cleanup) the job's record must prove it is this run
(owned.not_this_run): after slurmctld reuses an id, another user's job of the same name is never
signalled.

Every path is derived from the settings, the job's name and the run id
(SHARED_VOLUME_PATH/fsdpctl/slurm/<job>/<run id>: `script.paths`), never read from a file.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from fsdpctl import files
from fsdpctl.backends import KeptRecord, LogLine, Started, Submitted
from fsdpctl.backends.slurm import legacy, owned, rundirs, states, submitting
from fsdpctl.backends.slurm.door import Forgotten, Slurm
from fsdpctl.backends.slurm.logs import Seen, read_from, report_of, run_texts, seen_in_log, texts
from fsdpctl.backends.slurm.script import Paths, paths, render_script
from fsdpctl.backends.slurm.state import SlurmState
from fsdpctl.errors import BadInput, ExitCode, FsdpctlError
from fsdpctl.job import home, listing, lock, owner
from fsdpctl.job import policy as jobpolicy
from fsdpctl.job import state as core
from fsdpctl.job import store as record_store
from fsdpctl.job.outage import Outage
from fsdpctl.job.owner import Owner
from fsdpctl.job.progress import across_runs, parse_events, run_outcome
from fsdpctl.job.protocol import refuse
from fsdpctl.job.record import RunRecord
from fsdpctl.job.reports import FINAL, Phase, Report, Waited
from fsdpctl.settings import Config
from fsdptrain import disruption, events, resume


class SlurmBackend:
    name = "slurm"
    poll_s = 2.0
    keeps_state = True  # every Slurm job submitted from here is in this home
    supervised = False

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.notes: list[str] = []  # what list_jobs and cleanup skipped

    @cached_property
    def slurm(self) -> Slurm:
        return Slurm(self.cfg.request_timeout)

    def _paths(self, job: str, run_id: str) -> Paths:
        """The run's files on the shared file system, derived from the settings, the job's name and
        the run id (never read from the state): where a stop is written and cleanup deletes."""
        return paths(self.cfg.model_copy(update={"job_name": job}), run_id)

    def _seen_paths(self, job: str, run_id: str) -> Paths:
        """Where the run's files are to be read: the derived place; when it has none and the run's
        record names another SHARED_VOLUME_PATH (the run was started with settings this command does
        not have), the place derived from that one. Only read there: never written or deleted."""
        here = self._paths(job, run_id)
        if os.path.isdir(here.root):
            return here
        try:
            rec = record_store.read(record_store.path(job, run_id))
        except (BadInput, OSError):
            return here
        then = rec["settings"].get("SHARED_VOLUME_PATH")
        if not then or then == self.cfg.shared_volume_path:
            return here
        cfg = self.cfg.model_copy(update={"job_name": job, "shared_volume_path": then})
        return paths(cfg, run_id)

    # ---- submit ----------------------------------------------------------------------------------
    def refusals(self) -> list[str]:
        """SHARED_VOLUME_PATH is the cluster's shared file system, mounted here as on the nodes: a
        directory that must exist (fsdpctl makes its own directories inside it, never the mount
        point itself: a path made here would be this machine's disk, which no node sees)."""
        where = self.cfg.shared_volume_path
        fix = (
            "run fsdpctl where the shared file system is mounted (a login or head node), or set "
            "SHARED_VOLUME_PATH to its mount point"
        )
        try:
            mode = os.stat(where).st_mode
        except OSError as e:
            return [
                f"SHARED_VOLUME_PATH={where!r} does not exist on this machine ({e.strerror}): the "
                f"job's script and logs go to the cluster's shared file system there; {fix}"
            ]
        if not stat.S_ISDIR(mode):
            return [f"SHARED_VOLUME_PATH={where!r} is not a directory; {fix}"]
        return [r] if (r := self._resume_refusal()) else []

    def _resume_refusal(self) -> str | None:
        """The checkpoint the run would resume, as the trainers' pre-launch check judges it
        (fsdptrain.resume.first_problem: at or past MAX_STEPS, saved with other settings), read on
        the shared file system mounted here, as the local backend refuses it before launch
        (local.resume_refusal): a run that would only fail on the nodes is never submitted."""
        root = Path(jobpolicy.checkpoint_dir(self.cfg, self.cfg.job_name))
        seen = root if root.is_dir() and not root.is_symlink() else None
        if why := owner.dir_refusal(seen, self.cfg.job_name):  # another home's or job's
            return why
        return resume.first_problem(seen, self.cfg.training, self.cfg.world_size)

    def dry_run(self, *, run_id: str, server: bool) -> Started:
        if server:
            raise BadInput(
                "--dry-run=server needs a Kubernetes API server", hint="use --dry-run on Slurm"
            )
        refuse(self.refusals())
        where = paths(self.cfg, run_id)
        text = render_script(self.cfg, run_id)
        lines = [f"sbatch --parsable {where.script}", *text.splitlines()]
        said = f"sbatch would submit {where.script}"
        return Started(self.cfg.job_name, run_id, said, lines, script=text)

    def prepare(self, record: RunRecord) -> RunRecord:
        """The batch script in the record (a setting Slurm cannot honour is refused here, before
        anything is written). A pre-core record of the job is adopted first: the runner then finds
        the run it would start a second copy beside."""
        refuse(self.refusals())
        legacy.adopt(self.cfg.job_name, self.cfg.shared_volume_path)
        return {**record, "manifests": render_script(self.cfg, record["run_id"], record["id"])}

    def submit(self, *, run_id: str, record: RunRecord, replace: bool) -> Submitted:
        """The run's directory under SHARED_VOLUME_PATH (mode 0700: sbatch --output's directory must
        exist) with its owner file, its script (0600), then sbatch, whose answer is proven
        (`submitting.submit`); what was made goes again when sbatch refuses. The checkpoint
        directory gets an owner file when it has none (cleanup --checkpoints removes only what
        names this home)."""
        if refusal := self._resume_refusal():  # after a --replace stop: its stop checkpoint
            raise FsdpctlError(refusal, code=ExitCode.BAD_INPUT)
        where = paths(self.cfg, run_id)
        root = Path(where.root)
        mine = owner.Owner(owner.home_id(), self.cfg.job_name, run_id)
        made = [p for p in (root, *root.parents) if not os.path.lexists(p)]
        ckpt = self._shared_checkpoints(mine.job)
        made_ckpt = [p for p in (ckpt, *ckpt.parents) if not os.path.lexists(p)] if ckpt else []
        try:
            files.make_dirs(root, rundirs.RUN_DIR_MODE)
            owner.write_file(root, mine)
            if ckpt:
                rundirs.own_checkpoints(ckpt, mine)
            files.write_atomic(Path(where.script), record["manifests"] or "")  # (prepare's)
            job_id, said = submitting.submit(self.slurm, self.cfg, where.script, mine)
        except (OSError, FsdpctlError) as e:
            rundirs.remove_made(made)
            rundirs.remove_made_empty(made_ckpt, owner.OWNER_FILE)
            if isinstance(e, OSError):
                raise FsdpctlError(
                    f"cannot write the batch script at {where.script}: {files.why(e)}",
                    hint="run fsdpctl where SHARED_VOLUME_PATH is the cluster's shared file system",
                ) from e
            raise
        return self._submitted(job_id, mine, record, said)

    def _submitted(self, job_id: int, mine: Owner, record: RunRecord, said: str = "") -> Submitted:
        return Submitted(
            state={
                "slurm_job": job_id,
                "nodes": self.cfg.job_nodes,
                "max_restarts": self.cfg.max_restarts,
                "slurm_user": os.getuid(),
                "owner_home": mine.home,
            },
            record=record,
            where=f"Slurm job {job_id}{said}; logs in {paths(self.cfg, mine.run_id).root}",
            outside=f"Slurm job {job_id}",
            cancel_command=f"scancel {job_id}",
        )

    def _shared_checkpoints(self, job: str) -> Path | None:
        """The job's checkpoint directory when it is on the shared file system (the one this
        machine sees as the nodes do); None when it is elsewhere (a node-local path)."""
        ckpt = jobpolicy.checkpoint_dir(self.cfg, job)
        shared = self.cfg.shared_volume_path.rstrip("/") + "/"
        return Path(ckpt) if ckpt.startswith(shared) else None

    def find_submitted(self, mine: Owner) -> Submitted | None:
        """This user's queued or running Slurm job whose comment carries the run's owner token
        (squeue --me, %k): another user's job is never found, whatever its comment says."""
        found = self.slurm.mine(mine.token)
        if not found:
            return None
        return self._submitted(found[0], mine, record_store.new(self.cfg, mine.run_id))

    def cancel(self, submitted: Submitted) -> None:
        self.slurm.cancel(submitted.state["slurm_job"])

    # ---- what Slurm and the logs say -------------------------------------------------------------
    def _state_or_none(self, name: str) -> SlurmState | None:
        legacy.adopt(name, self.cfg.shared_volume_path)  # a pre-core record: adopted, or refused
        st = core.read(home.job_dir(name))  # Damaged: one line naming the file, exit 2
        # core.read checked STATE's keys of a state whose backend is this one
        return cast(SlurmState, st) if st is not None and core.backend_of(st) == self.name else None

    def _states(self) -> list[SlurmState]:
        """Every Slurm job of this home (listing.states_of: checked with STATE's keys), pre-core
        records adopted first (one that cannot be is a note saying how to move it)."""
        for name in legacy.pending():
            try:
                legacy.adopt(name, self.cfg.shared_volume_path)
            except FsdpctlError as e:
                self.notes.append(f"{e}" + (f" ({e.hint})" if e.hint else ""))
        return [cast(SlurmState, st) for st in listing.states_of(self.name, self.notes)]

    def _state(self, name: str) -> SlurmState:
        st = self._state_or_none(name)
        if st is None:
            raise FsdpctlError(
                f"no Slurm job named {name!r} started from here",
                hint="`fsdpctl job list` shows the jobs; `fsdpctl job run` starts one",
                code=ExitCode.JOB_NOT_FOUND,
            )
        return st

    def _seen(self, st: SlurmState) -> Seen:
        """What Slurm says of the job now. An unreachable controller, an empty answer or one not of
        the shape a job record has is Unknown, with what was asked: never read as an end."""
        p = self._seen_paths(st["job"], st["run_id"])
        stopping = os.path.exists(p.stop_file)
        try:
            found = self.slurm.job(st["slurm_job"])
        except (
            Forgotten
        ):  # slurmctld forgot it (MinJobAge after its end; no accounting): the log says
            return dataclasses.replace(seen_in_log(p, stopping), forgotten=True)
        except FsdpctlError as e:
            return Seen(None, Phase.UNKNOWN, str(e))
        if stranger := _not_this_run(found, st):  # an id that names someone else's job now
            return Seen(None, Phase.UNKNOWN, stranger)
        return Seen(found, states.phase(found, stop_requested=stopping))

    def report(self, name: str, stall_after: float = float("inf")) -> Report:
        return self._report(self._state(name), stall_after)

    def _report(self, st: SlurmState, stall_after: float) -> Report:
        seen = self._seen(st)
        if seen.phase == Phase.UNKNOWN:
            return listing.unknown_report(st, st["nodes"], seen.unknown)
        return report_of(self.cfg, st, seen, self._seen_paths(st["job"], st["run_id"]), stall_after)

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
        keep: Callable[[LogLine], bool] | None = None,
    ) -> Iterator[LogLine]:
        if pod is not None:
            raise BadInput("--pod names a pod on Kubernetes", hint="on Slurm, use --node N")
        if since_s is not None:  # srun's output files hold the lines alone
            raise BadInput(
                "--since needs each line's time: Slurm's node logs have none", hint="use --tail N"
            )
        st = self._state(name)
        if node is not None and not 0 <= node < st["nodes"]:
            raise BadInput(
                f"--node {node}: job {name} has nodes 0 to {st['nodes'] - 1}",
                hint="`fsdpctl job status` shows its nodes",
            )
        return self._follow(st, range(st["nodes"]) if all_ else [node or 0], follow, tail, keep)

    def _follow(
        self,
        st: SlurmState,
        chosen: Any,
        follow: bool,
        tail: int | None,
        keep: Callable[[LogLine], bool] | None,
    ) -> Iterator[LogLine]:
        p = self._seen_paths(st["job"], st["run_id"])
        offsets = {n: 0 for n in chosen}
        first = True
        while True:
            active = follow and self._seen(st).phase not in FINAL
            for n in chosen:
                texts, offsets[n] = read_from(Path(p.node_log(n)), offsets[n])
                lines = [LogLine({"node": f"node-{n}"}, text) for text in texts]
                lines = [x for x in lines if keep is None or keep(x)]
                if first and tail is not None:
                    lines = lines[-tail:] if tail else []
                yield from lines
            first = False
            if not active:
                return
            time.sleep(1.0)

    def tail(self, name: str, lines: int) -> list[str]:
        st = self._state(name)
        p = self._seen_paths(st["job"], st["run_id"])
        return (texts(Path(p.node_log(0))) or texts(Path(p.batch_log)))[-lines:]

    def history(self, name: str) -> list[events.Event]:
        st = self._state(name)
        return across_runs(
            [parse_events(texts(Path(self._seen_paths(name, st["run_id"]).node_log(0))))]
        )

    def outcomes(self, name: str) -> dict[str, str]:
        """Every run of the job whose files are still on the shared file system (its directory
        under fsdpctl/slurm/<job>/, derived), the current one with its phase."""
        st = self._state(name)
        job_root = Path(self._seen_paths(name, st["run_id"]).root).parent
        ended = {}
        for run in rundirs.run_dirs(job_root):
            lines = texts(Path(self._seen_paths(name, run).node_log(0)))
            ended[run] = run_outcome(parse_events(lines))
        seen = self._seen(st)
        lines = texts(Path(self._seen_paths(name, st["run_id"]).node_log(0)))
        phase = None if seen.phase == Phase.UNKNOWN else seen.phase
        return {**ended, st["run_id"]: run_outcome(parse_events(lines), phase)}

    def tensorboard_dir(self, name: str) -> str | None:
        self._state(name)
        return jobpolicy.tensorboard_dir(self.cfg, name)

    def tensorboard_elsewhere(self, name: str, argv: list[str]) -> list[str] | None:
        return None  # on the shared file system, mounted here: TensorBoard runs here

    def run_lines(self, job: str, run_id: str) -> list[str] | None:
        """The run's logs on the shared file system (None once the leader's is gone): the leader's
        first, then the other nodes' (with an elastic range rank 0, which alone prints events, may
        sit on another node after a world change) and the batch log (srun's node failures name
        the nodes lost: job.world)."""
        p = self._seen_paths(job, run_id)
        if not Path(p.node_log(0)).is_file():
            return None
        return run_texts(p)

    def here(self, path: str) -> str | None:
        return path  # the cluster's shared file system is mounted here where the nodes mount it

    def kept_record(self, job: str) -> KeptRecord | None:
        return None  # Slurm keeps none: this machine's records are the job's (fsdpctl.job.store)

    def stop(
        self, name: str, *, wait: bool, dry_run: bool, say: Callable[[str], None] | None = None
    ) -> str:
        """The stop request on the shared file system, then SIGTERM to the job's steps (scancel
        --signal): the trainers finish their step, checkpoint and exit 0
        (fsdptrain.disruption.pod_exit), so the job COMPLETES, Stopped. A job with nothing running
        yet is cancelled. A job Slurm says nothing certain of (no answer, or the id names another
        job) is not signalled: the line says why and how to cancel it by hand."""
        st = self._state(name)
        seen = self._seen(st)
        if seen.phase in FINAL:
            return f"job {name} is not running ({seen.phase}); nothing to stop"
        sid = st["slurm_job"]
        if seen.phase == Phase.UNKNOWN:
            raise FsdpctlError(
                f"job {name}: not stopped, Slurm did not say what Slurm job {sid} is ({seen.unknown})",
                hint=f"`fsdpctl job stop {name}` once Slurm answers; `scancel {sid}` if you know it is"
                " this run",
            )
        p = self._paths(name, st["run_id"])
        if not os.path.isdir(p.root):  # a stop without its file reads as an eviction: requeued
            then = self._seen_paths(name, st["run_id"]).root
            raise BadInput(
                f"job {name}: its run's directory is not at {p.root} (SHARED_VOLUME_PATH="
                f"{self.cfg.shared_volume_path!r}): the trainers would not see the stop request",
                hint=f"set SHARED_VOLUME_PATH as the run had it (its files are at {then})"
                if then != p.root
                else "run fsdpctl where the cluster's shared file system is mounted",
            )
        if dry_run:
            return f"dry run: would write {p.stop_file} and `scancel --signal=TERM {sid}`"
        if os.path.isdir(p.root):  # the run's own directory, derived; never made by a stop
            files.write_atomic(
                Path(p.stop_file), f'{disruption.STOP_ANNOTATION}="{time.time():.0f}"\n'
            )
        if (seen.record or {}).get("JobState") == "RUNNING":
            self.slurm.signal(sid, "TERM")
        else:
            self.slurm.cancel(sid)
        if not wait:
            return f"job {name}: stopping (Slurm job {sid})"
        if say is not None:
            say(f"Slurm job {sid}: the trainers' stop checkpoint, then the job's end")
        return f"job {name}: {self.wait(name, None, say)}"

    def interrupt(self, name: str) -> Report | None:
        """Ctrl-C while following detaches: the job is slurmctld's, it keeps running."""
        return None

    def list_jobs(self) -> list[Report]:
        """Every Slurm job of this home; one whose report fails is a row saying so."""
        rows = []
        for st in self._states():
            try:
                rows.append(self._report(st, float("inf")))
            except FsdpctlError as e:
                rows.append(listing.unknown_report(st, st["nodes"], str(e)))
        return rows

    def wait(
        self, name: str, timeout: float | None, say: Callable[[str], None] | None = None
    ) -> Waited:
        """Until the job ends or `timeout` passes. A controller that does not answer (restarting,
        unreachable) is waited out for a bounded outage (job.outage): Unknown is not an end."""
        st = self._state(name)
        deadline = None if timeout is None else time.monotonic() + timeout
        said = ""
        away = Outage(self.cfg.request_timeout)
        while (seen := self._seen(st)).phase not in FINAL:
            if seen.phase != Phase.UNKNOWN:
                away.answered()
            else:
                away.unanswered(f"Slurm about job {name}: {seen.unknown}")
            if seen.phase == Phase.UNKNOWN and say is not None and seen.unknown != said:
                said = seen.unknown
                say(f"no answer from Slurm, still waiting: {said}")
            if deadline is not None and time.monotonic() > deadline:
                return seen.phase
            time.sleep(self.poll_s)
        return seen.phase

    def cleanup(
        self, *, checkpoints: bool, dry_run: bool, job: str | None = None, force: bool = False
    ) -> list[str]:
        """Each ended job (only `job` when given) with its lock held: its runs' directories on the
        shared file system whose owner file names this home and job (another home's runs of a job
        of the same name are kept, and said), its directory here; with `checkpoints` its checkpoint
        directory too when its owner file names this home. Each item names its owner. A job Slurm
        cannot say has ended is kept (`_kept_why`), unless `force`."""
        removed: list[str] = []
        for st in self._states():
            if job is not None and st["job"] != job:
                continue
            try:
                removed += self._clean(st, checkpoints=checkpoints, dry_run=dry_run, force=force)
            except (lock.Busy, lock.CorruptLock) as e:
                self.notes.append(f"{e}: kept")
        return removed

    def _clean(self, st: SlurmState, *, checkpoints: bool, dry_run: bool, force: bool) -> list[str]:
        name = st["job"]
        jdir = home.job_dir(name)
        with lock.held(jdir, wait_s=0, create=not dry_run):
            if why := self._kept_why(st, force):
                self.notes += [f"job {name}: kept, {why}"] if why != "running" else []
                return []
            me = owner.home_id()
            job_root = Path(self._paths(name, st["run_id"]).root).parent
            ckpt = self._shared_checkpoints(name) if checkpoints else None
            doomed = rundirs.owned_dirs(job_root, me, name, ckpt, self.notes)
            if not dry_run:
                for path, _ in doomed:
                    rundirs.remove(path)
                rundirs.remove_if_empty(job_root)
                for entry in jdir.iterdir():  # the lock stays: a starter may hold it
                    if entry.name != lock.NAME:
                        rundirs.remove(entry)
            return [f"{p} ({who})" for p, who in doomed] + [f"{jdir} (this home's job {name})"]

    def _kept_why(self, st: SlurmState, force: bool) -> str:
        root = Path(self._paths(st["job"], st["run_id"]).root)
        return rundirs.kept_why(st, self._seen(st), root, force)


def _not_this_run(job: dict[str, str], st: SlurmState) -> str:
    """Why the Slurm job a state names is not this run (owned.not_this_run: its name, user and
    comment), as a process is proven a job's by more than its PID; "" when it is. A state copied or
    edited to another job's id, or an id slurmctld gave again to another user's job, must not have
    that job stopped or judged."""
    return owned.not_this_run(job, dict(st), owner.home_id())
