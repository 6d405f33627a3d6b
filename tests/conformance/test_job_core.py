"""The job core's rules (issue 35), one test class per rule, each run on every backend of TARGETS on
its most real peer (places.py): local on this machine, eks on the Kubernetes API peer, slurm on a
real Slurm 22.05 cluster. A rule lives in fsdpctl.job, once; a backend passes these by registering,
not by checks of its own.

1. a state is untrusted input: a tampered state naming paths outside makes no verb delete or write
   there (a path is derived from the settings, the job's name and its run id, never read);
2. two `job run` of one name at the same instant: exactly one runs (flock(2) on the job's lock),
   the other is refused, exit 2;
3. submit, then record, or cancel: recording that fails after the place accepted the run cancels it
   (scancel; the job deleted; the supervisor stopped), and a cancel that fails too names the
   outside id and the command that cancels it;
4. unknown is not an outcome: a scheduler or API answer that is empty, malformed or not the job's
   is Unknown, with what was asked; nothing is deleted or marked Failed on it; `job wait` waits on;
5. read verbs never need to write: status, list, logs, describe, history on a read-only and on a
   full home answer as on a writable one;
6. modes from fsdpctl, not the umask: under umask 000 nothing fsdpctl makes is world-writable.

Sources: flock(2) and proc(5) (/proc/locks); Slurm 22.05 sbatch(1) --parsable, scontrol(1) and
slurm.h (job ids are uint32_t; NO_VAL 0xfffffffe and INFINITE 0xffffffff are sentinels),
squeue(1) (a cancelled job leaves the default listing); the Kubernetes API's DELETE with
propagationPolicy Foreground (the peer's garbage collector, as kube-controller-manager's); torchx's
Runner (an empty describe is unknown, never failed: torchx/schedulers/api.py).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import places
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from places import place, slurm_root, until  # noqa: F401 (the suite's fixtures)

pytest_generate_tests = places.generate

pytestmark = pytest.mark.slow

# What CI's 40 minutes hold (the rest: `make test-all` / `make conformance`, marked `extended` by
# conftest through IN_CI). A rule lives in fsdpctl.job once, so each rule keeps its cheapest places in
# CI and every place keeps rules in CI; the cells left out took 20-130 s each (CI's run of 1c2f8c4:
# its serial lane 2,221 s, over the 40 minutes) (the Slurm
# and EKS peers' answers to "unknown" wait on REQUEST_TIMEOUT, the read-only-home cells train a run
# first). Outside CI here, each has a test of its own in CI: an unreachable slurmctld
# (test_slurm_backend.py), endpoints that never answer (test_silent_endpoints.py).
LEFT_TO_MAKE_CONFORMANCE = {
    "test_an_answer_that_says_nothing_of_the_job_is_unknown_never_an_end": {"eks", "slurm"},
    "test_replace_stops_the_running_run_and_starts_exactly_one": {"eks"},
    "test_read_verbs_answer_alike_on_a_read_only_and_a_full_home": {"local", "eks"},
    "test_history_describe_and_list_read_a_run_as_on_every_backend": {"eks", "slurm"},
    "test_a_node_the_job_does_not_have_is_refused": {"local", "eks"},
    "test_nothing_fsdpctl_makes_is_world_writable_under_umask_000": {"eks", "slurm"},
    "test_logs_tail_n_prints_n_lines_whatever_is_hidden": {"eks", "slurm"},
    "test_a_tampered_state_makes_no_verb_touch_what_it_names": {"eks", "slurm"},
    "test_two_runs_of_one_name_at_the_same_instant_start_exactly_one": {"eks"},
}


def IN_CI(item: pytest.Item) -> bool:  # noqa: N802 - read by conftest like a constant
    place_ = item.callspec.params.get("place") if hasattr(item, "callspec") else None
    return place_ not in LEFT_TO_MAKE_CONFORMANCE.get(item.originalname, set())


# what a verb may answer: documented exit codes (README "Exit codes"), never an internal error
CODES = {0, 1, 2, 3, 4, 5, 6}
READ_VERBS = (
    ("job", "status", "alpha"),
    ("job", "status", "alpha", "-o", "json"),
    ("job", "list", "-o", "json"),
    ("job", "logs", "alpha", "--all"),
    ("job", "describe", "alpha", "-o", "json"),
    ("job", "history", "alpha", "-o", "json"),
)


def _no_internal_error(result, args) -> None:
    text = (result.stdout or "") + (result.stderr or "")
    assert result.returncode in CODES, f"{args}: rc {result.returncode}: {text[-800:]}"
    assert "Traceback" not in text and "internal error" not in text, f"{args}: {text[-800:]}"


def _tree(*roots: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry under `roots` (not following links): its mode, size and, for a file, its bytes."""
    found = {}
    for root in roots:
        for p in [root, *root.rglob("*")] if root.exists() else []:
            s = os.lstat(p)
            data = p.read_bytes() if stat.S_ISREG(s.st_mode) else b""
            found[str(p)] = (s.st_mode, s.st_size, data)
    return found


