"""fsdpctl's state directory is the user's, not the current directory's (issue 16: "after `cd`, `job
list` is empty"): FSDPCTL_HOME, else $XDG_STATE_HOME/fsdpctl, else ~/.local/state/fsdpctl.

The rule is the XDG Base Directory Specification's
(https://specifications.freedesktop.org/basedir-spec/latest/, "Environment variables"):
"$XDG_STATE_HOME defines the base directory relative to which user-specific state files should be
stored. If $XDG_STATE_HOME is either not set or empty, a default equal to $HOME/.local/state should
be used", and "All paths set in these environment variables must be absolute. If an implementation
encounters a relative path in any of these variables it should consider the path invalid and ignore
it." Python's Path.home() reads $HOME first (os.path.expanduser), as the spec's $HOME.

A local job's state is real here: the real supervisor (`local.start`) runs a sleeping stand-in for
torchrun, as tests/test_process_control.py's `fake_job` does, and is SIGKILLed after.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdpctl import files
from fsdpctl.backends.local import engine as local
from fsdpctl.backends.local.state import KEYS
from fsdpctl.job.state import CORE
from test_process_control import fake_job

NOTICE = "FSDPCTL_HOME=./.fsdpctl"


@pytest.fixture
def user(cli, monkeypatch, tmp_path):
    """The `cli` fixture with FSDPCTL_HOME unset: the default decides. HOME and XDG_STATE_HOME under
    tmp_path, so nothing reaches the real user's ~/.local/state."""
    monkeypatch.delenv("FSDPCTL_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("FSDPCTL_LOCAL_NETNS", "0")
    return cli


def _ended_job(root: Path, name: str) -> None:
    """A finished job's state (every key the core and the local backend require) in the state
    directory `root`."""
    jdir = root / "jobs" / name
    state = {
        "job": name,
        "run_id": "r1",
        "phase": "Succeeded",
        "created": time.time(),
        "replicas": 1,
        "log_dir": str(jdir / "logs" / "r1"),
        "checkpoint_dir": None,
        "launchers": [],
    }
    assert set(state) >= {*CORE.required, *KEYS.required}
    files.write_atomic(jdir / "state.json", json.dumps(state))


def _old_job(cwd: Path, name: str = "old") -> None:
    """A job as the old default (./.fsdpctl) kept it."""
    _ended_job(cwd / ".fsdpctl", name)


# ---- where the default is ----------------------------------------------------------------------------------


def test_the_fixture_keeps_the_default_out_of_the_real_home(cli, monkeypatch, tmp_path):
    """A test that unsets FSDPCTL_HOME under the `cli` fixture still writes under its tmp dir (the
    fixture's XDG_STATE_HOME), never the developer's ~/.local/state."""
    monkeypatch.delenv("FSDPCTL_HOME")
    assert files.home() == (tmp_path / "state" / "fsdpctl").resolve()
    assert files.home().is_relative_to(tmp_path.resolve())


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    xdg=st.one_of(
        st.none(),
        st.just(""),
        st.from_regex(
            r"[a-z]{1,8}(/[a-z]{1,8}){0,2}", fullmatch=True
        ),  # relative: invalid, ignored
        st.from_regex(r"/[a-z]{1,8}(/[a-z]{1,8}){0,2}", fullmatch=True).map(lambda p: "ABS" + p),
    ),
    override=st.booleans(),
)
def test_the_default_follows_the_xdg_rule_and_fsdpctl_home_overrides(
    user, monkeypatch, tmp_path, xdg, override
):
    """For every XDG_STATE_HOME (unset, empty, relative, absolute) and with or without FSDPCTL_HOME:
    the directory is FSDPCTL_HOME if set, else $XDG_STATE_HOME/fsdpctl if absolute, else
    $HOME/.local/state/fsdpctl; never anything under the current directory."""
    if xdg is None:
        monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    else:
        xdg = xdg.replace("ABS/", f"{tmp_path}/abs/")
        monkeypatch.setenv("XDG_STATE_HOME", xdg)
    if override:
        monkeypatch.setenv("FSDPCTL_HOME", str(tmp_path / "mine"))
    else:
        monkeypatch.delenv("FSDPCTL_HOME", raising=False)
    got = files.home()
    if override:
        want = tmp_path / "mine"
    elif xdg and os.path.isabs(xdg):
        want = Path(xdg) / "fsdpctl"
    else:
        want = tmp_path / "user" / ".local" / "state" / "fsdpctl"
    assert got == want.resolve()
    assert got.is_absolute()


