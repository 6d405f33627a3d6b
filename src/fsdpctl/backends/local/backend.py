"""The local backend: the rendered PyTorchJob on this machine, through the local adapter's
supervisor."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpctl import files
from fsdpctl.backends import KeptRecord, LogLine, Started, Submitted
from fsdpctl.backends.local import cleanup as local_cleanup
from fsdpctl.backends.local import engine as local
from fsdpctl.backends.local import owned
from fsdpctl.backends.local.report import failed_log, job_report, no_logs, run_events
from fsdpctl.backends.local.state import LocalState
from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.files import home
from fsdpctl.job import crilog, lock
from fsdpctl.job import state as core_state
from fsdpctl.job import store as record_store
from fsdpctl.job.hf_token import secret_env
from fsdpctl.job.owner import Owner
from fsdpctl.job.progress import (
    across_runs,
    run_outcome,
)
from fsdpctl.job.protocol import refuse
from fsdpctl.job.record import RunRecord
from fsdpctl.job.reports import Phase, Report, Waited
from fsdpctl.settings.placement import local_path
from fsdptrain import events
from fsdptrain.config import missing_packages

if TYPE_CHECKING:
    from fsdpctl.settings import Config


class LocalBackend:
    name = "local"
    poll_s = 0.5
    keeps_state = True  # every local job is in this home
    supervised = True  # its supervisor records the run's progress into the state from its start
    # its reports, logs and listing are files in this home: a verb that only reads hands it a
    # loader of the settings (fsdpctl.backends.reader), called only by what acts
    settings_on_demand = True

    def __init__(self, cfg: Config | Callable[[], Config]):
        self._cfg = cfg
        # what list_jobs and cleanup skipped (a stray file, a damaged state)
        self.notes: list[str] = []
        # what the last cleanup kept, "<what>: <why> (owner: ...)" (cli.cleanup_cmd prints "kept ...")
        self.kept: list[str] = []
        self.history_source = ""  # the log `history` read

    @property
    def cfg(self) -> Config:
        """The settings, loaded (and checked) the first time a method needs them."""
        if callable(self._cfg):
            self._cfg = self._cfg()
        return self._cfg

    def _rendered(self, run_id: str, record_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The job's objects as the cluster would get them: the PyTorchJob the supervisor runs, and
        what comes before it (the pre-step's Job among them)."""
        from fsdpctl.job import render  # the job's objects: for a start, not for a read verb

        # the elastic range as a PyTorchJob states it (elasticPolicy.minReplicas, as render puts
        # it for every backend); the supervisor turns it into torchrun's --nnodes=MIN:MAX
        # (pods.elastic_command)
        *infra, job = render.render_job(self.cfg, run_id, record_id)
        return infra, job

    def refusals(self) -> list[str]:
        """A package the trainers need missing from this environment (they run in it), a token
        file that is not one token, a checkpoint the run must not resume (the same line the
        trainer's pre-launch check would give on each node)."""
        lines = list(missing_packages(self.cfg.training))
        try:  # its contents (whether it exists is the settings' own check)
            if Path(self.cfg.hf_token_file).expanduser().is_file():
                secret_env(self.cfg)
        except FsdpctlError as e:
            lines.append(str(e))
        _, job = self._rendered("refusals", "")
        if refusal := self._resume_refusal(job):
            lines.append(refusal)
        spec = local.spec_from_job(job, local.job_dir(self.cfg.job_name))
        if refusal := owned.refusal(
            owned.checkpoint_dir(spec, self.cfg.job_name), self.cfg.job_name
        ):
            lines.append(refusal)
        return lines

    def dry_run(self, *, run_id: str, server: bool) -> Started:
        if server:
            raise FsdpctlError(
                "--dry-run=server needs a cluster",
                hint="use --dry-run, or --backend eks",
                code=ExitCode.BAD_INPUT,
            )
        refuse(self.refusals())
        infra, job = self._rendered(run_id, "")
        started = self._dry_run(job, run_id, _prestep_job(infra))
        started.objects = [*infra, job]  # what the supervisor runs, as a cluster would get it
        return started

    def prepare(self, record: RunRecord) -> RunRecord:
        refuse(self.refusals())
        from fsdpctl.job import render

        infra, job = self._rendered(record["run_id"], record["id"])
        return {**record, "manifests": render.to_yaml([*infra, job])}

    def submit(self, *, run_id: str, record: RunRecord, replace: bool) -> Submitted:
        """The supervisor started on the rendered job (the core holds the job's lock and stopped a
        run it replaces; the old supervisor may still be on its way out: waited for up to its
        grace)."""
        infra, job = self._rendered(run_id, record["id"])
        if refusal := self._resume_refusal(job):  # after a --replace stop: its stop checkpoint
            raise FsdpctlError(refusal, code=ExitCode.BAD_INPUT)
        settle = local.grace_s(self.cfg.job_name) + 10 if replace else 0
        try:
            st = local.start(
                job, secret_env=secret_env(self.cfg), prestep=_prestep_job(infra), settle_s=settle
            )
        except (local.JobBusy, local.CorruptState, local.NotOurs) as e:  # running, not fsdpctl's
            raise FsdpctlError(str(e), code=ExitCode.BAD_INPUT) from e
        except OSError as e:  # the home cannot take the job's files: nothing was started
            raise FsdpctlError(f"cannot start job {self.cfg.job_name}: {files.why(e)}") from e
        sup = st.get("supervisor") or {"pid": st["supervisor_pid"]}
        return Submitted(
            state={},
            record=record,
            where=f"logs in {st['log_dir']}",
            outside=f"its supervisor (pid {sup['pid']})",
            cancel_command=f"kill -TERM {sup['pid']}",
        )

    def find_submitted(self, mine: Owner) -> Submitted | None:
        """The local submit writes the job's state before it starts the supervisor (the state is
        its intent): the run is this home's when the state names it and a supervisor of it was
        started."""
        st = self._state_or_none(mine.job)
        if st is None or st["run_id"] != mine.run_id:
            return None
        sup = st.get("supervisor") or {"pid": st.get("supervisor_pid")}
        if sup.get("pid") is None:
            return None
        return Submitted(
            state={},
            record=record_store.new(self.cfg, mine.run_id),
            where=f"logs in {st['log_dir']}",
            outside=f"its supervisor (pid {sup['pid']})",
            cancel_command=f"kill -TERM {sup['pid']}",
        )

    def cancel(self, submitted: Submitted) -> None:
        """The supervisor stopped, as `job stop` does (its pods get SIGTERM, then SIGKILL after
        their grace), and waited for."""
        try:
            local.stop(self.cfg.job_name)
        except local.LocalJobError as e:
            raise FsdpctlError(str(e)) from e
        local.wait(self.cfg.job_name, timeout=local.grace_s(self.cfg.job_name) + 30)

    def _resume_refusal(self, job: dict[str, Any]) -> str | None:
        """Why the run must not resume the checkpoint it would (see local.resume_refusal); the same
        line the trainer's pre-launch check would give on each node."""
        spec = local.spec_from_job(job, local.job_dir(self.cfg.job_name))
        return local.resume_refusal(spec, self.cfg.training, self.cfg.world_size)

    def _dry_run(
        self, job: dict[str, Any], run_id: str, fetch_job: dict[str, Any] | None
    ) -> Started:
        spec = local.spec_from_job(job, local.job_dir(self.cfg.job_name))
        pre = local.prestep_spec(fetch_job, local.job_dir(self.cfg.job_name)) if fetch_job else None
        lines = ([f"pre-step: {' '.join(pre['argv'])}"] if pre else []) + [
            f"node {launch.node}: " + " ".join(launch.argv)
            for launch in local.launches(spec, "127.0.0.1:<port>", {})
        ]
        where = f"{spec['replicas']} launchers x {spec['nproc_per_node']} processes"
        return Started(self.cfg.job_name, run_id, where, lines)

    def _state_or_none(self, name: str) -> LocalState | None:
        """The job's state; None when it has none; a damaged one is one line naming it, exit 2."""
        try:
            return local.settle(local.read_state(local.job_dir(name)))  # ended unseen: ended now
        except local.CorruptState as e:
            raise FsdpctlError(
                str(e),
                # a file this user may not read may well be whole: never "remove" for that
                hint=e.hint
                if isinstance(e, core_state.Unreadable)
                else f"remove {local.job_dir(name)} and run the job again",
                code=ExitCode.BAD_INPUT,
            ) from e

    def _state(self, name: str) -> LocalState:
        st = self._state_or_none(name)
        if st is None:
            raise FsdpctlError(
                f"no job named {name!r}",
                hint="`fsdpctl job list` shows the jobs; `fsdpctl job run` starts one",
                code=ExitCode.JOB_NOT_FOUND,
            )
        return st

    def report(self, name: str, stall_after: float = float("inf")) -> Report:
        return job_report(self._state(name), stall_after)

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
            raise FsdpctlError("--pod names a pod on a cluster", hint="locally, use --node N")
        st = self._state(name)
        chosen = _chosen_logs(st, all_, node)
        if not chosen:
            raise no_logs(name, local.log_dir(st))
        readers = {f: _Follower(f) for f in chosen}
        since = (
            time.time() - since_s if since_s is not None else None
        )  # the kubelet's now - sinceSeconds
        first = True
        while True:
            active = local.effective_phase(self._state(name)) in local.ACTIVE
            for f, reader in readers.items():
                lines = [
                    LogLine({"node": f.stem}, line.text, line.time)
                    for line in reader.read(final=not (follow and active))
                ]
                lines = [x for x in lines if keep is None or keep(x)]
                if (
                    first
                ):  # the kubelet's choice applies to what is there when asked; the rest is new
                    lines = crilog.select(lines, tail=tail, since=since)
                yield from lines
            first = False
            if not follow or not active:
                return
            time.sleep(0.3)

    def tail(self, name: str, lines: int) -> list[str]:
        """The last lines of the failed node's log, else of the leader's."""
        st = self._state(name)
        log = failed_log(st) or local.leader_log(st)
        return crilog.texts(log)[-lines:] if log else []

    def history(self, name: str) -> list[events.Event]:
        """The job's whole curve: the runs that continued its checkpoints, each from where it
        started."""
        st = self._state(name)
        # what `job plot` names when it finds no step: the current run's leader log, else its log
        # directory
        self.history_source = str(local.leader_log(st) or local.log_dir(st))
        return across_runs([run_events(d) for d in _lineage(st)])

    def outcomes(self, name: str) -> dict[str, str]:
        st = self._state(name)
        logs, phase = local.log_dir(st), local.effective_phase(st)
        ours = logs.parent.is_dir() and files.reached_without_link(logs.parent, home())
        runs = sorted(logs.parent.iterdir()) if ours else []
        found = {
            d.name: run_outcome(run_events(d)) for d in runs if d.is_dir() and not d.is_symlink()
        }
        return {**found, st["run_id"]: run_outcome(run_events(logs), phase)}

    def tensorboard_dir(self, name: str) -> str | None:
        st = self._state(name)
        recorded = st.get("tensorboard_dir")
        found = local.in_home(st, recorded)
        if recorded and found is None:  # TensorBoard would be run on whatever the file names
            raise FsdpctlError(
                f"{local.job_dir(name) / 'state.json'} names TensorBoard directory {recorded!r}, which is "
                "not in FSDPCTL_HOME",
                hint=f"its events are under {local.shared_volume_dir('<claim>')}/...; run the job again",
                code=ExitCode.BAD_INPUT,
            )
        return str(found) if found else None

    def tensorboard_elsewhere(self, name: str, argv: list[str]) -> list[str] | None:
        return None  # the event files are on this machine

    def run_lines(self, job: str, run_id: str) -> list[str] | None:
        """Every node's log of the run under the job's directory (the leader alone prints events, so
        all nodes' lines together hold just its), as text."""
        logs = sorted((local.job_dir(job) / "logs" / run_id).glob("node-*.log"))
        return [line for p in logs for line in crilog.texts(p)]

    def here(self, path: str) -> str | None:
        from fsdpctl.job import policy as jobpolicy

        cfg = self.cfg
        claims = {
            cfg.shared_volume_path: cfg.shared_volume,
            jobpolicy.POD_CHECKPOINT_ROOT: cfg.checkpoint_pvc,
        }
        return local_path(
            path, {p: str(local.shared_volume_dir(c)) for p, c in claims.items() if c}
        )

    def kept_record(self, job: str) -> KeptRecord | None:
        return None  # this machine's record store is the only one

    def stop(
        self, name: str, *, wait: bool, dry_run: bool, say: Callable[[str], None] | None = None
    ) -> str:
        st = self._state(name)
        phase = local.effective_phase(st)
        if phase not in local.ACTIVE:
            return f"job {name} is not running ({phase}); nothing to stop"
        if dry_run:
            return f"dry run: would send SIGTERM to job {name} (run {st['run_id']}, {st['replicas']} nodes)"
        at = job_report(st, float("inf"))["step"]
        try:
            st = (
                local.stop(name) or st
            )  # an orphaned job's stop is done here, by the time it returns
        except local.LocalJobError as e:
            raise FsdpctlError(str(e)) from e
        if not wait:
            return f"job {name}: stopping"
        said = None
        while local.effective_phase(st) in local.ACTIVE:
            if say is not None and (note := _stop_note(st, at)) != said:
                say(note)
                said = note
            st = local.wait(name, timeout=0.5) or st
        return f"job {name}: {local.effective_phase(st)}"

    def interrupt(self, name: str) -> Report | None:
        """Ctrl-C while following stops the job as Kubernetes would (SIGTERM: the trainer
        checkpoints)."""
        try:
            local.stop(name)
        except (
            local.LocalJobError
        ) as e:  # e.g. a supervisor that is not the one recorded: signalled nothing
            raise FsdpctlError(str(e), hint=f"`fsdpctl job status {name}`") from e
        local.wait(name)
        return self.report(name)

    def list_jobs(self) -> list[Report]:
        return [job_report(st, float("inf")) for st in local.list_jobs(self.notes)]

    def wait(
        self, name: str, timeout: float | None, say: Callable[[str], None] | None = None
    ) -> Waited:
        self._state(name)
        return local.effective_phase(local.wait(name, timeout=timeout)) or Phase.FAILED

    def cleanup(
        self, *, checkpoints: bool, dry_run: bool, job: str | None = None, force: bool = False
    ) -> list[str]:
        """Everything of each ended job (only `job`'s when given) but its checkpoints (unless
        asked): logs, state, etcd data, node disks; with `checkpoints` also its directory on the
        shared volume when its owner file proves it this home's job's (with `force`, also one that
        has no owner file). Each item names its owner; what is kept is in `kept`, with why."""
        removed = []
        self.kept = []
        for st in local.list_jobs(self.notes):
            if job is not None and st["job"] != job:
                continue
            try:
                removed += local_cleanup.clean_job(
                    st,
                    checkpoints=checkpoints,
                    dry_run=dry_run,
                    notes=self.notes,
                    kept=self.kept,
                    force=force,
                )
            except (lock.CorruptLock, lock.Busy) as e:  # nothing of it is touched
                self.notes.append(f"{e}: skipped")
        return removed