# ---- 1. a tampered state names paths outside ------------------------------------------------------------


def _decoy(root: Path) -> Path:
    """A directory a tampered state names: a user's, outside the home and the shared file system,
    laid out as every backend's files would be (so a path read from the state would hit them)."""
    d = root / "users-own"
    for rel in (
        "logs/node-0.log",
        "stop",
        "job.sbatch",
        "alpha/step-00000003/meta.json",
        "x/state.json",
    ):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text("the user's own file\n")
    return d


def _paths_in(decoy: Path) -> st.SearchStrategy[str]:
    return st.sampled_from(
        [
            str(decoy),
            f"{decoy}/",
            f"{decoy}/alpha",
            f"{decoy}/logs",
            f"{decoy}/x/..",
            "/",
            f"{decoy}/../users-own",
        ]
    )


def _hostile(state: dict, decoy: Path) -> st.SearchStrategy[dict]:
    """The job's own state with values changed as a hand, a copy or a damaged write would: every
    string a path to the user's directory, every number a hostile one, new keys that name it."""
    path = _paths_in(decoy)
    number = st.sampled_from([-1, 0, 1, 2**31, 2**32, 2**32 + 5, 10**30, 0xFFFFFFFE, 7])
    changes = {
        k: (path if isinstance(v, str) and k not in ("job", "backend") else number)
        for k, v in state.items()
        if isinstance(v, str | int) and not isinstance(v, bool) and k != "version"
    }
    extra = {k: path for k in ("root", "log_dir", "checkpoint_dir", "tensorboard_dir", "script")}
    return st.fixed_dictionaries({}, optional={**changes, **extra}).map(lambda c: {**state, **c})


VERBS = (
    *READ_VERBS,
    ("job", "wait", "alpha", "--timeout", "1"),
    ("job", "stop", "alpha"),
    ("cleanup", "alpha", "--yes", "--checkpoints"),
)


def test_a_tampered_state_makes_no_verb_touch_what_it_names(place, tmp_path, monkeypatch):
    """A real ended job's state, changed by hypothesis (its strings to a user's directory, its ids
    and counts to hostile numbers, new keys naming that directory); every verb then runs in process:
    none exits with an internal error, and the user's directory is byte for byte what it was. Paths
    are derived (fsdpctl.job.home, script.paths, backends/local/state.py), never read."""
    place.ended("alpha")
    jdir = place.home / "jobs" / "alpha"
    original = json.loads((jdir / "state.json").read_text())
    decoy = _decoy(tmp_path)
    before = _tree(decoy)

    @settings(
        max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(data=st.data())
    def case(data):
        state = data.draw(_hostile(original, decoy), label="state")
        jdir.mkdir(parents=True, exist_ok=True)
        (jdir / "state.json").write_text(json.dumps(state))
        for args in VERBS:
            r = place.invoke(monkeypatch, *args, JOB_NAME="alpha")
            _no_internal_error(_as_process(r), args)
            assert _tree(decoy) == before, f"{args} with {state} changed {decoy}"

    case()


def _as_process(r):
    """An in-process result in the shape of a finished process's."""
    return subprocess.CompletedProcess([], int(r.exit_code), r.stdout, r.stderr)


# ---- 2. two runs of one name at the same instant --------------------------------------------------------

RACER = """
import os, sys, time
from pathlib import Path
go = Path(sys.argv[1])
while not go.exists():
    time.sleep(0.001)
from fsdpctl.entry import main
sys.argv = ["fsdpctl", "job", "run", "-d"]
main()
"""


def test_two_runs_of_one_name_at_the_same_instant_start_exactly_one(place, tmp_path):
    """Two `job run -d` processes released by one file (both imported and waiting): exactly one
    exits 0, the other exits 2 with one line; the place runs one job of that name."""
    go = tmp_path / "go"
    env = place.env(JOB_NAME="race")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(go)],
            env=env,
            cwd=env["FSDPCTL_HOME"].rsplit("/", 1)[0],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        import time

        time.sleep(2)  # both past their imports (a fixed head start, not a wait on an outcome)
        go.touch()
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    refused = outs[[p.returncode for p in procs].index(2)][1]
    assert len([x for x in refused.splitlines() if x.startswith("error:")]) == 1, refused
    assert len(until("the one job", lambda: place.outside("race"))) == 1
    stop = place.run("job", "stop", "race", JOB_NAME="race")
    assert stop.returncode == 0, stop.stderr


