"""Local job control as careful as a kubelet's (issue 15): a lock per job, process identity beyond
the PID, a dead supervisor's orphans found and stopped, names that cannot walk out of FSDPCTL_HOME,
and list/cleanup that survive a stray file. Real processes and real signals throughout; most runs
are a planted job whose launchers are short Python programs carrying the job's mark (the supervisor
is the real one), so only one test trains.

Sources: proc(5) for /proc/<pid>/stat (field 22, starttime, in clock ticks after boot; field 2 the
command name in parentheses, which may itself hold ')' and spaces), /proc/<pid>/environ and
/proc/sys/kernel/random/boot_id; flock(2) (locks belong to the open file description, are released
when every descriptor of it is closed, so at a holder's death however it dies, and two open()s of
one file conflict even within a process); pidfd_open(2) and pidfd_send_signal(2) (a pidfd refers to
one process, and signalling it after that process ended fails with ESRCH rather than reaching a
process that reused its PID, which is how systemd and containerd avoid the race); the kubelet's stop
sequence (SIGTERM to the container's first process, SIGKILL to every process of it after
terminationGracePeriodSeconds)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsdpctl import files
from fsdpctl.adapters import netns
from fsdpctl.backends.local import engine as local
from fsdpctl.backends.local.report import job_report
from fsdpctl.errors import BadInput
from fsdpctl.job import lock

SLEEPER = "import time; time.sleep(120)"
# a launcher that starts a "worker" in a session of its own (as torchrun does) and sleeps
WITH_WORKER = (
    "import subprocess, sys, time;"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True);"
    "time.sleep(120)"
)


def fake_job(name: str = "fsdp", code: str = SLEEPER, replicas: int = 2, grace: int = 5) -> dict:
    """A PyTorchJob as render.render_job shapes it, whose container is a short Python program
    instead of torchrun: the real supervisor runs it, one launcher per replica, with the pod's mark.
    """
    # the endpoint argument as the manifest has it (rewritten per node; a Python program ignores it)
    command = ["python", "-c", code, f"--rdzv-endpoint={name}-worker-0:29400"]
    container = {"command": command, "env": [], "volumeMounts": []}
    return {
        "metadata": {"name": name},
        "spec": {
            "elasticPolicy": {"rdzvId": f"{name}-run", "rdzvBackend": "c10d", "maxRestarts": 0},
            "nprocPerNode": "1",
            "runPolicy": {"backoffLimit": 0},
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": replicas,
                    "restartPolicy": "ExitCode",
                    "template": {
                        "spec": {
                            "terminationGracePeriodSeconds": grace,
                            "volumes": [],
                            "containers": [container],
                        }
                    },
                }
            },
        },
    }


@pytest.fixture
def home(cli, monkeypatch):
    """The isolated FSDPCTL_HOME of the `cli` fixture, loopback nodes; every process of the test's
    jobs is SIGKILLed at the end, whatever the test left."""
    monkeypatch.setenv("FSDPCTL_LOCAL_NETNS", "0")
    yield cli
    jobs = cli.home / "jobs"
    for jdir in jobs.iterdir() if jobs.is_dir() else []:
        if files.JOB_NAME.fullmatch(jdir.name):
            for pid in local.job_processes(jdir.name):
                local.signal_marked(pid, signal.SIGKILL, local.job_mark(jdir.name))


def _until(what, timeout: float = 30, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)
    return value


def _running(name: str, replicas: int) -> dict:
    """The state once the supervisor has recorded every launcher with its identity."""

    def ready():
        s = local.read_state(local.job_dir(name))
        ok = s and s["phase"] == "Running" and len(s["launchers"]) == replicas
        return s if ok and local.launchers_alive(s) == replicas else None

    try:
        return _until(ready)
    except AssertionError:
        jdir = local.job_dir(name)
        logs = sorted(jdir.glob("logs/*/supervisor.log"))
        said = logs[-1].read_text()[-2000:] if logs else "no supervisor.log"
        raise AssertionError(
            f"not running: state {local.read_state(jdir)}; supervisor.log: {said}"
        ) from None


def _alive(pid: int) -> bool:
    return local.start_ticks(pid) is not None


def _one_line(text: str) -> bool:
    """One error line (a `hint:` line may follow, as for every fsdpctl error; rich may wrap a long
    path at the test's 80 columns) and no traceback."""
    lines = text.strip().splitlines()
    return sum(x.startswith("error:") for x in lines) == 1 and "Traceback" not in text


# ---- identity ---------------------------------------------------------------------------------------------


def test_start_time_is_field_22_even_when_the_name_holds_a_parenthesis(tmp_path):
    """A program named `a) b (c` (/proc/<pid>/stat shows `(a) b (c)`: a naive split shifts every
    field): its start time read after the last ')' agrees with procps (`ps -o etimes`, seconds since
    it started, from the same field: /proc/uptime minus ticks / SC_CLK_TCK)."""
    odd = tmp_path / "a) b (c"
    shutil.copy("/bin/sleep", odd)

    def uptime() -> float:
        return float(Path("/proc/uptime").read_text().split()[0])

    before = uptime()
    proc = subprocess.Popen([str(odd), "30"])
    try:
        _until(lambda: "(a) b (c)" in Path(f"/proc/{proc.pid}/stat").read_text())
        ticks = local.start_ticks(proc.pid)
        etimes = int(subprocess.check_output(["ps", "-o", "etimes=", "-p", str(proc.pid)]))
        now = uptime()
        started = ticks / os.sysconf("SC_CLK_TCK")  # seconds since boot, as /proc/uptime counts
        assert before - 0.5 <= started <= now + 0.5  # the process started while we watched
        # procps: etimes = uptime - start ticks / SC_CLK_TCK; some procps builds count from the
        # wall clock and btime instead, which is years off where the clock was set (not since boot)
        if 0 <= etimes <= now:
            assert abs((now - started) - etimes) <= 2.5
        ident = local.identity(proc.pid)
        assert local.same_process(ident)
        assert not local.same_process({**ident, "start": ident["start"] + 1})
        assert not local.same_process({**ident, "boot": "0" * 36})
    finally:
        proc.kill()
        proc.wait()
    assert not local.same_process(ident)  # reaped: gone, whatever takes its PID next


def test_a_zombie_is_not_alive_and_is_not_signalled():
    """A child that exited but is not reaped keeps its PID (state Z in proc(5)): not the live
    process."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    _until(lambda: Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z")
    assert local.start_ticks(proc.pid) is None and not local.same_process(local.identity(proc.pid))
    proc.wait()


# ---- a stale state whose PID now names another process ----------------------------------------------------


def _plant(home_dir: Path, supervisor: dict, launchers: list[dict], name: str = "fsdp") -> None:
    jdir = home_dir / "jobs" / name
    (jdir / "logs" / "r").mkdir(parents=True)
    state = {
        "job": name,
        "run_id": "r",
        "phase": "Running",
        "created": time.time(),
        "replicas": len(launchers),
        "log_dir": str(jdir / "logs" / "r"),
        "checkpoint_dir": None,
        "supervisor_pid": supervisor.get("pid"),
        "launchers": launchers,
        "stop_requested": False,
    }
    if "start" in supervisor:
        state["supervisor"] = supervisor
    (jdir / "state.json").write_text(json.dumps(state))


@pytest.mark.parametrize(
    "how",
    [
        "start time off by one",
        "another boot",
        "same identity, no mark",
        "PID only (an older state)",
    ],
)
def test_job_stop_never_signals_an_unrelated_process_that_took_the_pid(home, how):
    """A live `sleep` (not fsdpctl's) holds the PID a stale state.json names as supervisor and
    launcher: `job stop` and `job status` leave it running. With a start time or boot id that
    differs it is another process; with the very identity it lacks the job's mark, so it is not the
    job's either (issue 29: a process is the job's only when it proves it): the job is Failed,
    nothing to stop. With a PID alone (a state of an older fsdpctl) nothing is signalled (one line,
    exit 1)."""
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        ident = _until(lambda: local.identity(sleeper.pid))
        planted = {
            "start time off by one": {**ident, "start": ident["start"] - 1},
            "another boot": {**ident, "boot": "00000000-0000-0000-0000-000000000000"},
            "same identity, no mark": ident,
            "PID only (an older state)": {"pid": sleeper.pid},
        }[how]
        _plant(home.home, planted, [{"node": 0, **planted}])
        stopped = home("job", "stop", "fsdp")
        status = home("job", "status", "fsdp")
        time.sleep(0.2)
        assert sleeper.poll() is None, "the unrelated process was signalled"
        if how != "PID only (an older state)":
            assert stopped.exit_code == 0 and "nothing to stop" in stopped.said, stopped.output
            assert "Failed" in status.said
        else:
            assert stopped.exit_code == 1 and _one_line(stopped.stderr), stopped.output
            assert "nothing was signalled" in stopped.said
    finally:
        sleeper.kill()
        sleeper.wait()


def test_ctrl_c_on_a_job_whose_supervisor_is_not_the_one_recorded_is_one_line(home):
    """Ctrl-C while following (`LocalBackend.interrupt`) stops the job as `job stop` does: where the
    state's supervisor is a live process known by its PID alone (an older state), nothing is
    signalled and the error is fsdpctl's own one line, not an unexpected exception; where it names a
    live process by its full identity but that process lacks the job's mark, the job is Failed and
    nothing is signalled either."""
    from fsdpctl.backends.local.backend import LocalBackend
    from fsdpctl.errors import FsdpctlError
    from fsdpctl.settings import load

    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        ident = _until(lambda: local.identity(sleeper.pid))
        _plant(home.home, {"pid": sleeper.pid}, [{"node": 0, "pid": sleeper.pid}])
        with pytest.raises(FsdpctlError, match="nothing was signalled") as raised:
            LocalBackend(load()).interrupt("fsdp")
        assert raised.value.hint and "job status fsdp" in raised.value.hint
        shutil.rmtree(home.home / "jobs")
        _plant(home.home, ident, [{"node": 0, **ident}])
        assert LocalBackend(load()).interrupt("fsdp")["phase"] == "Failed"
        assert sleeper.poll() is None, "the unrelated process was signalled"
    finally:
        sleeper.kill()
        sleeper.wait()


# ---- one run per job: the lock ----------------------------------------------------------------------------


def _race_in_threads(job: dict) -> list[str]:
    barrier = threading.Barrier(2)
    results: list[str] = []

    def one():
        barrier.wait()
        try:
            with lock.held(local.job_dir(job["metadata"]["name"])):  # as the job core holds it
                local.start(job, secret_env={})
            results.append("started")
        except local.JobBusy:
            results.append("busy")

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return sorted(results)


@pytest.mark.slow  # real supervisors racing: 6-7 s each, kept out of the fast lane
def test_two_runs_of_one_job_at_the_same_moment_start_exactly_one(home):
    """Two starts released by one barrier, 8 times, each holding the job's lock as the job core
    does (each opens the lock file itself, so flock(2) decides between them as between two
    processes): exactly one supervisor each time, the other refused once it gets the lock and sees
    the run; stopping it leaves no process of the job, and the next round starts clean."""
    job = fake_job(replicas=1, grace=2)
    for _ in range(8):
        assert _race_in_threads(job) == ["busy", "started"]
        state = _running("fsdp", 1)
        assert local.same_process(state["supervisor"])
        assert len(local.job_processes("fsdp")) == 2  # one supervisor, its one launcher
        local.stop("fsdp")
        assert local.wait("fsdp", timeout=30)["phase"] == "Stopped"
        _until(lambda: not local.job_processes("fsdp"))


RACER = """
import sys, time
from pathlib import Path
from fsdpctl.backends.local import engine as local
from fsdpctl.job import lock
job = {job!r}
go = Path(sys.argv[1])
while not go.exists():
    time.sleep(0.001)
try:
    with lock.held(local.job_dir(job["metadata"]["name"])):
        local.start(job, secret_env={{}})
except local.JobBusy as e:
    print(f"error: {{e}}")
    sys.exit(2)
"""


@pytest.mark.slow  # real supervisors racing: 6-7 s each, kept out of the fast lane
def test_two_job_run_processes_released_together_start_exactly_one(home, tmp_path):
    """The same race between two processes (as two terminals): both wait on a file, which the test
    creates; each round exactly one exits 0 and the other exits 2 with one line."""
    code = RACER.format(job=fake_job(replicas=1, grace=2))
    for n in range(3):
        go = tmp_path / f"go-{n}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(go)],
                stdout=subprocess.PIPE,
                text=True,
                env=home.env(),
            )
            for _ in range(2)
        ]
        time.sleep(1.5)  # both imported and polling
        go.touch()
        outs = [p.communicate(timeout=60)[0] for p in procs]
        codes = sorted(p.returncode for p in procs)
        assert codes == [0, 2], outs
        refused = outs[[p.returncode for p in procs].index(2)]
        assert _one_line(refused) and "fsdp" in refused
        _running("fsdp", 1)
        local.stop("fsdp")
        local.wait("fsdp", timeout=30)
        _until(lambda: not local.job_processes("fsdp"))


# ---- a SIGKILLed supervisor ------------------------------------------------------------------------------


def test_a_killed_supervisors_launchers_are_reported_refused_and_stopped(home):
    """SIGKILL to the supervisor (an OOM kill) leaves its two launchers and their workers (sessions
    of their own) running: `job status` says so (not "Failed with 2/2 running"), `job run` is
    refused (exit 2, one line) while any of them lives, `job stop` ends every one of them (SIGTERM,
    then SIGKILL) and records Stopped; then `job run` is accepted again."""
    state = local.start(fake_job(code=WITH_WORKER, replicas=2, grace=3), secret_env={})
    state = _running("fsdp", 2)
    _until(lambda: len(local.job_processes("fsdp")) == 5)  # supervisor, 2 launchers, 2 workers
    os.kill(state["supervisor"]["pid"], signal.SIGKILL)
    _until(lambda: not local.same_process(state["supervisor"]))

    status = home("job", "status", "fsdp")
    assert status.exit_code == 0, status.output
    assert "Orphaned" in status.said
    assert "supervisor gone; 2 launchers still running (orphaned)" in status.said
    listed = home("job", "list", "-o", "json")
    assert json.loads(listed.stdout)[0]["phase"] == "Orphaned"

    with pytest.raises(local.JobBusy, match="still has 4 processes running"):
        local.start(fake_job(code=WITH_WORKER), secret_env={})
    assert home("cleanup", "--yes").said.count("removed") == 0  # a live job's files are kept

    stopped = home("job", "stop", "fsdp")
    assert stopped.exit_code == 0 and "Stopped" in stopped.said, stopped.output
    assert local.job_processes("fsdp") == []
    assert local.read_state(local.job_dir("fsdp"))["phase"] == "Stopped"
    again = home("job", "stop", "fsdp")
    assert again.exit_code == 0 and "nothing to stop" in again.said  # idempotent

    local.start(fake_job(), secret_env={})
    _running("fsdp", 2)
    local.stop("fsdp")
    assert local.wait("fsdp", timeout=30)["phase"] == "Stopped"


@pytest.mark.skipif(
    not netns.available()[0], reason="no network namespace per node here (root, iproute2)"
)
def test_job_stop_of_orphans_also_removes_their_network_namespaces(home, monkeypatch):
    """With a network namespace per node, a SIGKILLed supervisor also leaves its namespaces and
    bridge (its teardown never ran), and the next `job run` of the job would fail on `ip netns add`
    (File exists): `job stop` removes them after the processes. A job name of this test's own:
    namespaces are global."""
    monkeypatch.delenv("FSDPCTL_LOCAL_NETNS")
    name = f"orph-{os.getpid()}"
    local.start(fake_job(name=name, replicas=2, grace=2), secret_env={})
    state = _running(name, 2)
    net = netns.Network(state["net_index"], name, 2)
    assert netns.exists(net)
    os.kill(state["supervisor"]["pid"], signal.SIGKILL)
    _until(lambda: not local.same_process(state["supervisor"]))
    assert local.effective_phase(local.read_state(local.job_dir(name))) == "Orphaned"
    local.stop(name)
    assert local.job_processes(name) == [] and not netns.exists(net)


def test_job_run_through_the_cli_is_refused_while_an_orphan_lives(home):
    """A process carrying the job's mark but no state that proves it the job's (planted: the
    variable is all it has): `job run` exits 2 with one line naming the job, the pids and that
    fsdpctl signals none of them (they are not proven its own, so `job stop` would not end them),
    and starts nothing."""
    env = {
        **os.environ,
        local.POD_MARK: "fsdp/old-run/node-0",
        local.JOB_MARK: str(local.job_dir("fsdp")),
    }
    orphan = subprocess.Popen([sys.executable, "-c", SLEEPER], env=env, start_new_session=True)
    try:
        _until(lambda: local.job_processes("fsdp") == [orphan.pid])
        r = home("job", "run", "-d")
        assert r.exit_code == 2 and _one_line(r.stderr), r.output
        assert f"(pids {orphan.pid})" in r.said and "signals none of them" in r.said
        assert local.job_processes("fsdp") == [orphan.pid]
        assert not (home.home / "jobs" / "fsdp" / "state.json").exists()
    finally:
        orphan.kill()
        orphan.wait()


def test_a_job_of_the_same_name_under_another_home_is_not_this_ones(home, tmp_path):
    """Processes are a job's by its directory (FSDPCTL_JOB), not its name: another FSDPCTL_HOME's
    `fsdp` (another user, another test worker) is neither counted, nor refused, nor stopped from
    this one."""
    other = tmp_path / "other-home" / "jobs" / "fsdp"
    env = {**os.environ, local.POD_MARK: "fsdp/r/node-0", local.JOB_MARK: str(other)}
    theirs = subprocess.Popen([sys.executable, "-c", SLEEPER], env=env)
    try:
        _until(lambda: any(str(other).encode() in v for v in local.environ_of(theirs.pid)))
        assert local.job_processes("fsdp") == []
        _plant(home.home, {"pid": theirs.pid, "start": 1, "boot": local.boot_id()}, [{"node": 0}])
        assert home("job", "stop", "fsdp").exit_code == 0
        assert theirs.poll() is None
    finally:
        theirs.kill()
        theirs.wait()


# ---- list and cleanup: stray files, damaged states, live jobs ---------------------------------------------


def _ended(home_dir: Path, name: str) -> None:
    jdir = home_dir / "jobs" / name
    (jdir / "logs" / "r").mkdir(parents=True)
    (jdir / "logs" / "r" / "node-0.log").write_text("")
    state = {
        "job": name,
        "run_id": "r",
        "phase": "Succeeded",
        "created": time.time(),
        "replicas": 1,
        "log_dir": str(jdir / "logs" / "r"),
        "checkpoint_dir": None,
        "launchers": [],
    }
    (jdir / "state.json").write_text(json.dumps(state))


DAMAGED = {
    "not-json": "{phase: Running",
    "a-list": "[]",
    "no-phase": json.dumps({"job": "no-phase", "run_id": "r"}),
    "other-name": None,  # a valid state naming another job: cleanup would delete by that name
    "binary": b"\xff\xfe\x00",
}


def test_list_and_cleanup_skip_stray_files_and_damaged_states_and_go_on(home):
    """Under jobs/: a stray file, five damaged state.json files, and two ended jobs. `job list`
    lists the two with one warning line per skipped path; `cleanup` removes the two jobs' files and
    nothing of the others; `job status` of a damaged one is one line naming the file, exit 2."""
    jobs = home.home / "jobs"
    _ended(home.home, "good-a")
    _ended(home.home, "good-b")
    jobs.joinpath("notes.txt").write_text("stray")
    for name, text in DAMAGED.items():
        (jobs / name).mkdir()
        if text is None:
            _ended(home.home, "tmp-x")
            (jobs / "tmp-x" / "state.json").rename(jobs / name / "state.json")
            shutil.rmtree(jobs / "tmp-x")
        elif isinstance(text, bytes):
            (jobs / name / "state.json").write_bytes(text)
        else:
            (jobs / name / "state.json").write_text(text)

    listed = home("job", "list", "-o", "json")
    assert listed.exit_code == 0, listed.output
    assert sorted(r["job"] for r in json.loads(listed.stdout)) == ["good-a", "good-b"]
    warnings = [line for line in listed.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 + len(DAMAGED), listed.stderr
    for name in [*DAMAGED, "notes.txt"]:
        assert any(str(jobs / name) in w for w in warnings), (name, warnings)

    cleaned = home("cleanup", "--yes")
    assert cleaned.exit_code == 0, cleaned.output
    assert not (jobs / "good-a" / "state.json").exists() and not (jobs / "good-b" / "logs").exists()
    for name in DAMAGED:
        assert (jobs / name / "state.json").exists()
    assert (jobs / "notes.txt").exists()

    status = home("job", "status", "not-json")
    assert status.exit_code == 2 and _one_line(status.stderr), status.output
    assert str(jobs / "not-json" / "state.json") in status.said


def test_cleanup_never_deletes_a_live_jobs_files(home):
    """An ended state is not enough: a job whose lock is held (a `job run` starting it: said, with
    its holder) and one with a process carrying its mark both keep every file, in a dry run and a
    real one; an ended job next to them is cleaned."""
    for name in ("starting", "orphaned", "ended"):
        _ended(home.home, name)
    fd = os.open(home.home / "jobs" / "starting" / lock.NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    env = {
        **os.environ,
        local.POD_MARK: "orphaned/r/node-0",
        local.JOB_MARK: str(local.job_dir("orphaned")),
    }
    orphan = subprocess.Popen([sys.executable, "-c", SLEEPER], env=env)
    try:
        _until(lambda: local.job_processes("orphaned"))
        for args in (["cleanup", "--dry-run"], ["cleanup", "--checkpoints", "--yes"]):
            r = home(*args)
            assert r.exit_code == 0, r.output
            assert "ended" in r.stdout and "starting" not in r.stdout and "orphaned" not in r.stdout
            assert "job starting is busy" in r.stderr  # said why it was kept
        for name in ("starting", "orphaned"):
            assert (home.home / "jobs" / name / "state.json").exists()
        assert not (home.home / "jobs" / "ended" / "state.json").exists()
    finally:
        os.close(fd)
        orphan.kill()
        orphan.wait()


# ---- names that are paths ---------------------------------------------------------------------------------

TRICKS = [
    "../../x",
    "..",
    ".",
    "a/b",
    "/etc",
    "x\x00y",
    "UPPER",
    "-lead",
    "trail-",
    "a" * 64,
    "a..b",
    " ",
]


@pytest.mark.parametrize("name", TRICKS, ids=repr)
@pytest.mark.parametrize("verb", ["status", "stop", "logs", "wait"])
def test_a_job_name_that_is_a_path_is_bad_input_before_any_path_is_built(home, verb, name):
    """A positional job name used to become FSDPCTL_HOME/jobs/<name>: `../../x` read (and `job stop`
    would signal) the state found outside. Now: exit 2, one line naming the value and the rule,
    nothing written."""
    outside = home.home.parent / "x" / "state.json"
    r = home("job", verb, "--backend", "local", "--", name)
    assert r.exit_code == 2 and _one_line(r.stderr), r.output
    assert "is not a valid name" in r.said and "DNS label" in r.said
    assert not home.home.exists() and not outside.exists()


@pytest.mark.parametrize("command", [["job", "run", "--dry-run"], ["manifest"]], ids=" ".join)
@pytest.mark.parametrize(
    "run_id", ["../../..", "a/b", "..", ".hidden", "x\x00", "a" * 129, "-x", "", "a b"], ids=repr
)
def test_a_run_id_that_is_a_path_is_bad_input(home, run_id, command):
    """`manifest --run-id` took any text (a space, or nothing at all, went into the rendezvous id
    and a label value the API server refuses); it takes what `job run --run-id` takes."""
    r = home(*command, f"--run-id={run_id}")
    assert r.exit_code == 2 and _one_line(r.stderr), r.output
    assert "--run-id" in r.said and "not a valid run id" in r.said
    assert not home.home.exists() and not r.stdout


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=70))
def test_every_accepted_name_stays_one_directory_under_jobs(name):
    """Any string: refused, or it names exactly one directory directly under FSDPCTL_HOME/jobs."""
    root = Path("/nonexistent-home/jobs")
    try:
        files.job_name(name)
    except BadInput as e:
        assert "\n" not in str(e)
        return
    assert (root / name).resolve().parent == root and re.fullmatch(r"[a-z0-9-]{1,63}", name)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=140))
def test_every_accepted_run_id_stays_one_directory_under_logs(run_id):
    root = Path("/nonexistent-home/jobs/j/logs")
    try:
        files.run_id(run_id)
    except BadInput as e:
        assert "\n" not in str(e)
        return
    assert (root / run_id).resolve().parent == root


@pytest.mark.parametrize("below", ["", "sub/dir"], ids=["the file", "under the file"])
def test_fsdpctl_home_naming_a_file_is_one_line(home, monkeypatch, tmp_path, below):
    target = tmp_path / "a-file"
    target.write_text("x")
    monkeypatch.setenv("FSDPCTL_HOME", str(target / below) if below else str(target))
    for args in (["job", "list"], ["cleanup"], ["job", "status", "fsdp", "--backend", "local"]):
        r = home(*args)
        assert r.exit_code == 2 and _one_line(r.stderr), (args, r.output)
        assert "FSDPCTL_HOME=" in r.said and "is not a directory" in r.said
    assert target.read_text() == "x"


@pytest.mark.parametrize("below", ["", "sub"], ids=["the loop", "under the loop"])
def test_fsdpctl_home_through_a_symlink_loop_is_one_line(home, monkeypatch, tmp_path, below):
    """A symlink loop (a -> b -> a) where FSDPCTL_HOME points: pathlib's resolve() raises
    (RuntimeError up to Python 3.12, ELOOP after); found by the CLI fuzzer as an internal error of
    `deploy all --dry-run`."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    monkeypatch.setenv(
        "FSDPCTL_HOME", str(tmp_path / "a" / below) if below else str(tmp_path / "a")
    )
    for args in (["job", "list"], ["deploy", "all", "--dry-run"], ["--debug", "cleanup"]):
        r = home(*args)
        assert r.exit_code == 2 and "internal error" not in r.output, (args, r.output)
        assert "FSDPCTL_HOME=" in r.said and "cannot be resolved" in r.said, (args, r.output)


