"""The verbs that change a job, over any backend (fsdpctl.job.protocol), with the rules that protect
it held here once:

- the job's lock (fsdpctl.job.lock) around every change: run, stop, cleanup;
- a run is recorded before anything starts (its run record), submitted, then recorded in the job's
  state; when recording fails after the place accepted the run, the run is cancelled and the line
  says so, naming the outside id and the command that cancels it should cancelling fail too;
- a job whose place cannot say whether it still runs (unknown) is never replaced, deleted or marked
  failed on that: the line says what was asked and what came back;

Submitting exactly once (intent, token, find-and-cancel, settle) is fsdpctl.job.submit; what is read
without a change (`job list`, placement, Unknown rows) is fsdpctl.job.listing.

The model is torchx's Runner (torchx/runner/api.py: `run` = dryrun + schedule, then status, cancel,
list, over any scheduler).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.job import home, intent, interrupts, lock, owner, record, state, submit
from fsdpctl.job import store as record_store
from fsdpctl.job.protocol import Backend, Factory, Started
from fsdpctl.job.reports import FINAL, Phase, Report
from fsdpctl.job.state import JobState
from fsdpctl.settings import Config


def run(
    be: Backend,
    cfg: Config,
    *,
    run_id: str,
    replace: bool,
    dry_run: bool = False,
    server_dry_run: bool = False,
    other: Factory,
    say: Callable[[str], None] | None = None,
) -> Started:
    """Start a run of cfg.job_name on `be`: refused (exit 2) while a run of the job is active on any
    backend unless `replace`, which stops it first; recorded before it starts, its state written
    after its place accepted it, cancelled when that fails.

    Exactly once: the intent (the backend and the run's owner token) is written before the submit;
    an error or a signal during the submit finds the submission by its token and cancels it, and a
    `job run` killed outright (SIGKILL) leaves the intent, which the next verb on the job settles
    (`settle`: recorded when the place holds it, dropped when not, never guessed)."""
    name = cfg.job_name
    submit.unique_run_id(name, run_id)  # before its place is asked anything; again under the lock
    if dry_run or server_dry_run:
        return be.dry_run(run_id=run_id, server=server_dry_run)
    rec = be.prepare(record_store.new(cfg, run_id))  # refusals: before anything is written
    jdir = home.job_dir(name)
    with lock.held(jdir):
        submit.settle(jdir, other, say)
        submit.unique_run_id(name, run_id)
        current = state.read(jdir)
        if current is not None:
            _make_way(name, current, replace, other)
            _learn_before_it_goes(current, other)
        mine = owner.Owner(owner.home_id(), name, run_id)
        saved = record_store.save(rec)
        intent.write(jdir, be.name, mine)
        with interrupts.signals_interrupt():
            sub = submit.submit(be, mine, rec, replace, saved, jdir)
            try:
                submit.record_run(jdir, be, cfg, run_id, sub)
            except BaseException as e:  # Ctrl-C or SIGTERM too: a run nobody recorded is lost
                err = submit.undone(be, name, sub, e)
                if "cancelled" in str(err):
                    intent.clear(jdir)
                raise err from e
            # recorded: a signal from here on leaves the run running and named (an intent left
            # behind is settled by the next verb: the state already names its run)
            submit.failpoint("recorded")
            intent.clear(jdir)
    return Started(name, run_id, sub.where)


def _make_way(name: str, current: JobState, replace: bool, other: Factory) -> None:
    """Refuse a second run of a job whose run is active, on whichever backend runs it; with
    `replace`, stop that run first (waiting for it to end). Unknown is not "ended": a run whose
    place cannot say is never replaced."""
    where = state.backend_of(current)
    phase, why = phase_of(other(where), name)
    if phase is None or phase in FINAL:
        return
    run = f"run {current['run_id']} on {where}"
    if phase == Phase.UNKNOWN:
        raise FsdpctlError(
            f"job {name}: whether its {run} still runs is unknown ({why})",
            hint=f"`fsdpctl job status {name}` once its place answers; `fsdpctl job stop {name}` "
            "stops it",
            code=ExitCode.BAD_INPUT,
        )
    if not replace:
        raise FsdpctlError(
            f"job {name} is running ({phase}, {run})",
            hint=f"`fsdpctl job stop {name}` first, or pass --replace",
            code=ExitCode.BAD_INPUT,
        )
    other(where).stop(name, wait=True, dry_run=False)


def _learn_before_it_goes(current: JobState, other: Factory) -> None:
    """The run a new one replaces, learnt while its place still has it: its trainer's start line
    and losses from its logs (fsdpctl.record.learnt), and how it ended (a cluster's logs and
    phase go with its pods and job object). A run whose place cannot say is left as it is."""
    where = record_store.path(current["job"], current["run_id"])
    try:
        rec = record_store.read(where) if where.exists() else None
    except FsdpctlError:  # a damaged record is named by the verbs that read it
        return
    if rec is None:
        return
    be = other(state.backend_of(current))
    now = rec
    lines = be.run_lines(current["job"], current["run_id"]) if not rec.get("losses") else None
    now = record.learnt(now, lines) if lines is not None else now
    if not now.get("outcome") and (ended := _ended_as(be, current)) is not None:
        now = record.at_its_end(now, ended, lines)
    if now != rec:
        record_store.keep(now)


def _ended_as(be: Backend, current: JobState) -> str | None:
    """How the run ended, as its place says while it still holds it; None when it has not ended
    or its place cannot say."""
    phase, _ = phase_of(be, current["job"])
    if phase not in FINAL:
        return None
    try:
        return be.outcomes(current["job"]).get(current["run_id"])
    except FsdpctlError:
        return None


def phase_of(be: Backend, name: str) -> tuple[Phase | None, str]:
    """The job's phase as its backend says (None: its place has no such job), and why it is Unknown
    when its place gave no answer that says."""
    try:
        r = be.report(name)
    except FsdpctlError as e:
        if e.code == ExitCode.JOB_NOT_FOUND:
            return None, ""
        return Phase.UNKNOWN, str(e)
    return Phase(r["phase"]), r.get("reason") or ""


def stop(
    be: Backend, name: str, *, wait: bool, dry_run: bool, say: Callable[[str], None] | None = None
) -> str:
    """Stop the job with its lock held (a stop is a change: no run or cleanup of the job meanwhile).
    Its state is read first, so a damaged one is named before anything is made; a dry run, and a
    job with no state here (a cluster job started elsewhere, a job that does not exist), make no
    lock file."""
    jdir = home.job_dir(name)
    st = state.read(jdir)
    recorded = st is not None
    if st is not None and state.backend_of(st) != be.name:  # never another backend's job, or
        # its state marked stopped for a stop that went elsewhere
        raise FsdpctlError(
            f"job {name} runs on {state.backend_of(st)} (its state here says so), not on {be.name}",
            hint=f"`fsdpctl job stop {name}` (without --backend) stops it where it runs",
            code=ExitCode.BAD_INPUT,
        )
    if dry_run:
        return be.stop(name, wait=wait, dry_run=True, say=say)
    pending = intent.read(jdir)
    with lock.held(jdir, create=recorded or pending is not None):
        if pending is not None and pending.backend == be.name:
            # a `job run` killed mid-submit: what it submitted is found by its token and recorded
            # first, so that this stop reaches it (the user's way to end a run nothing names yet)
            submit.settle(jdir, lambda _: be, say)
            recorded = state.read(jdir) is not None
        said = be.stop(name, wait=wait, dry_run=False, say=say)
        if recorded and not be.supervised:  # (the local supervisor keeps its own state)
            _mark_stopped(jdir)
        return said


def _mark_stopped(jdir: Path) -> None:
    """The state says fsdpctl stopped the run: a place that deletes a stopped job's objects (EKS)
    still reports it Stopped, not gone. A home that cannot take it only loses that word."""
    try:
        state.update(jdir, stop_requested=True)
    except (OSError, state.Damaged):
        pass


def interrupt(be: Backend, name: str) -> Report | None:
    """Ctrl-C (or SIGTERM) while following: what the backend does with it, under the job's lock
    when it changes the job (local: a stop)."""
    with lock.held(home.job_dir(name), create=False):
        return be.interrupt(name)