# ---- 3. submit, then record, or cancel ---------------------------------------------------------------------


def _fail_recording(monkeypatch) -> None:
    """The home gives out right after the place accepted the run (ENOSPC at the state's write)."""
    from fsdpctl.job import submit

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(submit, "record_run", full)


def test_a_run_that_cannot_be_recorded_is_cancelled(place, monkeypatch):
    """The run is submitted, its recording fails: the line says so and that it was cancelled (exit
    1), and the place runs nothing of it once the cancel took effect."""
    _fail_recording(monkeypatch)
    r = place.invoke(monkeypatch, "job", "run", "-d", JOB_NAME="lost")
    assert r.exit_code == 1, r.output
    assert "could not be recorded here (No space left on device): cancelled" in r.stderr, r.stderr
    until("the cancelled run gone", lambda: not place.outside("lost"), timeout=180)


def test_a_run_whose_cancel_fails_too_names_how_to_cancel_it(place, monkeypatch):
    """Recording and cancelling both fail: the line names the outside job and the command that
    cancels it; that command cancels it."""
    from fsdpctl import targets

    _fail_recording(monkeypatch)
    cls = targets.resolve(targets.target(place.name).backend)

    def refuse(self, submitted):
        from fsdpctl.errors import FsdpctlError

        raise FsdpctlError("the place did not answer")

    real_cancel = cls.cancel
    monkeypatch.setattr(cls, "cancel", refuse)
    r = place.invoke(monkeypatch, "job", "run", "-d", JOB_NAME="stray")
    assert r.exit_code == 1, r.output
    assert "cancelling it failed too (the place did not answer): it runs unrecorded" in r.stderr
    assert "hint: cancel it yourself: " in r.stderr
    assert place.outside("stray")
    monkeypatch.setattr(cls, "cancel", real_cancel)  # what the named command does
    _cancel_by_hand(place, r.stderr.split("cancel it yourself: ", 1)[1].strip())
    until("the stray run gone", lambda: not place.outside("stray"), timeout=180)


def _cancel_by_hand(place, command: str) -> None:
    if command.startswith("kubectl"):  # no kubectl here: the same DELETE through the adapter
        from fsdpctl.adapters.kube import Kube

        k = Kube.connect(kubeconfig=place.environ["KUBECONFIG"])
        k.delete("kubeflow.org/v1", "PyTorchJob", "stray", "fsdp", propagation="Foreground")
        return
    subprocess.run(command, shell=True, env=place.env(), check=True, timeout=60)


# ---- 5. read verbs on a read-only and a full home ----------------------------------------------------------


def _mount_tmpfs(where: Path, size: str = "256m") -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small home needs root")
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)


def _answers(place) -> list[tuple[int, str]]:
    out = []
    for args in READ_VERBS:
        r = place.run(*args, JOB_NAME="alpha")
        _no_internal_error(r, args)
        out.append((r.returncode, _stable(r.stdout)))
    return out