# ---- a real run ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_runs_supervisor_killed_then_status_run_and_stop(home, monkeypatch):
    """torchrun and the tiny model for real (2 nodes, loopback): once a step is logged, SIGKILL to
    the supervisor. `job status` reports the two torchrun launchers as orphaned, a new start is
    refused, and `job stop` ends torchrun and its workers (SIGTERM reaches the trainer through
    torchrun) with no process of the job left."""
    from fsdpctl.job import policy as jobpolicy
    from fsdpctl.job import render
    from fsdpctl.settings import load

    cfg = load(
        dotenv={"SEQ_LEN": "64", "PRECISION": "fp32", "WARMUP_STEPS": "2", "MAX_STEPS": "100000"}
    )
    *infra, job = render.render_job(cfg, jobpolicy.new_run_id(cfg.job_name))
    prestep = next(
        o for o in infra if o["kind"] == "Job"
    )  # it prepares the claim the trainers wait on
    local.start(job, secret_env={}, prestep=prestep)
    name = cfg.job_name
    _until(
        lambda: job_report(local.read_state(local.job_dir(name)), float("inf"))["step"] >= 1,
        timeout=240,
        poll=0.5,
    )
    state = local.read_state(local.job_dir(name))
    os.kill(state["supervisor"]["pid"], signal.SIGKILL)
    _until(lambda: not local.same_process(state["supervisor"]))
    status = home("job", "status", name)
    assert "Orphaned" in status.said and "2 launchers still running (orphaned)" in status.said, (
        status.said
    )
    with pytest.raises(local.JobBusy):
        local.start(job, secret_env={})
    stopped = home("job", "stop", name)
    assert stopped.exit_code == 0 and "Stopped" in stopped.said, stopped.output
    assert local.job_processes(name) == []
