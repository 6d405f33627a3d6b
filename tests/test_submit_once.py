"""Every submit happens exactly once: the job core (fsdpctl.job.runner, .submit) writes the intent
before a backend's submit, and after an error, a timeout or a signal at any point of the submit it finds the
submission by the run's owner token and cancels it, or (SIGKILL: nothing of the process runs on)
the next `job run` settles the intent and records it. Whatever the point, the place then holds at
most one live submission of the job, and a live one is the one the job's state names.

The peer: a scheduler kept in a JSON file (so a second process sees it), which can lie as the
independent fault pass saw sbatch and the API server lie: take a job and then fail, time out, be
interrupted, or stop answering. The shape of its answers is Slurm's (squeue finds a job by its
comment, %k: squeue(1)) and AWS's idempotency tokens (a retried create with the same ClientToken
is not a second one); the backends' own tests drive real sbatch (tests/test_ownership_slurm.py) and
the Kubernetes API peer (tests/test_ownership_eks.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.job import home, intent, owner, runner, state
from fsdpctl.job.protocol import Submitted
from fsdpctl.job.reports import Phase
from fsdpctl.settings import load

# out of the fast lane (it keeps under 2 minutes): beside the serial slow lane (conftest)
pytestmark = pytest.mark.slow

# the points of a submit at which the fault lands, and what the place holds then
BEFORE = ("refuse",)  # the place said no: nothing queued
AFTER = ("error", "timeout", "sigint", "sigterm", "sighup")  # queued, then the fault


class Place:
    """A scheduler in a file: jobs by id, each with the token it was given and whether it lives."""

    def __init__(self, path: Path):
        self.path = path

    def jobs(self) -> dict[str, dict]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def save(self, jobs: dict[str, dict]) -> None:
        self.path.write_text(json.dumps(jobs))

    def queue(self, job: str, token: str) -> str:
        jobs = self.jobs()
        job_id = str(len(jobs) + 1)
        jobs[job_id] = {"job": job, "token": token, "live": True}
        self.save(jobs)
        return job_id

    def live(self, job: str) -> list[str]:
        return [i for i, j in self.jobs().items() if j["job"] == job and j["live"]]


class FakeBackend:
    """The Backend protocol's submit side over the Place, with a fault at a chosen point."""

    name = "slurm"
    supervised = False
    keeps_state = True
    notes: list[str] = []

    def __init__(self, place: Place, fault: str | None = None, unreachable: bool = False):
        self.place, self.fault, self.unreachable = place, fault, unreachable

    def prepare(self, record):
        return record

    def submit(self, *, run_id, record, replace):
        mine = owner.Owner(owner.home_id(), record["job"], run_id)
        if self.fault == "refuse":
            raise FsdpctlError("the scheduler refused the job", hint="fix it")
        job_id = self.place.queue(mine.job, mine.token)
        if self.fault == "error":
            raise FsdpctlError("sbatch: error: Batch job submission failed: Socket timed out")
        if self.fault == "timeout":
            raise TimeoutError("sbatch did not answer in 30 s")
        if self.fault == "sigint":
            raise KeyboardInterrupt
        if self.fault in ("sigterm", "sighup"):
            os.kill(os.getpid(), signal.SIGTERM if self.fault == "sigterm" else signal.SIGHUP)
        if self.fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        return self._submitted(job_id, record)

    def _submitted(self, job_id: str, record) -> Submitted:
        return Submitted(
            {"slurm_job": int(job_id), "nodes": 1, "max_restarts": 0},
            record,
            f"job {job_id}",
            f"Slurm job {job_id}",
            f"scancel {job_id}",
        )

    def find_submitted(self, mine):
        if self.unreachable:
            raise FsdpctlError(
                "squeue: error: slurm_load_jobs error: Unable to contact slurm controller"
            )
        for job_id, j in self.place.jobs().items():
            if j["token"] == mine.token and j["live"]:
                return self._submitted(job_id, None)
        return None

    def cancel(self, submitted):
        jobs = self.place.jobs()
        jobs[str(submitted.state["slurm_job"])]["live"] = False
        self.place.save(jobs)

    def report(self, name):
        st = state.read(home.job_dir(name))
        if st is None:
            raise FsdpctlError("no job", code=ExitCode.JOB_NOT_FOUND)
        job_id = str(st["slurm_job"])
        alive = self.place.jobs().get(job_id, {}).get("live")
        return {"phase": Phase.RUNNING if alive else Phase.SUCCEEDED, "reason": ""}

    def run_lines(self, job, run_id):
        return None


def _run(be: FakeBackend, run_id: str) -> None:
    cfg = load(flags={"BACKEND": "slurm", "JOB_NAME": "once"})
    runner.run(be, cfg, run_id=run_id, replace=False, other=lambda _: be)


