"""Submit once (issue 36's discipline): a run's intent (its backend and owner token) is written before
its submit; a submit that raises (its own error, a timeout, Ctrl-C, SIGTERM) has its submission found
by the token and cancelled; a recording that fails after its place took the run cancels it; and a
`job run` killed outright leaves the intent, which the next verb on the job settles (`settle`).
fsdpctl.job.runner.run is the one caller that submits; `stop` settles too."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from fsdpctl import targets
from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.job import home, intent, owner, state
from fsdpctl.job import store as record_store
from fsdpctl.job.interrupts import Interrupted
from fsdpctl.job.listing import PLACEMENT_KEYS
from fsdpctl.job.protocol import Backend, Factory, Submitted
from fsdpctl.job.record import RunRecord
from fsdpctl.settings import Config

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


UNCHECKED = "unchecked: "


def submit(
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
        found = cancel_found(be, mine)
        record_store.discard(saved)
        if found is None:
            intent.clear(jdir)
            raise
        if not found.startswith(UNCHECKED):
            intent.clear(jdir)
        raise submit_error(mine, e, found.removeprefix(UNCHECKED)) from e


def submit_error(mine: owner.Owner, e: BaseException, found: str) -> FsdpctlError:
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


def cancel_found(be: Backend, mine: owner.Owner) -> str | None:
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


def unique_run_id(name: str, run_id: str) -> None:
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


def record_run(jdir: Path, be: Backend, cfg: Config, run_id: str, sub: Submitted) -> None:
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


def undone(be: Backend, name: str, sub: Submitted, why: BaseException) -> FsdpctlError:
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
