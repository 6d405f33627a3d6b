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


# a followed log that has shown nothing for this long says what the job is doing
QUIET_S = 5.0


class Quiet:
    """While a followed log has shown nothing (a job still starting: `job logs -f --trainer-only`
    printed nothing for its whole start, issue 44), say on stderr what the job is doing instead, a
    line per stage it is seen in: `waiting for the trainer's lines: rendezvous 1/2`. A thread asks
    the job's report every QUIET_S until `shown` is called or the follow ends; a report that cannot
    be had says nothing."""

    def __init__(self, be: Backend, name: str) -> None:
        import threading

        self.be, self.name = be, name
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.said = ""

    def __enter__(self) -> Quiet:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=QUIET_S)

    def shown(self) -> None:
        self.done.set()

    def _watch(self) -> None:
        from fsdpctl.cli.job_view import plain_line

        while not self.done.wait(QUIET_S):
            try:
                r = self.be.report(self.name)
            except Exception:  # noqa: BLE001 - a view: the follow itself says what went wrong
                continue
            stage, line = plain_line(r)
            if stage != self.said and not self.done.is_set():
                err.print(f"waiting for the log's lines: {line}", markup=False, highlight=False)
                self.said = stage