def _stable(text: str) -> str:
    """An answer without what changes between two asks (ages, ETA)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return "\n".join(x for x in text.splitlines() if "age" not in x and "ago" not in x)
    drop = {"age_s", "last_progress_s", "eta_s"}

    def clean(v):
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if k not in drop}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(doc), sort_keys=True)


def test_read_verbs_answer_alike_on_a_read_only_and_a_full_home(place):
    """A home (a small tmpfs) with an ended job; every read verb's exit code and answer, then the
    same with the home mounted read-only, then with it full (ENOSPC on any write)."""
    _mount_tmpfs(place.home)
    try:
        place.ended("alpha")
        writable = _answers(place)
        subprocess.run(["mount", "-o", "remount,ro", str(place.home)], check=True)
        assert _answers(place) == writable, "read-only home"
        subprocess.run(["mount", "-o", "remount,rw", str(place.home)], check=True)
        filler = place.home / "filler"
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
            except OSError as e:
                assert e.errno == errno.ENOSPC
        assert _answers(place) == writable, "full home"
    finally:
        subprocess.run(["umount", "-l", str(place.home)], check=False)


# ---- 6. modes under umask 000 ---------------------------------------------------------------------

# what keeps Kubernetes' own modes on purpose (the local backend plays a kubelet): a pod's emptyDirs
# (0777), its /tmp (1777) and the claims' directories (volumes/)
POD_VOLUMES = ("nodes", "hosts")


def test_nothing_fsdpctl_makes_is_world_writable_under_umask_000(place):
    """A run started with umask 000: the job's directory, state, lock, spec, logs and run record in
    the home, and on Slurm the run's directory and batch script, are not writable by others."""
    env = place.env(JOB_NAME="modes")
    r = subprocess.run(
        [sys.executable, "-m", "fsdpctl.cli", "job", "run", "-d"],
        env=env,
        cwd=env["FSDPCTL_HOME"].rsplit("/", 1)[0],
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=lambda: os.umask(0),
    )
    assert r.returncode == 0, r.stderr
    place.run("job", "wait", "modes", "--timeout", "240", timeout=300, JOB_NAME="modes")
    roots = [place.home / "jobs" / "modes", place.home / "records"]
    shared = env.get("FSDPCTL_SHARED_VOLUME_PATH")
    if shared and Path(shared, "fsdpctl").exists():
        roots.append(Path(shared) / "fsdpctl")
    loose = []
    for root in roots:
        for p in [root, *root.rglob("*")]:
            rel = p.relative_to(root).parts
            if rel and rel[0] in POD_VOLUMES or p.is_symlink():
                continue
            if os.lstat(p).st_mode & stat.S_IWOTH:
                loose.append(f"{p} {oct(os.lstat(p).st_mode)}")
    assert not loose, loose


# ---- 4. unknown is not an outcome -------------------------------------------------------------------

# what a scheduler's or an API's read may answer instead of the job (class 4), per place; a place
# with no such answers is declared here, not skipped: the local backend's only "scheduler" is its own
# supervisor's state and the process table, which class 1 (a tampered state) covers
SCONTROL_LIES = {
    "nothing, exit 0": ("", 0),
    "garbage": ("!!! %%% not a record\n", 0),
    "another job's record": ("JobId={other} JobName=someone JobState=RUNNING Restarts=0\n", 0),
    "a negative id": ("JobId=-1 JobName=alpha JobState=RUNNING Restarts=0\n", 0),
    "a 30-digit id": ("JobId=" + "9" * 30 + " JobName=alpha JobState=RUNNING Restarts=0\n", 0),
    "Restarts=abc": ("JobId={id} JobName=alpha JobState=RUNNING Restarts=abc\n", 0),
    "no JobState": ("JobId={id} JobName=alpha Restarts=0\n", 0),
    "another name": ("JobId={id} JobName=somebodys JobState=COMPLETED Restarts=0\n", 0),
    "exit 1, nothing said": ("", 1),
}
SBATCH_LIES = {"-5": "-5", "30 digits": "9" * 30, "words": "Submitted batch job", "nothing": ""}
API_LIES = {
    "503 from a proxy": (503, b"upstream connect error or disconnect/reset before headers"),
    "an empty 200": (200, b""),
    "an HTML 200": (200, b"<html><body>login</body></html>"),
    "a 500 with an empty object": (500, b"{}"),
}
DECLARED_ABSENT = {"local": "no scheduler answers: its supervisor's state is class 1's"}


def _lying(place, tmp_path: Path, program: str, body: str) -> dict[str, str]:
    """A PATH whose `program` is a wrapper around the real one (as a broken site wrapper or a
    restarting controller would answer)."""
    import shutil

    real = shutil.which(program)
    d = tmp_path / f"lying-{program}"
    d.mkdir(exist_ok=True)
    (d / program).write_text(f"#!/bin/bash\n{body.replace('REAL', real)}\n")
    (d / program).chmod(0o755)
    return {"PATH": f"{d}:{os.environ['PATH']}"}


