"""Signals, flags and a full disk at the edge of a command (issue 37).

- SIGTERM (CI's timeout, `kill`) and SIGHUP (the terminal closed) to a `job run` that follows its
  job do what Ctrl-C does there (the local backend stops the job with a checkpoint, a cluster's is
  left running: detached), say so in one line, and exit 128 + the signal's number, as a shell
  reports a process that signal ended (POSIX sh, "Exit Status for Commands": 128 + signal number;
  signal(7): SIGHUP 1, SIGTERM 15). Python's default for both is to end the process at once,
  without a word (signal module docs: only SIGINT gets a Python handler by default).
- Options that exclude each other are refused (exit 2, one line), as kubectl refuses a pod name
  with --selector (`kubectl logs`: "only one of a pod name or a selector"); `model fetch` of an id
  huggingface_hub would refuse (utils/_validators.py validate_repo_id) and `deploy --from` a path
  that is no directory are bad input, refused before anything runs.
- A job that met a full disk says so: a write to a full file system fails with ENOSPC (write(2)),
  which reaches the trainer as "No space left on device" or, through torch's zip writer, as a short
  write ("unexpected pos", caffe2/serialize/inline_container.cc).

Peers: real signals to this process (the follow loop in process) and to the real executable running
a real local job (torchrun on CPU, slow lane); a real full tmpfs for the disk (root).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import invoke
from invariants import error_lines, snapshot, written

# ---- SIGTERM and SIGHUP, in the follow loop -------------------------------------------------------------


class Followed:
    """A backend whose job trains until the second poll, when the signal under test arrives; its
    `interrupt` is what the named backend does with Ctrl-C."""

    poll_s = 0.01

    def __init__(self, name: str, signum: int) -> None:
        self.name, self.signum, self.polls, self.interrupted = name, signum, 0, False

    def report(self, job: str) -> dict:
        self.polls += 1
        if self.polls == 2:
            os.kill(os.getpid(), self.signum)
        return {
            "phase": "Running",
            "problems": [],
            "max_steps": 10,
            "step": self.polls,
            "loss": 2.0,
            "tokens_per_s": 1.0,
            "prestep": None,
        }

    def interrupt(self, job: str) -> dict | None:
        self.interrupted = True
        if self.name == "local":  # stopped at a step, with its checkpoint (the trainer's SIGTERM)
            return {"phase": "Stopped", "step": 2, "checkpoint": "/ckpt/step-2", "job": job}
        return None  # a cluster's job goes on: detached

    def tail(self, job: str, n: int) -> list[str]:
        return []


@pytest.mark.parametrize("backend", ["local", "eks", "slurm"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_the_follow_does_what_ctrl_c_does(capsys, backend, signum):
    from fsdpctl.cli import job_view

    be = Followed(backend, signum)
    before = signal.getsignal(signum)
    with pytest.raises(typer.Exit) as ended:
        job_view.follow(be, "held")
    assert ended.value.exit_code == 128 + signum and be.interrupted
    assert signal.getsignal(signum) == before  # the handler was the follow's alone
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    said = lines[-1]
    if backend == "local":
        assert said.startswith("warning: interrupted: job held stopped at step 2"), lines
    else:
        assert "detached; job held keeps running" in said, lines
    assert not [line for line in lines if line.startswith("error:")], lines


def _env(home: Path) -> dict[str, str]:
    from fsdpctl.settings import setting_keys

    keys = set(setting_keys())
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSDPCTL_") and k not in keys}
    settings_ = {
        "JOB_NODES": "1",
        "MAX_STEPS": "400",
        "CHECKPOINT_INTERVAL": "1000",
        "LOG_INTERVAL": "1",
        "SEQ_LEN": "64",
        "PRECISION": "fp32",
        "WARMUP_STEPS": "1",
        "JOB_NAME": "signalled",
    }
    return {
        **env,
        "FSDPCTL_HOME": str(home),
        "FSDPCTL_LOCAL_NETNS": "0",
        "NO_COLOR": "1",
        **{f"FSDPCTL_{k}": v for k, v in settings_.items()},
    }


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_a_real_job_run_stops_the_job_with_a_checkpoint(tmp_path, signum):
    """The real executable running a real local job (torchrun, CPU): the signal comes once the job
    trains (its leader logged a step: waited on, not slept); the command stops the job, which saves
    its stop checkpoint, says so in one line and exits 128 + the signal; the job is Stopped, not
    training on."""
    from conftest import FSDPCTL_EXE
    from fsdpctl.backends.local import engine as local
    from fsdptrain import events

    home = tmp_path / "home"
    env = _env(home)
    proc = subprocess.Popen(
        [str(FSDPCTL_EXE), "job", "run"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    os.environ["FSDPCTL_HOME"] = str(home)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            state = local.read_state(local.job_dir("signalled"))
            leader = local.leader_log(state) if state else None
            if leader and any(isinstance(e, events.Step) for e in events.parse(_lines(leader))):
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=300)
        state = local.read_state(local.job_dir("signalled"))
    finally:
        os.environ.pop("FSDPCTL_HOME", None)
        if proc.poll() is None:
            proc.kill()
        subprocess.run(
            [str(FSDPCTL_EXE), "job", "stop", "signalled"],
            env=env,
            capture_output=True,
            timeout=300,
        )
    assert proc.returncode == 128 + signum, err
    final = [line for line in err.splitlines() if line.startswith(("warning:", "error:"))]
    # stopped at a step: its stop checkpoint was saved (CHECKPOINT_INTERVAL is past MAX_STEPS)
    assert final and "interrupted: job signalled stopped at step" in final[-1], err
    assert "Traceback" not in err
    assert local.effective_phase(state) not in local.ACTIVE


def _lines(path) -> list[str]:
    from fsdpctl.job import crilog

    return list(crilog.texts(path))


# ---- flags that exclude each other, and inputs refused before anything runs -----------------------------


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    flags=st.lists(
        st.sampled_from(["--all", "--node", "--pod"]), min_size=2, max_size=3, unique=True
    ),
    joined=st.booleans(),
    trailing=st.sampled_from([(), ("--tail", "5"), ("-f",)]),
)
def test_log_sources_that_exclude_each_other_are_refused(cli, flags, joined, trailing):
    words: list[str] = []
    for flag in flags:
        if flag == "--all":
            words.append(flag)
        else:
            value = "0" if flag == "--node" else "fsdp-worker-0"
            words += [f"{flag}={value}"] if joined else [flag, value]
    before = snapshot(cli.home, cli.cwd)
    r = invoke("job", "logs", *words, *trailing)
    assert r.exit_code == 2, r.output
    [line] = error_lines(r.stderr)
    assert line.startswith("error: job logs:") and "exclude each other" in line, line
    assert not written(before, snapshot(cli.home, cli.cwd))


def test_a_flag_value_that_looks_like_another_flag_is_not_counted(cli):
    """`--since --all` gives --since the value '--all' (click's reading): no conflict, --since's
    own refusal."""
    r = invoke("job", "logs", "--since", "--all", "--node", "0")
    assert r.exit_code == 2 and "--since '--all' is not a duration" in r.stderr, r.output


BAD_IDS = st.one_of(
    st.sampled_from(
        ["bad repo!!", "a/b/c", "x--y", "a..b", "-lead", "trail-", "repo.git", "é/x", ""]
    ),
    st.text("abc!@ #$%^&*()=+[]{}", min_size=1, max_size=12).filter(lambda s: set(s) - set("abc")),
)


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(repo=BAD_IDS, kind=st.sampled_from(["model", "data"]), dry=st.booleans())
def test_a_hub_id_the_hub_cannot_take_is_refused_before_anything(cli, repo, kind, dry):
    from fsdptrain.fetch import repo_id_problem

    if repo_id_problem(repo) is None:
        return
    before = snapshot(cli.home, cli.cwd)
    r = invoke(kind, "fetch", *(("--dry-run",) if dry else ()), "--to", "hf", "--", repo)
    assert r.exit_code == 2, r.output
    assert error_lines(r.stderr) == [r.stderr.splitlines()[0]], r.stderr  # no progress line first
    assert "is not a hub id" in r.stderr
    assert not written(before, snapshot(cli.home, cli.cwd))


def test_the_hub_id_rule_is_huggingface_hubs():
    """repo_id_problem agrees with huggingface_hub's own validate_repo_id on generated ids."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from fsdptrain.fetch import repo_id_problem

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(st.text("ab9_.-/é", max_size=12))
    def agree(repo):
        try:
            validate_repo_id(repo)
            theirs = True
        except HFValidationError:
            theirs = False
        assert (repo_id_problem(repo) is None) == theirs, repo

    agree()


@pytest.mark.parametrize("what", ["missing", "file"])
def test_deploy_from_that_is_no_directory(cli, what):
    path = cli.cwd / "mirror"
    if what == "file":
        path.write_text("x")
    r = invoke("deploy", "operator", "--from", str(path), "--dry-run")
    assert r.exit_code == 2, r.output
    [line] = error_lines(r.stderr)
    assert line.startswith(f"error: --from {path} "), line


# ---- a full disk ----------------------------------------------------------------------------------------

DISK_FULL_LINES = [
    "OSError: [Errno 28] No space left on device: '/fsx/checkpoints/x/.tmp-step-8/__0_0.distcp'",
    "fsdptrain: error: checkpoint at step 8 failed (short write: the disk is full or a file-size "
    "limit was hit; 0 MiB free); the last good one is step-4",
    "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598",
    "OSError: [Errno 122] Disk quota exceeded",
]


@pytest.mark.parametrize("line", DISK_FULL_LINES)
def test_each_layers_words_for_a_full_disk_are_read(line):
    from fsdpctl.job.failures import says_disk_full

    assert says_disk_full([line]) and not says_disk_full(["OSError: [Errno 2] No such file"])


class Ended:
    def __init__(self, name: str) -> None:
        self.name = name


@pytest.fixture
def full(tmp_path):
    """A 1 MiB tmpfs filled to the last block (root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    at = tmp_path / "full"
    at.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(at)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr!r}")
    try:
        with open(at / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 65536)
    except OSError:
        pass
    yield at
    subprocess.run(["umount", str(at)], check=False)


def test_a_failed_local_job_on_a_full_disk_says_the_disk_is_full(full):
    """The trainer had no room left even for its error line: the log is silent, and the failure
    says nothing. The disk under the job's checkpoints and log is read (statvfs(2)) and named."""
    from fsdpctl.cli import job_view

    report = {
        "failure": None,
        "reason": "node 0 ended without saying how",
        "checkpoint_dir": str(full / "ckpt"),
        "leader_log": str(full / "logs" / "node-0.log"),
    }
    line = job_view.full_disk(Ended("local"), report, [])
    assert line and line.startswith("the disk is full") and str(full / "ckpt") in line, line
    # a cluster's paths are not this machine's: only what the job said counts there
    assert job_view.full_disk(Ended("eks"), report, []) is None
    said = {**report, "failure": {"error": DISK_FULL_LINES[1], "raised": None}}
    assert "the disk is full" in (job_view.full_disk(Ended("eks"), said, []) or "")


def test_the_outcome_of_a_job_that_met_a_full_disk_has_its_line(full, capsys):
    from fsdpctl.cli import job_view

    class Failed(Ended):
        def tail(self, job, n):
            return ["[rank0]: OSError: [Errno 28] No space left on device"]

    r = {
        "phase": "Failed",
        "reason": "node 0 exited with code 1",
        "failure": None,
        "checkpoint_dir": str(full / "ckpt"),
        "leader_log": None,
    }
    assert job_view.outcome(Failed("local"), "held", r) == 3
    err = capsys.readouterr().err
    assert "  the disk is full: the file system of" in err, err