@pytest.mark.parametrize("where", ["FSDPCTL_HOME", "XDG_STATE_HOME"])
def test_a_file_where_the_state_directory_should_be_is_one_line(user, monkeypatch, tmp_path, where):
    """home()'s check holds for the default as for FSDPCTL_HOME: a file in the way is bad input
    (exit 2), one line naming the path, before anything is written."""
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    monkeypatch.setenv(where, str(blocker))
    r = user("job", "list")
    assert r.exit_code == 2, r.output
    assert "error: FSDPCTL_HOME=" in r.stderr and str(blocker) in r.said
    assert "Traceback" not in r.output
    assert blocker.read_text() == "x"


# ---- one place, whatever the current directory ------------------------------------------------------------


def test_a_job_started_in_one_directory_is_listed_and_shown_from_another(
    user, monkeypatch, tmp_path
):
    """The issue's case: start a local job in a/, `cd b`, `job list` and `job status` find it, and
    its state and logs are under $XDG_STATE_HOME/fsdpctl, nothing under a/ or b/."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    monkeypatch.chdir(a)
    local.start(fake_job("moved", replicas=1, grace=2), secret_env={})
    try:
        monkeypatch.chdir(b)
        listed = user("job", "list", "-o", "json")
        assert listed.exit_code == 0, listed.output
        assert [j["job"] for j in json.loads(listed.stdout)] == ["moved"]
        status = user("job", "status", "moved", "-o", "json")
        assert status.exit_code == 0, status.output
        state_dir = tmp_path / "xdg" / "fsdpctl" / "jobs" / "moved"
        assert (state_dir / "state.json").is_file()
        assert list(state_dir.glob("logs/*/supervisor.log"))
        assert not list(a.iterdir()) and not list(b.iterdir())
    finally:
        for pid in local.job_processes("moved"):
            local.signal_marked(pid, signal.SIGKILL, local.job_mark("moved"))


# ---- the old place: told, not moved ------------------------------------------------------------------------


def test_jobs_left_in_the_old_place_are_named_once_and_not_moved(user, tmp_path):
    """./.fsdpctl with jobs and an empty new default: one warning line saying where state lives and
    how to keep the old place; the old directory is untouched and nothing is copied into the new
    one."""
    _old_job(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / ".fsdpctl").rglob("*"))
    r = user("job", "list", "-o", "json")
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1, r.stderr
    assert str(tmp_path / "xdg" / "fsdpctl") in lines[0] and NOTICE in lines[0]
    assert (
        json.loads(r.stdout) == []
    )  # the new place, empty: the old jobs are not read behind the user's back
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / ".fsdpctl").rglob("*")) == before
    assert not (tmp_path / "xdg" / "fsdpctl" / "jobs").exists()


def test_following_the_notice_keeps_the_old_place(user, monkeypatch, tmp_path):
    """FSDPCTL_HOME=./.fsdpctl, as the warning says: the old jobs are listed and no warning is
    printed."""
    _old_job(tmp_path)
    monkeypatch.setenv("FSDPCTL_HOME", "./.fsdpctl")
    r = user("job", "list", "-o", "json")
    assert r.exit_code == 0, r.output
    assert [j["job"] for j in json.loads(r.stdout)] == ["old"]
    assert "warning:" not in r.stderr, r.stderr


@pytest.mark.parametrize("case", ["new-has-jobs", "old-is-empty", "old-has-no-job-dirs"])
def test_no_notice_when_there_is_nothing_to_say(user, tmp_path, case):
    """The warning appears only when the old place holds jobs and the new one none: not once the
    user has jobs in the new place, not for an empty or stray ./.fsdpctl."""
    if case == "new-has-jobs":
        _old_job(tmp_path)
        _ended_job(tmp_path / "xdg" / "fsdpctl", "new")
    elif case == "old-is-empty":
        (tmp_path / ".fsdpctl" / "jobs").mkdir(parents=True)
    else:
        (tmp_path / ".fsdpctl" / "jobs").mkdir(parents=True)
        (tmp_path / ".fsdpctl" / "jobs" / "Not_A_Job").write_text("")
    r = user("job", "list")
    assert r.exit_code == 0, r.output
    assert NOTICE not in r.output and "warning:" not in r.stderr
