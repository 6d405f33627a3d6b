"""The verbs that change a job, over any backend (fsdpctl.job.protocol), with the rules that protect
it held here once:

- the job's lock (fsdpctl.job.lock) around every change: run, stop, cleanup;
- a run is recorded before anything starts (its run record), submitted, then recorded in the job's
  state; when recording fails after the place accepted the run, the run is cancelled and the line
  says so, naming the outside id and the command that cancels it should cancelling fail too;
- a job whose place cannot say whether it still runs (unknown) is never replaced, deleted or marked
  failed on that: the line says what was asked and what came back;
- `list` asks every backend that holds a job here, and one backend's or one job's trouble is one
  warning, never an empty or failed list.

The model is torchx's Runner (torchx/runner/api.py: `run` = dryrun + schedule, then status, cancel,
list, over any scheduler).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fsdpctl import files, targets
from fsdpctl.errors import ExitCode, FsdpctlError, SettingsError
from fsdpctl.job import home, intent, lock, owner, record, state
from fsdpctl.job import store as record_store
from fsdpctl.job.protocol import Backend, Started, Submitted
from fsdpctl.job.record import RunRecord
from fsdpctl.job.reports import FINAL, Phase, Report
from fsdpctl.job.state import JobState
from fsdpctl.settings import Config

# settings that say where on its backend a job lives, kept in its state: a verb on the job finds it
# there without being told (`placed`)
PLACEMENT_KEYS = ("job_namespace", "job_kind", "kube_context")

Factory = Callable[[str], Backend]  # a backend by name, with the command's settings


def refuse(lines: list[str]) -> None:
    """A place's refusals (Backend.refusals), all at once: one line each, exit 2."""
    if lines:
        raise SettingsError(lines)


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
    _unique_run_id(name, run_id)  # before its place is asked anything; again under the lock
    if dry_run or server_dry_run:
        return be.dry_run(run_id=run_id, server=server_dry_run)
    rec = be.prepare(record_store.new(cfg, run_id))  # refusals: before anything is written
    jdir = home.job_dir(name)
    with lock.held(jdir):
        settle(jdir, other, say)
        _unique_run_id(name, run_id)
        current = state.read(jdir)
        if current is not None:
            _make_way(name, current, replace, other)
            _learn_before_it_goes(current, other)
        mine = owner.Owner(owner.home_id(), name, run_id)
        saved = record_store.save(rec)
        intent.write(jdir, be.name, mine)
        with signals_interrupt():
            sub = _submit(be, mine, rec, replace, saved, jdir)
            try:
                _record(jdir, be, cfg, run_id, sub)
            except BaseException as e:  # Ctrl-C or SIGTERM too: a run nobody recorded is lost
                err = _undone(be, name, sub, e)
                if "cancelled" in str(err):
                    intent.clear(jdir)
                raise err from e
            # recorded: a signal from here on leaves the run running and named (an intent left
            # behind is settled by the next verb: the state already names its run)
            failpoint("recorded")
            intent.clear(jdir)
    return Started(name, run_id, sub.where)


FAILPOINT_ENV = "FSDPCTL_TEST_FAILPOINT"
FAILPOINTS = ("intent", "submitted", "recorded")


def failpoint(at: str) -> None:
    """Test-only (FSDPCTL_TEST_* is the test suite's): FSDPCTL_TEST_FAILPOINT=<at>:<SIGNAL> sends
    this process SIGNAL (SIGINT, SIGTERM, SIGKILL) at point `at` of a submit: `intent` (written,
    nothing submitted), `submitted` (the place took it, nothing recorded), `recorded` (the state
    written, the intent not yet cleared). tests/test_ownership_local.py interrupts `job run` there;
    unset, it does nothing."""
    point, _, name = os.environ.get(FAILPOINT_ENV, "").partition(":")
    if point == at and name in ("SIGINT", "SIGTERM", "SIGKILL"):
        os.kill(os.getpid(), getattr(signal, name))


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP during a submit or while a job is followed, taken as Ctrl-C is (a submit's
    submission is found and cancelled; a followed job is stopped or left), before the command ends
    with 128 + the signal's number, as a shell reports a process that signal ended."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Interrupted in the block (main thread only: Python delivers signals
    there; its default for both ends the process at once, without a word), so a `job run` that CI's
    timeout or a closed terminal ends still cancels or records what it submitted, and a followed
    job is let go as Ctrl-C would. SIGKILL cannot be caught: a submit's intent stays (`settle`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