def test_an_answer_that_says_nothing_of_the_job_is_unknown_never_an_end(place, tmp_path):
    """Each answer of SCONTROL_LIES (slurm) or API_LIES (eks) about an ended job recorded here:
    `job status` says Unknown with what was asked (or one line, exit 1), never Failed;
    `job wait --timeout` waits it out (exit 5); `cleanup` keeps the job's files and its place's job;
    `job list` still lists it. Then the place answers again and all is as before."""
    if place.name in DECLARED_ABSENT:
        assert place.name == "local"  # a declared cell: the reason is DECLARED_ABSENT's
        return
    place.ended("alpha")
    kept = _tree(place.home / "jobs" / "alpha")
    for lie, env in _lies(place, tmp_path):
        status = _with(place, env, "job", "status", "alpha", "-o", "json")
        _no_internal_error(status, (lie, "status"))
        if status.returncode == 0:
            report = json.loads(status.stdout)
            assert report["phase"] == "Unknown" and report["reason"], (lie, report)
        else:
            assert status.returncode == 1 and len(status.stderr.splitlines()) <= 2, (lie, status)
        waited = _with(place, env, "job", "wait", "alpha", "--timeout", "2")
        assert waited.returncode == 5, (lie, waited.stdout + waited.stderr)
        clean = _with(place, env, "cleanup", "alpha", "--yes", "--checkpoints")
        _no_internal_error(clean, (lie, "cleanup"))
        assert _tree(place.home / "jobs" / "alpha").keys() >= kept.keys(), lie
        assert place.outside("alpha") or place.name != "eks", lie
        listed = _with(place, env, "job", "list", "-o", "json")
        _no_internal_error(listed, (lie, "list"))
    assert place.status("alpha")["phase"] == "Succeeded"


def _lies(place, tmp_path: Path):
    if place.name == "slurm":
        st = json.loads((place.home / "jobs" / "alpha" / "state.json").read_text())
        for lie, (said, code) in SCONTROL_LIES.items():
            text = said.format(id=st["slurm_job"], other=st["slurm_job"] + 1000)
            body = (
                'if [ "$1 $2 $3" = "-o show job" ]; then\n'
                f'  printf %s {_shell_quote(text)}; exit {code}\nfi\nexec REAL "$@"'
            )
            yield lie, _lying(place, tmp_path, "scontrol", body)
    else:
        for lie, answer in API_LIES.items():
            place.peer.api.broken["pytorchjobs"] = answer
            yield lie, {}
        place.peer.api.broken.clear()