@pytest.mark.parametrize("fault", BEFORE + AFTER)
def test_a_fault_at_any_point_of_a_submit_leaves_no_submission_running(cli, tmp_path, fault):
    """Before the place took the job: its own error, nothing left. After: found by its token and
    cancelled, the line says so, the exit code is the signal's (130, 143, 129) or the error's; no
    intent is left, and the next `job run` starts exactly one."""
    place = Place(tmp_path / "place.json")
    with pytest.raises(FsdpctlError) as e:
        _run(FakeBackend(place, fault), "r-1")
    said = str(e.value)
    jdir = home.job_dir("once")
    assert place.live("once") == []
    assert intent.read(jdir) is None and state.read(jdir) is None
    if fault in AFTER:
        assert "found by its token and cancelled" in said, said
        want = {"sigint": 130, "sigterm": 143, "sighup": 129}.get(fault, ExitCode.FAILURE)
        assert e.value.code == want
    else:
        assert said == "the scheduler refused the job" and e.value.hint == "fix it"
    _run(FakeBackend(place), "r-2")
    assert len(place.live("once")) == 1
    assert state.read(jdir)["run_id"] == "r-2"


def test_a_place_that_stops_answering_keeps_the_intent_and_the_next_run_records_it(cli, tmp_path):
    """sbatch errs after queuing and squeue cannot be asked: the core cannot know, so it keeps the
    intent and says so. While the place still cannot answer, the next `job run` starts nothing;
    once it answers, the queued job is recorded as the job's run and the second run is refused as a
    running job's would be."""
    place = Place(tmp_path / "place.json")
    with pytest.raises(FsdpctlError, match="could not be checked"):
        _run(FakeBackend(place, "error", unreachable=True), "r-1")
    jdir = home.job_dir("once")
    assert intent.read(jdir) is not None and len(place.live("once")) == 1
    with pytest.raises(FsdpctlError, match="its place cannot say"):
        _run(FakeBackend(place, unreachable=True), "r-2")
    with pytest.raises(FsdpctlError, match="is running") as e:
        _run(FakeBackend(place), "r-3")
    assert e.value.code == ExitCode.BAD_INPUT
    assert state.read(jdir)["run_id"] == "r-1" and intent.read(jdir) is None
    assert len(place.live("once")) == 1


CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from test_submit_once import FakeBackend, Place, _run
    _run(FakeBackend(Place(Path({place!r})), "sigkill"), "r-1")
    """
)


def test_a_job_run_killed_outright_is_settled_by_the_next(cli, tmp_path):
    """SIGKILL after the place took the job (the fault pass's `job run -d` killed the moment the API
    held the PyTorchJob): nothing of that process runs on, its intent stays. The next `job run`
    finds the submission by its token, records it, and refuses to start a second beside it."""
    place = tmp_path / "place.json"
    code = CHILD.format(tests=str(Path(__file__).parent), place=str(place))
    got = subprocess.run([sys.executable, "-c", code], env=cli.env(), timeout=120)
    assert got.returncode == -signal.SIGKILL
    jdir = home.job_dir("once")
    assert intent.read(jdir) is not None and state.read(jdir) is None
    with pytest.raises(FsdpctlError, match="is running"):
        _run(FakeBackend(Place(place)), "r-2")
    assert state.read(jdir)["run_id"] == "r-1" and intent.read(jdir) is None
    assert len(Place(place).live("once")) == 1


def test_a_reused_run_id_is_refused(cli, tmp_path):
    """A run id names one run of a job: reusing one would overwrite the first run's record."""
    place = Place(tmp_path / "place.json")
    be = FakeBackend(place)
    _run(be, "r-1")
    be.cancel(be.find_submitted(owner.Owner(owner.home_id(), "once", "r-1")))
    with pytest.raises(FsdpctlError, match="already has a run with this id") as e:
        _run(be, "r-1")
    assert e.value.code == ExitCode.BAD_INPUT and place.live("once") == []


def test_a_stop_after_a_job_run_killed_outright_reaches_what_it_submitted(cli, tmp_path):
    """`job stop` is the user's way to end a run a killed `job run` left unnamed: the intent is
    settled first (found by its token, recorded), then the stop reaches that run."""
    place = tmp_path / "place.json"
    code = CHILD.format(tests=str(Path(__file__).parent), place=str(place))
    assert subprocess.run([sys.executable, "-c", code], env=cli.env(), timeout=120).returncode < 0
    stopped = []

    class Stoppable(FakeBackend):
        def stop(self, name, *, wait, dry_run, say=None):
            st = state.read(home.job_dir(name))
            assert st is not None and st["run_id"] == "r-1"  # recorded before the stop
            self.cancel(self._submitted(str(st["slurm_job"]), None))
            stopped.append(name)
            return "stopped"

    said: list[str] = []
    runner.stop(Stoppable(Place(place)), "once", wait=True, dry_run=False, say=said.append)
    assert stopped == ["once"] and Place(place).live("once") == []
    assert any("found by its token and recorded" in line for line in said)
    assert intent.read(home.job_dir("once")) is None