def _prestep_job(infra: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The pre-step's Job among the objects before the PyTorchJob: the download before training."""
    return next((o for o in infra if o["kind"] == "Job"), None)


def _stop_note(st: LocalState, at: int) -> str:
    """What a stopping job waits for now (`job stop` prints it after `waiting: `): the trainer's
    stop checkpoint (the step in flight finishes first), then its launchers' exit; the pod's grace
    period after which every process gets SIGKILL."""
    r = job_report(st, float("inf"))
    grace = f"SIGKILL after the {local.grace_s(st['job']):.0f} s grace period"
    if r["summary"] is not None and r["summary"].get("stopped"):
        left = f"{r['nodes_running']} launcher" + ("" if r["nodes_running"] == 1 else "s")
        return f"{left} to exit (stop checkpoint written: {r['checkpoint']})"
    if r["max_steps"] and at >= r["max_steps"]:  # SIGTERM came after its last step: it saves, ends
        return f"its last step ({r['max_steps']}) is done: its final checkpoint and exit ({grace})"
    if r["max_steps"]:  # the step SIGTERM came in finishes first
        return f"step {at + 1} to finish and its stop checkpoint ({grace})"
    return f"the launchers to exit: no step trained yet ({grace})"


def _lineage(st: LocalState) -> list[Path]:
    """The log directories of the job's runs up to the current one that kept their checkpoints where
    it does (its CHECKPOINT_SUBDIR: a rerun's curve is its own), oldest first by their records."""
    runs = {r["run_id"]: r for r in record_store.of_job(st["job"])}
    current = runs.get(st["run_id"])
    line = current["settings"].get("CHECKPOINT_SUBDIR", "") if current else ""
    until = current.get("created", float("inf")) if current else float("inf")
    kept = [
        r
        for r in runs.values()
        if r["settings"].get("CHECKPOINT_SUBDIR", "") == line and r.get("created", 0) <= until
    ]
    logs = local.log_dir(st)  # derived, never the path the state records
    dirs = [logs.parent / r["run_id"] for r in kept if r["run_id"] != st["run_id"]]
    return [d for d in dirs if d.is_dir() and not d.is_symlink()] + [logs]


def _chosen_logs(st: LocalState, all_: bool, node: int | None) -> list[Path]:
    if node is not None:
        return [f for f in local.log_files(st) if f.stem == f"node-{node}"]
    if all_:
        return local.log_files(st)
    leader = local.leader_log(st)
    return [leader] if leader else []


class _Follower:
    """Reads a log file as it grows: whole lines only, a line still being written (no newline yet,
    or the partial pieces before its last) held for the next read, unless `final` (nothing more will
    come)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.carry, self.damaged = path, 0, b"", False

    def read(self, *, final: bool) -> list[crilog.Line]:
        if self.damaged:
            return []
        try:
            chunk = self.carry + self._new_bytes()
        except FileNotFoundError:
            return []
        except OSError as e:  # not a regular file (a FIFO, a link): said once, then left alone
            self.damaged = True
            files.skipped(self.path, files.why(e))
            return []
        self.offset += len(chunk) - len(self.carry)
        whole, _, rest = chunk.rpartition(b"\n")
        if final:
            whole, rest = chunk, b""
        found, held = crilog.complete(crilog.raw_lines(whole))
        if final:
            return [*found, *crilog.lines(held)]
        self.carry = crilog.raw_bytes(held) + rest
        return found

    def _new_bytes(self) -> bytes:
        """What was written since the last read, at most crilog.READ_MAX (the first read of a log
        over it starts that far from its end, at a line)."""
        with files.open_regular(self.path) as fh:
            size = os.fstat(fh.fileno()).st_size
            if self.offset == 0 and size > crilog.READ_MAX:
                fh.seek(size - crilog.READ_MAX)
                fh.readline()
                self.offset = fh.tell()
                files.skipped(
                    self.path, f"is over {crilog.READ_MAX >> 20} MiB", "only its end shown"
                )
            fh.seek(self.offset)
            return fh.read(crilog.READ_MAX)