UNCHECKED = "unchecked: "


def _submit(
    be: Backend, mine: owner.Owner, rec: RunRecord, replace: bool, saved: Path, jdir: Path
) -> Submitted:
    """The backend's submit; when it raises (its own error, a timeout, Ctrl-C, SIGTERM), the
    submission its place may hold all the same is found by the run's token and cancelled, and the
    line says which: nothing of the run is left running unnamed. A place that cannot be asked
    keeps the intent, for the next verb to settle."""
    try:
        failpoint("intent")
        sub = be.submit(run_id=mine.run_id, record=rec, replace=replace)
        failpoint("submitted")
        return sub
    except BaseException as e:
        found = _cancel_found(be, mine)
        record_store.discard(saved)
        if found is None:
            intent.clear(jdir)
            raise
        if not found.startswith(UNCHECKED):
            intent.clear(jdir)
        raise _submit_error(mine, e, found.removeprefix(UNCHECKED)) from e


def _submit_error(mine: owner.Owner, e: BaseException, found: str) -> FsdpctlError:
    if isinstance(e, FsdpctlError):
        return FsdpctlError(f"{e}; {found}", hint=e.hint, code=e.code)
    if not isinstance(e, KeyboardInterrupt):  # a timeout, a defect: named as it is
        return FsdpctlError(f"job {mine.job}: the submit failed ({type(e).__name__}: {e}): {found}")
    signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
    code = {signal.SIGTERM: ExitCode.TERMINATED, signal.SIGHUP: ExitCode.HUNG_UP}
    return FsdpctlError(
        f"job {mine.job}: the submit was interrupted ({signal.Signals(signum).name}): {found}",
        code=code.get(signal.Signals(signum), ExitCode.INTERRUPTED),
    )


def _cancel_found(be: Backend, mine: owner.Owner) -> str | None:
    """The submission of run `mine` its place holds after a submit that raised, cancelled; what was
    done, in words (UNCHECKED first when the place could not be asked); None when the place holds
    none."""
    try:
        found = be.find_submitted(mine)
    except FsdpctlError:
        return (
            f"{UNCHECKED}whether its place holds a submission of run {mine.run_id} could not be "
            f"checked: the next `fsdpctl job run` of {mine.job} looks again (token {mine.token})"
        )
    if found is None:
        return None
    try:
        be.cancel(found)
    except Exception as e:  # noqa: BLE001 - named in the line, with the command that does it
        return f"{found.outside} was found by its token and cancelling it failed ({e}): " + (
            f"cancel it yourself: {found.cancel_command}"
        )
    return f"{found.outside} was found by its token and cancelled: nothing of the run runs"


def settle(jdir: Path, other: Factory, say: Callable[[str], None] | None = None) -> None:
    """An intent a killed `job run` left (its submit began, nothing recorded it): the place is asked
    for the submission by its token. Found: recorded as the job's run, as if that `job run` had
    ended well. Not found: the intent goes. The place cannot answer: refused, saying so (a run
    that may be running is never started again). Called with the job's lock held."""
    pending = intent.read(jdir)
    if pending is None:
        return
    be = other(pending.backend)
    mine = owner.Owner(pending.home, jdir.name, pending.run_id)
    try:
        found = be.find_submitted(mine)
    except FsdpctlError as e:
        raise FsdpctlError(
            f"job {jdir.name}: an interrupted `job run` may have submitted run {pending.run_id} on "
            f"{pending.backend}, and its place cannot say ({e})",
            hint="run the command again once the place answers; nothing is started meanwhile",
            code=ExitCode.BAD_INPUT,
        ) from e
    if found is None:
        intent.clear(jdir)
        return
    if (where := record_store.path(jdir.name, pending.run_id)).exists():
        rec = record_store.read(where)
        found = Submitted(found.state, rec, found.where, found.outside, found.cancel_command)
    now = {
        "job": jdir.name,
        "backend": pending.backend,
        "run_id": pending.run_id,
        "created": pending.at,
        **found.state,
    }
    if be.supervised:
        state.update(jdir, **now)
    else:
        state.write(jdir, now)
    intent.clear(jdir)
    if say is not None:
        say(
            f"job {jdir.name}: an interrupted `job run` had submitted run {pending.run_id} "
            f"({found.outside}): found by its token and recorded"
        )


