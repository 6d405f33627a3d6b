"""`job wait --for` (fsdpctl.job.waitfor): kubectl's `wait --for` (kubectl/pkg/cmd/wait: a condition
on the object, polled until it holds or the timeout passes; an object gone is an error) on a job's
report. Generated reports over every phase and step: a condition holds exactly when the report
shows it, Unknown never holds nor ends the wait, and a job that ended short of it is said at once.
The real job: tests/test_cli.py's detached job waits `--for step=3` on real torchrun."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsdpctl.errors import BadInput
from fsdpctl.job import waitfor
from fsdpctl.job.reports import FINAL, Phase

# out of the fast lane (it keeps under 2 minutes): beside the serial slow lane (conftest)
pytestmark = pytest.mark.slow


def _report(phase: Phase, step: int, checkpoint: str | None) -> dict:
    return {"phase": phase, "step": step, "checkpoint": checkpoint}


@given(
    phase=st.sampled_from(list(Phase)),
    step=st.integers(0, 10_000),
    want=st.integers(0, 10_000),
    ckpt=st.one_of(st.none(), st.just("step-00000050")),
)
def test_a_condition_holds_exactly_when_the_report_shows_it(phase, step, want, ckpt):
    r = _report(phase, step, ckpt)
    for cond, shown in (
        (waitfor.parse(f"step={want}"), step >= want),
        (waitfor.parse("checkpoint"), ckpt is not None),
        (waitfor.parse(f"phase={Phase.RUNNING.value.lower()}"), phase == Phase.RUNNING),
    ):
        held = waitfor.met(cond, r)  # type: ignore[arg-type]
        assert held == (shown and phase != Phase.UNKNOWN)
        short = waitfor.unreachable(cond, r)  # type: ignore[arg-type]
        assert (short is not None) == (phase in FINAL and not held)
        if short:
            assert str(cond) in short and phase.value in short


@pytest.mark.parametrize(
    "text", ["", "step", "step=", "step=-1", "step=x", "steps=3", "checkpoint=1", "phase=done", "x"]
)
def test_a_bad_condition_is_one_line_naming_it(text):
    with pytest.raises(BadInput) as e:
        waitfor.parse(text)
    assert repr(text) in str(e.value) and "\n" not in str(e.value)


def test_a_bad_condition_exits_2_before_the_job_is_looked_for(cli):
    r = cli("job", "wait", "nothing-here", "--for", "stepp=3")
    assert r.exit_code == 2 and "--for 'stepp=3' is not a condition" in r.stderr


def test_a_followed_log_that_shows_nothing_says_what_the_job_is_doing(capsys, monkeypatch):
    """`job logs -f --trainer-only` printed nothing while the job started (issue 44): while the
    follow has shown no line, a line per stage the job is seen in goes to stderr; none once a line
    was shown, and the watcher ends with the follow."""
    import threading

    from fsdpctl.cli import job_wait

    monkeypatch.setattr(job_wait, "QUIET_S", 0.05)
    stages = iter(["rendezvous 1/2", "rendezvous 1/2", "loading data"])
    seen = threading.Event()

    class Starting:
        def report(self, name):
            stage = next(stages, None)
            if stage is None:
                seen.set()
                stage = "loading data"
            return {"phase": "Running", "stage": stage, "max_steps": None, "prestep": None}

    with job_wait.Quiet(Starting(), "first") as quiet:
        assert seen.wait(10)
        quiet.shown()
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "waiting for the log's lines: rendezvous 1/2 ...",
        "waiting for the log's lines: loading data ...",
    ]
    assert not quiet.thread.is_alive()