def _shell_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _with(place, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    from conftest import fsdpctl_process

    place.home.mkdir(parents=True, exist_ok=True)
    return fsdpctl_process(*args, env={**place.env(JOB_NAME="alpha"), **env}, timeout=120)


def test_a_submit_whose_id_is_not_one_is_recorded_by_its_token(place, tmp_path):
    """sbatch submits, then prints something that is not a job id (SBATCH_LIES): its answer is not
    believed; this user's job whose comment carries the run's owner token (squeue --me, %k) is
    recorded and the line says so (exit 0), and the next `job run` refuses a second copy beside it
    (issue 42: submit exactly once). (eks: the API's create answers with the object or an error
    status, which the Kubernetes client checks; local: no outside id.)"""
    if place.name != "slurm":
        return  # declared: an id to shape exists on Slurm only
    from conftest import fsdpctl_process

    place.home.mkdir(parents=True, exist_ok=True)
    for n, (lie, text) in enumerate(SBATCH_LIES.items()):
        job = f"lie{n}"
        body = f'REAL "$@" >/dev/null || exit $?\nprintf "%s\\n" {_shell_quote(text)}'
        env = {**place.env(JOB_NAME=job), **_lying(place, tmp_path, "sbatch", body)}
        r = fsdpctl_process("job", "run", "-d", env=env, timeout=120)
        said = r.stdout + r.stderr
        assert r.returncode == 0 and "found by the run's token" in said, (lie, said)
        assert (place.home / "jobs" / job / "state.json").exists(), lie
        assert len(place.outside(job)) == 1, lie
        again = place.run("job", "run", "-d", JOB_NAME=job)
        assert again.returncode == 2 and len(place.outside(job)) == 1, (lie, again.stderr)
        assert place.run("job", "stop", job, JOB_NAME=job).returncode == 0, lie
        until(f"{lie}: the recorded job stopped", lambda job=job: not place.outside(job))


# ---- the record verbs read every backend's runs alike ----------------------------------------------------


def test_history_describe_and_list_read_a_run_as_on_every_backend(place):
    """A run that trained to its end, then `job history`, `job describe` and `job list` as a new
    user types them (no --backend: the job's state says where it runs): history says it trained
    from the start to its end, describe has its trainer's start line (the record learnt it from
    the run's log, where this machine reads it: on eks the leader pod's), list shows it with its
    backend."""
    place.ended("alpha")
    history = place.run("job", "history", "alpha", "-o", "json", JOB_NAME="alpha")
    assert history.returncode == 0, history.stderr
    [row] = json.loads(history.stdout)
    listed = place.run("job", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    [shown] = [r for r in json.loads(listed.stdout) if r["job"] == "alpha"]
    assert (shown["backend"], shown["phase"]) == (place.name, "Succeeded")
    described = place.run("job", "describe", "alpha", "-o", "json", JOB_NAME="alpha")
    assert described.returncode == 0, described.stderr
    rec = json.loads(described.stdout)
    assert row["from"] == "afresh (step 0)" and row["outcome"] == "Succeeded at step 6", row
    assert rec["trainer"]["start_step"] == 0 and rec["trainer"]["torch"], rec.get("trainer")
    # a user whose settings now name another shared file system: the run is still read where it ran
    # (its record says), and nothing is written there
    elsewhere = place.run(
        "job", "history", "alpha", "-o", "json", JOB_NAME="alpha", SHARED_VOLUME_PATH="/elsewhere"
    )
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert json.loads(elsewhere.stdout) == [row]


def test_a_node_the_job_does_not_have_is_refused(place):
    """`job logs --node N` for an N outside the job's nodes (99, -1), and --all with --node: one
    line naming the range or the clash, exit 2, on every backend (it printed nothing, exit 0)."""
    place.ended("alpha")
    for args in (["--node", "99"], ["--node", "-1"], ["--node", "1"], ["--all", "--node", "0"]):
        r = place.run("job", "logs", "alpha", *args, JOB_NAME="alpha")
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert len([x for x in r.stderr.splitlines() if x.startswith("error:")]) == 1, r.stderr
        assert "--node" in r.stderr and "error: internal" not in r.stderr
    ok = place.run("job", "logs", "alpha", "--node", "0", JOB_NAME="alpha")
    assert ok.returncode == 0, ok.stderr


def test_replace_stops_the_running_run_and_starts_exactly_one(place):
    """`job run -d --replace` of a job that is running, three times in a row: each exits 0 having
    waited for the old run to end (its stop checkpoint) and for its processes, its lock, to be
    gone (it lost that race 1 time in 3), and the place runs exactly one run of the job after each."""
    first = place.run("job", "run", "-d", JOB_NAME="busy", MAX_STEPS="100000")
    assert first.returncode == 0, first.stderr
    until("the first run", lambda: place.outside("busy"))
    for n in range(3):
        r = place.run(
            "job", "run", "-d", "--replace", JOB_NAME="busy", MAX_STEPS="100000", timeout=400
        )
        assert r.returncode == 0, (n, r.stdout + r.stderr)
        assert len(until("one run", lambda: place.outside("busy"))) == 1, n
    stop = place.run("job", "stop", "busy", JOB_NAME="busy", timeout=400)
    assert stop.returncode == 0, stop.stderr


def test_logs_tail_n_prints_n_lines_whatever_is_hidden(place):
    """`job logs --tail N` prints N lines (the trainer's event lines it shows as human lines, or not
    at all, no longer count), and `--tail N --trainer-only` N of the trainer's own (it filtered after
    the tail: --tail 3 --trainer-only printed nothing)."""
    place.ended("alpha")
    for args in (["--tail", "3"], ["--tail", "3", "--trainer-only"], ["--tail", "1"]):
        r = place.run("job", "logs", "alpha", *args, JOB_NAME="alpha")
        assert r.returncode == 0, r.stderr
        assert len(r.stdout.splitlines()) == int(args[1]), (args, r.stdout)
    every = place.run("job", "logs", "alpha", "--tail", "-1", JOB_NAME="alpha").stdout.splitlines()
    last = place.run("job", "logs", "alpha", "--tail", "5", JOB_NAME="alpha").stdout.splitlines()
    assert last == every[-5:]