def _unique_run_id(name: str, run_id: str) -> None:
    """A run id names one run of a job: one already recorded here is refused (its record, the
    history's line and the run's files would be another run's)."""
    try:
        current = state.read(home.job_dir(name))
    except state.Damaged:  # named by the verb that reads it next; the records still say
        current = None
    recorded = os.path.lexists(record_store.path(name, run_id))
    if recorded or (current is not None and current["run_id"] == run_id):
        raise FsdpctlError(
            f"--run-id {run_id!r}: job {name} already has a run with this id",
            hint="leave --run-id out (a new id is made), or pass one not used before "
            f"(`fsdpctl job history {name}` lists them)",
            code=ExitCode.BAD_INPUT,
        )


def _record(jdir: Path, be: Backend, cfg: Config, run_id: str, sub: Submitted) -> None:
    """The job's state after its submit: the core's keys, where on its backend it lives, and the
    backend's keys for the run. A backend whose own process writes the state from its start (the
    local supervisor) gets its keys merged; any other's state is written afresh (nothing of an
    earlier run is left in it)."""
    now = {
        "job": cfg.job_name,
        "backend": be.name,
        "run_id": run_id,
        "created": time.time(),
        **{k: getattr(cfg, k) for k in PLACEMENT_KEYS if targets.target(be.name).kubernetes},
        **sub.state,
    }
    if be.supervised:
        state.update(jdir, **now)
    else:
        state.write(jdir, now)
    if sub.record is not None:
        record_store.save(sub.record)


def _undone(be: Backend, name: str, sub: Submitted, why: BaseException) -> FsdpctlError:
    """The line for a submit whose recording failed: cancelled, or how to cancel it by hand."""
    said = (why.strerror if isinstance(why, OSError) else None) or str(why) or type(why).__name__
    try:
        be.cancel(sub)
    except Exception as e:  # noqa: BLE001 - named in the line, with the command that does it
        return FsdpctlError(
            f"job {name}: {sub.outside} was started but could not be recorded here ({said}), and "
            f"cancelling it failed too ({e}): it runs unrecorded",
            hint=f"cancel it yourself: {sub.cancel_command}",
        )
    return FsdpctlError(
        f"job {name}: {sub.outside} was started but could not be recorded here ({said}): "
        "cancelled, nothing of the run is left running",
        hint="free space in FSDPCTL_HOME (or point FSDPCTL_HOME elsewhere) and run it again",
    )


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
            settle(jdir, lambda _: be, say)
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


def stopped_report(st: JobState, nodes: int) -> Report:
    """A run fsdpctl stopped whose place deleted it (EKS: `job stop` deletes the job and its
    pods), from what the state records."""
    why = (
        "stopped with `fsdpctl job stop`; its place deleted the job's objects: `fsdpctl job resume` "
        "continues from its last checkpoint"
    )
    return {**unknown_report(st, nodes, why), "phase": Phase.STOPPED, "problems": []}


def interrupt(be: Backend, name: str) -> Report | None:
    """Ctrl-C (or SIGTERM) while following: what the backend does with it, under the job's lock
    when it changes the job (local: a stop)."""
    with lock.held(home.job_dir(name), create=False):
        return be.interrupt(name)


@dataclass
class Listed:
    """`job list` over every backend: the reports, what was passed over (one line each), and the
    backends that could not be asked (their error: the command prints the rest, then fails)."""

    reports: list[Report] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failed: list[FsdpctlError] = field(default_factory=list)


