"""Issue 42 on Slurm: fsdpctl acts only on what it can prove is its own, and submits exactly once.

Sources (SchedMD/slurm, 22.05): sbatch(1) --comment and --parsable (`jobid[;cluster]`); squeue(1)
--me ("Equivalent to --user=<my username>") and -o %k ("Comment associated with the job");
scontrol(1) `show job`, whose record src/api/job_info.c (slurm_sprint_job_info, tag
slurm-22-05-8-1) prints with `UserId=%s(%u)` (line 425) and, when set, `Comment=%s` (line 929);
src/squeue/opts.c `--me` (line 119) and `%k` (line 758); scancel(1) (a user's scancel of another user's job is
refused by slurmctld: "Access/permission denied"); "Invalid job id specified" once slurmctld no
longer knows a job (MinJobAge after its end, slurm.conf(5); or after it lost its StateSaveLocation,
when ids are also handed out again from FirstJobId).

The peer: tests/fake_slurm.py, a scripted sbatch/squeue/scontrol/scancel answering in those shapes
(the real Debian slurm-wlm peer, tests/slurm_peer.py, is the slow lane's and needs root, network
namespaces and munge: the cells here are generated, many, and must be fast). The CLI runs in
process (`cli`), its sbatch and friends as real processes; signals are real signals to this
process, sent at each point of a submit.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fake_slurm
from conftest import prefixed
from fsdpctl.job import owner

# the fast lane keeps one cell of each class (a lie recorded, a signal while sbatch runs, stop over
# every kind of thing); the other generated cells run in the slow lane (each is an in-process
# `job run`, ~1 s on this 2-core machine)
SLOW = pytest.mark.slow


def _lane(values, fast):
    """Each value a cell; those not in `fast` in the slow lane (a tuple: one argument each)."""
    return [
        pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=() if v in fast else SLOW)
        for v in values
    ]


OTHER_HOME = "f" * 16
OTHER_UID = 4242
SETTINGS = {
    "BACKEND": "slurm",
    "INSTANCE_TYPE": "p5.48xlarge",
    "EFA_ENABLED": "false",
    "GPUS_PER_NODE": "1",
    "MODEL": "tiny",
    "MAX_STEPS": "40",
    "JOB_NAME": "alpha",
    "REQUEST_TIMEOUT": "2",
}


class Place:
    """The fake cluster, the shared file system and this home."""

    def __init__(self, cli, where: Path, shared: Path):
        self.cli, self.where, self.shared = cli, where, shared

    def mode(self, mode: str) -> None:
        (self.where / "mode").write_text(mode)

    def jobs(self) -> dict:
        return fake_slurm.load()

    def set_job(self, job_id: str, **changes) -> None:
        data = self.jobs()
        data["jobs"][job_id].update(changes)
        fake_slurm.save(data)

    def state(self) -> dict | None:
        path = self.cli.home / "jobs" / "alpha" / "state.json"
        return json.loads(path.read_text()) if path.exists() else None

    def ours_live(self) -> list[str]:
        """The live jobs this user holds of job alpha of this home (any run)."""
        home = owner.home_id()
        return [
            i
            for i, j in self.jobs()["jobs"].items()
            if j["state"] in fake_slurm.LIVE
            and j["uid"] == os.getuid()
            and owner.of_comment(j["comment"]).home == home
            and owner.of_comment(j["comment"]).job == "alpha"
        ]

    def scancelled(self) -> list[str]:
        return [c[-1] for c in fake_slurm.calls(self.where) if c[0] == "scancel"]

    def submits(self) -> int:
        return sum(1 for c in fake_slurm.calls(self.where) if c[0] == "sbatch")


@pytest.fixture
def place(cli, tmp_path, monkeypatch) -> Place:
    where = tmp_path / "slurm"
    for k, v in fake_slurm.install(where).items():
        monkeypatch.setenv(k, v)
    shared = tmp_path / "fsx"
    shared.mkdir()
    for k, v in prefixed({**SETTINGS, "SHARED_VOLUME_PATH": str(shared)}).items():
        monkeypatch.setenv(k, v)
    return Place(cli, where, shared)


def _exactly_one_recorded_or_none(place: Place) -> None:
    """The invariant of every cell: at most one live job of ours, and a live one is the one the
    state records (never one running untracked)."""
    live = place.ours_live()
    assert len(live) <= 1, live
    if live:
        st = place.state()
        assert st is not None and str(st["slurm_job"]) == live[0], (live, st)


def _signal_soon(sig: int, when) -> threading.Thread:
    """A real signal to this process once `when()` holds (an event, not a sleep)."""

    def send() -> None:
        deadline = time.monotonic() + 30
        while not when() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), sig)

    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t


# ---- the proof itself, over generated records ----------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(["alpha", "beta", "", "alpha "]),
    uid=st.sampled_from([os.getuid(), OTHER_UID, None]),
    comment=st.sampled_from(["ours", "legacy", "other home", "other job", "other run", "none"])
    | st.text(max_size=80),
    recorded_home=st.booleans(),
)
def test_a_slurm_record_is_ours_only_with_our_name_user_and_comment(
    name, uid, comment, recorded_home
):
    """owned.not_this_run over generated `scontrol show job` records: "" (ours) exactly when
    JobName is the job's, UserId's uid the submitter's and Comment this home's job and token (or,
    for a state from before the owner identity, the comment it was submitted with); any other
    answer is a line naming the id and saying nothing is done to it."""
    from fsdpctl.backends.slurm import owned

    home, run_id = "0123456789abcdef", "alpha-r1"
    comments = {
        "ours": owner.Owner(home, "alpha", run_id).comment(),
        "legacy": f"fsdpctl-run:{run_id}",
        "other home": owner.Owner(OTHER_HOME, "alpha", run_id).comment(),
        "other job": owner.Owner(home, "beta", run_id).comment(),
        "other run": owner.Owner(home, "alpha", "alpha-r2").comment(),
        "none": "",
    }
    said = comments.get(comment, comment)
    record = {"JobId": "7", "JobName": name, "Comment": said}
    if uid is not None:
        record["UserId"] = f"someone({uid})"
    state = {"job": "alpha", "run_id": run_id, "slurm_job": 7}
    if recorded_home:
        state |= {"owner_home": home, "slurm_user": os.getuid()}
    why = owned.not_this_run(record, state, home)
    ours = (
        name == "alpha"
        and uid == os.getuid()
        and (said == comments["ours"] or (said == comments["legacy"] and not recorded_home))
    )
    assert (why == "") == ours, (record, state, why)
    if why:
        assert why.startswith("Slurm job 7 is not run alpha-r1") and "nothing is done" in why


# ---- lying schedulers: sbatch errs, times out, or prints what is not this submit's job -----------

# mode -> (exit code, words the line has, whether the queued job stays recorded)
LIES = {
    "other-id": (0, "found by the run's token", True),
    "garbage": (0, "found by the run's token", True),
    "non-utf8": (0, "found by the run's token", True),
    "fail-after": (1, "found by its token and cancelled", False),
    "hang": (1, "found by its token and cancelled", False),  # REQUEST_TIMEOUT=2: a timeout
    "fail-before": (1, "Invalid partition", False),
}


@pytest.mark.parametrize("lie", _lane(sorted(LIES), {"other-id"}))
def test_a_lying_sbatch_leaves_exactly_one_submission_recorded_or_cancelled(place, lie):
    """sbatch queues the job (or not: fail-before), then prints another user's id (a job of the
    same name whose comment is copied: proven not ours by UserId), garbage, non-UTF-8 bytes, an
    error, or hangs past REQUEST_TIMEOUT. `job run -d` records this user's job found by the run's
    token (squeue --me, %k) and says so, or cancels it and says so; never an internal error. The
    next `job run -d` never starts a second copy beside a recorded one."""
    data = place.jobs()
    data["jobs"]["4242"] = {"name": "alpha", "uid": OTHER_UID, "user": "bob", "state": "RUNNING"}
    data["other"] = "4242"
    fake_slurm.save(data)
    place.mode(lie)
    code, words, kept = LIES[lie]
    first = place.cli("job", "run", "-d")
    assert first.exit_code == code, first.output
    assert words in first.output and "Traceback" not in first.output, first.output
    assert (len(place.ours_live()) == 1) == kept, place.jobs()
    _exactly_one_recorded_or_none(place)
    assert "4242" not in place.scancelled()
    place.mode("ok")
    second = place.cli("job", "run", "-d")
    if kept:
        assert second.exit_code == 2 and "is running" in second.output, second.output
    else:
        assert second.exit_code == 0, second.output
    assert len(place.ours_live()) == 1
    _exactly_one_recorded_or_none(place)
    assert place.jobs()["jobs"]["4242"]["state"] == "RUNNING"  # another user's job, untouched


# ---- a signal at each point of a submit -----------------------------------------------------------


SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _at(point: str, sig: int, place: Place, monkeypatch) -> None:
    """Arrange `sig` at `point`: before sbatch runs, while it runs (it has queued the job), or after
    it returned and before the state is recorded."""
    from fsdpctl.backends.slurm import door
    from fsdpctl.job import submit

    if point == "during sbatch":
        place.mode("hang")
        _signal_soon(sig, lambda: (place.where / "queued").exists())
        return
    if point == "before sbatch":
        target, name = door.Slurm, "submit"
    else:
        target, name = submit, "record_run"
    real = getattr(target, name)

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), sig)  # the handler runs here, between two bytecodes
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, signalled)


@pytest.mark.parametrize(
    ("point", "sig"),
    _lane(
        [(p, s) for p in ("before sbatch", "during sbatch", "after sbatch") for s in SIGNALS],
        {("during sbatch", signal.SIGINT)},
    ),
)
def test_a_signal_at_each_point_of_a_submit_leaves_no_job_running_untracked(place, point, sig):
    """Ctrl-C or SIGTERM at each point of `job run -d`: nothing queued yet (the command ends,
    interrupted); the queued job found by its token and cancelled, the line saying so (during
    sbatch); the submitted job cancelled as unrecorded (after sbatch). Then `job run -d` again
    starts exactly one."""
    with pytest.MonkeyPatch.context() as signalled:
        _at(point, sig, place, signalled)
        first = place.cli("job", "run", "-d")
    assert "Traceback" not in first.output
    if point == "before sbatch":
        assert first.exit_code == 128 + sig and place.submits() == 0, first.output
    elif point == "during sbatch":  # the signal's own code, 130 or 143, as before sbatch
        assert first.exit_code == 128 + sig, first.output
        assert "found by its token and cancelled" in first.output
    else:
        assert first.exit_code == 1 and "cancelled, nothing of the run is left" in first.output
    assert place.ours_live() == [] and place.state() is None, place.jobs()
    assert not (place.cli.home / "jobs" / "alpha" / "submitting.json").exists()
    place.mode("ok")
    again = place.cli("job", "run", "-d")
    assert again.exit_code == 0, again.output
    assert len(place.ours_live()) == 1
    _exactly_one_recorded_or_none(place)


@SLOW
def test_sigkill_while_sbatch_runs_is_settled_by_the_next_job_run(place):
    """SIGKILL of the real `fsdpctl job run -d` while sbatch runs (it queued the job): nothing of
    the process runs on, its intent (jobs/alpha/submitting.json) stays. The next `job run -d` asks
    Slurm for the run's token (squeue --me, %k), records the job it finds and says so, then refuses
    a second copy beside it (running): exactly one submission, recorded."""
    place.mode("hang")
    proc = place.cli.popen("job", "run", "-d")
    try:
        deadline = time.monotonic() + 60
        while not (place.where / "sbatch.pid").exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        proc.kill()
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if (pid := place.where / "sbatch.pid").exists():  # sbatch's own session: ended here
            try:
                os.kill(int(pid.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert (place.cli.home / "jobs" / "alpha" / "submitting.json").exists()
    assert len(place.ours_live()) == 1 and place.state() is None
    place.mode("ok")
    again = place.cli("job", "run", "-d")
    assert again.exit_code == 2 and "is running" in again.output, again.output
    assert "found by its token and recorded" in again.output
    assert place.submits() == 1
    _exactly_one_recorded_or_none(place)


# ---- verbs x things: only what is proven ours changes ---------------------------------------------


def _reused(place: Place, kind: str, job_id: str, run_id: str) -> None:
    """The Slurm job the state records, as slurmctld now answers for its id (after a state loss it
    may name another's job of the same name)."""
    mine = owner.Owner(owner.home_id(), "alpha", run_id)
    changes = {
        "own": {},
        "another user's": {"uid": OTHER_UID, "user": "bob"},  # its comment copied, word for word
        "another home's": {"comment": owner.Owner(OTHER_HOME, "alpha", run_id).comment()},
        "another job's": {"comment": owner.Owner(mine.home, "beta", run_id).comment()},
        "foreign": {"comment": ""},
    }[kind]
    place.set_job(job_id, state="RUNNING", **changes)


KINDS = ["own", "another user's", "another home's", "another job's", "foreign"]


def _started(place: Place) -> tuple[str, str]:
    place.mode("ok")
    r = place.cli("job", "run", "-d")
    assert r.exit_code == 0, r.output
    st = place.state()
    assert st is not None
    return str(st["slurm_job"]), st["run_id"]


@pytest.mark.parametrize(
    ("verb", "kind"),
    _lane([(v, k) for v in ("stop", "run --replace") for k in KINDS], {("stop", k) for k in KINDS}),
)
def test_stop_and_replace_signal_only_a_slurm_job_proven_ours(place, verb, kind):
    """The job's recorded id now names `kind`'s job (id reuse after slurmctld lost its state): its
    record must prove it is this run (JobName, UserId, Comment's home, job and token) before any
    scancel. Own: signalled (stop), or stopped and replaced by one new submission. Any other: no
    scancel of any job, no new submission, one line saying it is not this run."""
    job_id, run_id = _started(place)
    _reused(place, kind, job_id, run_id)
    args = ["job", "stop", "alpha"] if verb == "stop" else ["job", "run", "-d", "--replace"]
    r = place.cli(*args)
    assert "Traceback" not in r.output
    if kind == "own":
        assert r.exit_code == 0, r.output
        assert place.scancelled() == [job_id]
        assert place.submits() == (2 if verb != "stop" else 1)
    else:
        assert r.exit_code != 0 and "is not run" in r.output, r.output
        assert place.scancelled() == [] and place.submits() == 1
        assert place.jobs()["jobs"][job_id]["state"] == "RUNNING"


def _dirs_of_others(place: Place, run_id: str) -> dict[str, Path]:
    """Run directories beside ours on the shared volume, of a job of the same name."""
    root = place.shared / "fsdpctl" / "slurm" / "alpha"
    made = {}
    for kind, who in {
        "another home's": owner.Owner(OTHER_HOME, "alpha", "alpha-b1"),
        "another job's": owner.Owner(owner.home_id(), "beta", "alpha-c1"),
        "foreign": None,
    }.items():
        d = root / (who.run_id if who else "alpha-d1")
        d.mkdir(parents=True)
        (d / "node-0.log").write_text("theirs\n")
        if who:
            owner.write_file(d, who)
        made[kind] = d
    return made


@pytest.mark.parametrize("kind", _lane(KINDS, {"own"}))
def test_cleanup_removes_only_run_directories_and_jobs_proven_ours(place, kind):
    """Our run ended (COMPLETED) or its id now names `kind`'s job; beside our run directory on the
    shared volume sit another home's, another job's and an ownerless one. cleanup --yes: only our
    directory goes (and only when our job is proven ended); every other stays, and is named;
    nothing is scancelled. --dry-run names the owner of each item."""
    job_id, run_id = _started(place)
    _reused(place, kind, job_id, run_id)
    if kind == "own":
        place.set_job(job_id, state="COMPLETED")
    others = _dirs_of_others(place, run_id)
    ours = place.shared / "fsdpctl" / "slurm" / "alpha" / run_id
    dry = place.cli("cleanup", "--dry-run")
    assert dry.exit_code == 0, dry.output
    if kind == "own":
        assert f"{ours} (owner: home {owner.home_id()}, job alpha, run {run_id})" in dry.output
    r = place.cli("cleanup", "--yes", "--checkpoints")
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    assert all(d.is_dir() for d in others.values())
    assert ours.is_dir() == (kind != "own")
    assert place.scancelled() == []
    if kind != "own":
        assert place.state() is not None and "unknown" in r.output


@SLOW
def test_an_invalid_job_id_with_a_fresh_log_is_not_an_end_but_force_is(place):
    """scontrol "Invalid job id specified" while the run's log was written a moment ago: cleanup
    keeps everything and says why (owned.QUIET_GRACE_S, 15 min); cleanup --force removes it."""
    job_id, run_id = _started(place)
    place.set_job(job_id, forgotten=True)
    ours = place.shared / "fsdpctl" / "slurm" / "alpha" / run_id
    (ours / "node-0.log").write_text("step 3\n")
    kept = place.cli("cleanup", "--yes")
    assert kept.exit_code == 0 and ours.is_dir(), kept.output
    assert "Invalid job id" in kept.output and "--force" in kept.output
    old = time.time() - 16 * 60
    for p in [ours, *ours.iterdir()]:
        os.utime(p, (old, old))
    quiet = place.cli("cleanup", "--yes")
    assert quiet.exit_code == 0 and not ours.exists(), quiet.output
    assert place.state() is None


@SLOW
def test_force_cleans_a_forgotten_run_with_a_fresh_log(place):
    job_id, run_id = _started(place)
    place.set_job(job_id, forgotten=True)
    forced = place.cli("cleanup", "--yes", "--force")
    assert forced.exit_code == 0, forced.output
    assert not (place.shared / "fsdpctl" / "slurm" / "alpha" / run_id).exists()
    assert place.scancelled() == []


# ---- the layout before the core, and a checkpoint already at MAX_STEPS ----------------------------


def test_a_pre_core_record_is_adopted_listed_and_never_run_beside(place):
    """FSDPCTL_HOME/slurm/alpha.json (the layout before the job core, commit 23c4b24's parent) of
    a running job submitted with the old comment: `job list` shows it, `job run` refuses a second
    copy, the file is read once (renamed .adopted). A damaged one is one line, exit 2."""
    run_id = "alpha-old1"
    root = place.shared / "fsdpctl" / "slurm" / "alpha" / run_id
    jobs = {"7": {"name": "alpha", "uid": os.getuid(), "comment": f"fsdpctl-run:{run_id}"}}
    fake_slurm.save_to(place.where, {"next": 100, "other": "", "jobs": jobs})
    place.set_job("7", state="RUNNING")
    old = place.cli.home / "slurm" / "alpha.json"
    old.parent.mkdir(parents=True)
    record = {"job": "alpha", "run_id": run_id, "slurm_job": 7, "root": str(root)}
    old.write_text(json.dumps({**record, "nodes": 1, "max_restarts": 0, "created": time.time()}))
    again = place.cli("job", "run", "-d")  # the first verb after the upgrade
    assert again.exit_code == 2 and "is running" in again.output, again.output
    assert place.submits() == 0
    assert not old.exists() and old.with_name("alpha.json.adopted").exists()
    listed = place.cli("job", "list", "-o", "json")
    assert listed.exit_code == 0, listed.output
    [row] = [r for r in json.loads(listed.stdout) if r["job"] == "alpha"]
    assert row["phase"] == "Running" and row["run_id"] == run_id
    (place.cli.home / "slurm" / "beta.json").write_text("{not json")
    damaged = place.cli("job", "status", "beta")
    assert damaged.exit_code == 2 and "beta.json" in damaged.output, damaged.output
    assert "Traceback" not in damaged.output


def test_a_pre_core_job_is_listed_whatever_backend_is_set(place, monkeypatch):
    """`job list` with BACKEND=local asks Slurm too while FSDPCTL_HOME/slurm/ holds a pre-core
    record (listing.backends_here): the job is listed, not omitted."""
    run_id = "alpha-old2"
    jobs = {"7": {"name": "alpha", "uid": os.getuid(), "comment": f"fsdpctl-run:{run_id}"}}
    fake_slurm.save_to(place.where, {"next": 100, "other": "", "jobs": jobs})
    place.set_job("7", state="PENDING")
    old = place.cli.home / "slurm" / "alpha.json"
    old.parent.mkdir(parents=True)
    root = place.shared / "fsdpctl" / "slurm" / "alpha" / run_id
    record = {"job": "alpha", "run_id": run_id, "slurm_job": 7, "root": str(root), "nodes": 1}
    old.write_text(json.dumps({**record, "max_restarts": 0, "created": time.time()}))
    monkeypatch.setenv("FSDPCTL_BACKEND", "local")
    listed = place.cli("job", "list", "-o", "json")
    assert listed.exit_code == 0, listed.output
    [row] = [r for r in json.loads(listed.stdout) if r["job"] == "alpha"]
    assert (row["backend"], row["phase"]) == ("slurm", "Pending")


def test_a_checkpoint_already_at_max_steps_is_refused_before_submit(place):
    """As the local backend (local.resume_refusal): the checkpoint the run would resume, visible on
    the shared volume, is at MAX_STEPS: `job run` says so, exit 2, nothing submitted."""
    step = place.shared / "checkpoints" / "alpha" / "step-00000040"
    step.mkdir(parents=True)
    (step / "meta.json").write_text(json.dumps({"step": 40}))
    r = place.cli("job", "run", "-d")
    assert r.exit_code == 2 and "MAX_STEPS" in r.output, r.output
    assert place.submits() == 0 and place.state() is None


@pytest.mark.parametrize("kind", ["another home's", "another job's", "own", "no owner"])
def test_a_checkpoint_directory_owned_by_another_home_or_job_is_refused_before_submit(place, kind):
    """Two laptops with one job name on one FSx: their runs would resume and overwrite each other's
    checkpoints. A checkpoint directory whose owner file names another home or another job is
    refused (exit 2, naming the owner and the way out), nothing submitted; this home's job's, and
    one with no owner file (adopted, as on the local backend), are run."""
    from fsdpctl.job import owner

    ckpt = place.shared / "checkpoints" / "alpha"
    ckpt.mkdir(parents=True)
    mine = owner.home_id()
    home = {"another home's": "0" * 16}.get(kind, mine)
    job = "beta" if kind == "another job's" else "alpha"
    if kind != "no owner":
        owner.write_file(ckpt, owner.Owner(home, job, "alpha-earlier"))
    r = place.cli("job", "run", "-d")
    if kind in ("own", "no owner"):
        assert r.exit_code == 0 and place.submits() == 1, r.output
        assert owner.read_file(ckpt).home == mine
        return
    assert r.exit_code == 2 and "is not job alpha's of this home" in r.output, r.output
    assert f"owner: home {home}, job {job}" in r.output and "JOB_NAME" in r.output
    assert place.submits() == 0 and place.state() is None


# ---- a few cells on the real peer ------------------------------------------------------------------


@SLOW
def test_on_real_slurm_a_lying_sbatch_is_recorded_and_a_reused_id_is_never_signalled(tmp_path):
    """The real peer (tests/slurm_peer.py: Debian slurm-wlm 22.05.8, one node). A foreign job of
    the same name and no comment (`sbatch --job-name=alpha --wrap`) holds the node. `job run -d`
    through an sbatch that queues the job and prints garbage: recorded by its token (real squeue
    --me %k), Pending behind the foreign job (real `scontrol show job` Comment= and UserId=
    proven). The state pointed at the foreign job's id (as after slurmctld's state loss): `job
    stop` refuses, the foreign job still runs. Pointed back: `job stop` cancels ours alone."""
    import slurm_peer
    from conftest import fsdpctl_process

    with slurm_peer.running(tmp_path / "cluster", nodes=1) as cluster:
        foreign = cluster.command(
            "sbatch", "--parsable", "--job-name=alpha", "--exclusive", "--wrap", "sleep 600"
        ).stdout.strip()
        try:
            # it holds the node once slurmd registered it (a loaded CI machine: seconds after up)
            cluster.wait_for(
                lambda: cluster.job(int(foreign)).get("JobState") == "RUNNING",
                "the foreign job runs",
            )
            (tmp_path / "home").mkdir()
            (tmp_path / "fsx").mkdir()
            lying = tmp_path / "lying"
            lying.mkdir()
            real = cluster.command("sh", "-c", "command -v sbatch").stdout.strip()
            (lying / "sbatch").write_text(
                f'#!/bin/sh\n{real} "$@" >/dev/null || exit $?\necho "Submitted batch job"\n'
            )
            (lying / "sbatch").chmod(0o755)
            base = {k: v for k, v in cluster.env.items() if not k.startswith("FSDPCTL_")}
            env = base | {"FSDPCTL_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
            env |= prefixed({**SETTINGS, "SHARED_VOLUME_PATH": str(tmp_path / "fsx")})
            env["FSDPCTL_REQUEST_TIMEOUT"] = "30"
            run = fsdpctl_process("job", "run", "-d", env=env | {"PATH": f"{lying}:{env['PATH']}"})
            assert run.returncode == 0, run.stderr
            assert "found by the run's token" in run.stderr
            path = tmp_path / "home" / "jobs" / "alpha" / "state.json"
            st = json.loads(path.read_text())
            status = fsdpctl_process("job", "status", "alpha", "-o", "json", env=env)
            assert json.loads(status.stdout)["phase"] == "Pending", status.stdout + status.stderr
            path.write_text(json.dumps({**st, "slurm_job": int(foreign)}))
            refused = fsdpctl_process("job", "stop", "alpha", env=env)
            assert refused.returncode == 1 and "is not run" in refused.stderr, refused.stderr
            queued = cluster.command("squeue", "-h", "-o", "%i %T").stdout.split("\n")
            assert f"{foreign} RUNNING" in queued, queued
            path.write_text(json.dumps(st))
            stopped = fsdpctl_process("job", "stop", "alpha", env=env)
            assert stopped.returncode == 0, stopped.stderr
            queued = cluster.command("squeue", "-h", "-o", "%i %T").stdout.split("\n")
            assert f"{foreign} RUNNING" in queued
            assert not [q for q in queued if q.startswith(f"{st['slurm_job']} ")], queued
        finally:
            cluster.command("scancel", foreign, check=False)
