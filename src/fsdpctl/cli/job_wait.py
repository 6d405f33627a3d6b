"""`job wait --for`: poll a job's report until a condition holds (fsdpctl.job.waitfor), as
`kubectl wait --for` does, so a walkthrough or a CI script waits for what it needs, not a pace."""

from __future__ import annotations

import time

import typer

from fsdpctl.backends import Backend
from fsdpctl.cli.common import Output, emit, err, ok, warn
from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.job import waitfor
from fsdpctl.job.reports import Phase

# off a terminal a followed wait says where the job is this often (a CI log is never silent long)
PROGRESS_EVERY_S = 30.0


def wait_for(
    be: Backend, name: str, cond: waitfor.Condition, timeout: float | None, output: Output
) -> None:
    """Poll the job's report until `cond` holds (exit 0), the job ends short of it (exit 1), or
    `timeout` passes (exit 5). A place that gives no answer is waited out, said once; off a
    terminal a line says where the job is at most every PROGRESS_EVERY_S, so a CI log is not
    silent."""
    deadline = None if timeout is None else time.monotonic() + timeout
    said_unknown, said_at = False, time.monotonic()
    while True:
        try:
            r = be.report(name)
        except FsdpctlError as e:
            if e.code == ExitCode.JOB_NOT_FOUND:
                raise
            r = None
            why = str(e)
        if r is not None and waitfor.met(cond, r):
            ok(f"job {name}: {cond} reached ({r['phase']}, step {r['step']})")
            emit(
                {
                    "job": name,
                    "for": str(cond),
                    "phase": r["phase"],
                    "step": r["step"],
                    "exit_code": 0,
                },
                output,
            )
            return
        if r is not None and (short := waitfor.unreachable(cond, r)):
            raise FsdpctlError(f"job {name}: {short}", code=ExitCode.FAILURE)
        if (r is None or r["phase"] == Phase.UNKNOWN) and not said_unknown:
            warn(f"job {name}: its place gives no answer ({r['reason'] if r else why}); waiting")
            said_unknown = True
        if r is not None and time.monotonic() - said_at >= PROGRESS_EVERY_S:
            err.print(f"job {name}: waiting for {cond}: {r['phase']}, step {r['step']}")
            said_at = time.monotonic()
        if deadline is not None and time.monotonic() >= deadline:
            warn(f"job {name}: timed out waiting for {cond}")
            raise typer.Exit(ExitCode.JOB_TIMED_OUT)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        time.sleep(min(be.poll_s, left) if left is not None else be.poll_s)