def list_jobs(cfg: Config, other: Factory, only: str | None = None) -> Listed:
    """The jobs of every backend that holds one in this home, and of `only` (or BACKEND when it is a
    place that keeps its own jobs, EKS's cluster) besides; with `only`, that backend's alone. A
    backend that cannot be asked is in `failed`, and its jobs recorded here are listed as
    Unknown."""
    names = [only] if only else backends_here(cfg)
    found = Listed()
    for name in names:
        be = other(name)
        try:
            rows = be.list_jobs()
        except FsdpctlError as e:
            found.failed.append(e)
            rows = [_unknown_row(s, f"{name}: {e}") for s in _states_of(name)]
        found.notes += [n for n in getattr(be, "notes", []) if n not in found.notes]
        found.reports += rows
    return found


def backends_here(cfg: Config) -> list[str]:
    """The backends holding a job in this home, and BACKEND (EKS lists the cluster's jobs, started
    from anywhere)."""
    here = {state.backend_of(s) for s in _all_states()} | {cfg.backend}
    # a layout before the job core (Slurm's FSDPCTL_HOME/slurm/, which its backend adopts as it
    # lists): a job there is a job here
    here |= {
        n
        for n in targets.NAMES
        if (d := targets.target(n).legacy_dir) and (files.home() / d).is_dir()
    }
    return [n for n in targets.NAMES if n in here]


def _all_states() -> list[JobState]:
    found = []
    for jdir in home.job_dirs(lambda _: None):
        try:
            st = state.read(jdir)
        except state.Damaged:
            continue
        if st is not None:
            found.append(st)
    return found


def _states_of(backend: str) -> list[JobState]:
    return [s for s in _all_states() if state.backend_of(s) == backend]


def states_of(backend: str, notes: list[str]) -> list[JobState]:
    """Every job of `backend` recorded in this home (for a backend's list and cleanup); a damaged
    state or a stray file is one line in `notes` and the other jobs are still there."""
    found = []
    for jdir in home.job_dirs(notes.append):
        try:
            st = state.read(jdir)
        except state.Damaged as e:
            notes.append(f"{e}: skipped")
            continue
        if st is not None and state.backend_of(st) == backend:
            found.append(st)
    return found


def _unknown_row(st: JobState, why: str) -> Report:
    """A recorded job whose backend could not be asked, as a row that says so."""
    return unknown_report(st, _nodes(st), why)


def _nodes(st: Mapping[str, object]) -> int:
    """The node count a backend's own keys record (Slurm: nodes, local: replicas; checked ints)."""
    n = st.get("nodes") or st.get("replicas") or 0
    return n if isinstance(n, int) else 0


def unknown_report(st: JobState, nodes: int, why: str) -> Report:
    """A report that knows only what the state records: the job, its backend and run, Unknown with
    what was asked and what came back."""
    backend = state.backend_of(st)
    return {
        "job": st["job"],
        "backend": backend,
        "phase": Phase.UNKNOWN,
        "run_id": st["run_id"],
        "nodes": nodes,
        "nodes_running": 0,
        "restarts": 0,
        "age_s": time.time() - st["created"],
        "leader": None,
        "leader_log": None,
        "checkpoint_dir": None,
        "reason": why,
        "problems": [why],
        "stalled": False,
        "labels": {
            "fsdpctl.io/job": st["job"],
            "fsdpctl.io/run-id": st["run_id"],
            **st.get("labels", {}),
            "fsdpctl.io/backend": backend,
        },
        "prestep": None,
        "network": None,
        "step": 0,
        "max_steps": None,
        "percent": 0.0,
        "loss": None,
        "tokens_per_s": None,
        "eta_s": None,
        "last_progress_s": None,
        "checkpoint": None,
        "summary": None,
    }


def placement(job: str) -> dict[str, str] | None:
    """Where the job's state says it lives: its backend, and on a Kubernetes place its namespace,
    kind and context; None without a state (a damaged one is said once: the verb then looks where
    BACKEND says)."""
    jdir = home.job_dir(job)
    try:
        st = state.read(jdir)
    except state.Damaged as e:
        files.skipped(
            e.path, str(e).removeprefix(f"{e.path} "), "ignored (the job is looked for at BACKEND)"
        )
        return None
    if st is None:
        return None
    recorded: Mapping[str, object] = st
    return {
        "backend": state.backend_of(st),
        **{k: str(recorded[k]) for k in PLACEMENT_KEYS if k in st},
    }
