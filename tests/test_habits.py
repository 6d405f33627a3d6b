"""Habits a user brings from kubectl, SkyPilot and torchx, and views that say what matters (issue 38,
items 8 and 9), on two ended local jobs made by fsdpctl's own writers (tests/state_home.py: the real
supervisor, printer programs in place of torchrun).

- aliases, not a second vocabulary: `job ls` is `job list`, `job cancel` (SkyPilot's `sky cancel`,
  torchx's `torchx cancel`) and `job delete` (kubectl's delete of the job object, which is what `job
  stop` does on EKS) are `job stop`; `fsdpctl version` is `--version`; none is listed in the help;
- `-o wide` and `-o name` as kubectl means them (kubectl's get: wide adds columns, name prints one
  name per line for the next command);
- `cleanup NAME` cleans that job only;
- views: `job status -w` off a terminal prints a new view only when it changed; `job list` at 80
  columns never splits a phase inside its word; `job diff` says in one line whether the losses
  part, and lists only the steps where they do; `--help` lists each command's first sentence
  whole, in the order a user meets the commands; click's own usage errors say `error:` as
  fsdpctl's lines do.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import state_home
from conftest import invoke


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("habits")
    home = root / "home"
    saved = {k: os.environ.get(k) for k in ("FSDPCTL_HOME", "FSDPCTL_LOCAL_NETNS")}
    os.environ.update(FSDPCTL_HOME=str(home), FSDPCTL_LOCAL_NETNS="0")
    try:
        state_home.build(home)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    yield home


@pytest.fixture
def jobs(template, cli, monkeypatch) -> Path:
    """A copy of the two ended jobs in the test's own home."""
    shutil.copytree(template, cli.home, symlinks=True, dirs_exist_ok=True)
    for state in cli.home.glob("jobs/*/state.json"):  # the paths as a job started here has them
        state.write_text(state.read_text().replace(str(template), str(cli.home)))
    monkeypatch.setenv("FSDPCTL_LOCAL_NETNS", "0")
    return cli.home


def test_aliases_are_the_verbs_they_name_and_not_listed(jobs):
    assert invoke("job", "ls", "-o", "name").stdout == invoke("job", "list", "-o", "name").stdout
    assert invoke("job", "ls", "--help").stdout.startswith("Usage: fsdpctl job ls [OPTIONS]")
    for alias in ("cancel", "delete"):
        r = invoke("job", alias, "alpha")
        assert r.exit_code == 0 and "nothing to stop" in r.stderr, r.output
        helped = invoke("job", alias, "--help").stdout
        assert helped.replace(alias, "stop").startswith("Usage: fsdpctl job stop"), helped
    assert invoke("version").stdout == invoke("--version").stdout == "fsdpctl 0.1.0\n"
    for args in (("job", "--help"), ("--help",)):
        rows = invoke(*args).stdout.split("Commands:\n", 1)[1].splitlines()
        assert not {"ls", "cancel", "delete"} & {r.split()[0] for r in rows if r[2:3] != " "}


def test_output_wide_adds_columns_and_name_prints_the_names(jobs):
    plain = invoke("job", "list").stdout.splitlines()[0].split()
    wide = invoke("job", "list", "-o", "wide").stdout.splitlines()[0].split()
    assert wide == [*plain, "restarts", "checkpoint", "reason"]
    assert invoke("job", "list", "-o", "name").stdout == "alpha\nbeta\n"
    assert invoke("job", "status", "beta", "-o", "name").stdout == "beta\n"
    bad = invoke("job", "list", "-o", "nope")
    assert bad.exit_code == 2 and "error:" in bad.stderr and "Error:" not in bad.stderr


def test_cleanup_name_cleans_that_job_only(jobs):
    r = invoke("cleanup", "alpha", "--yes")
    assert r.exit_code == 0, r.output
    assert not (jobs / "jobs" / "alpha" / "state.json").exists()
    assert (jobs / "jobs" / "beta" / "state.json").exists()


def test_status_watch_off_a_terminal_prints_a_view_when_it_changes(jobs):
    """An ended job does not change: one view, then the command ends (it appended a ~45-line frame
    every 2 s)."""
    r = invoke("job", "status", "alpha", "-w", "--no-plot")
    assert r.exit_code == 0, r.output
    assert r.stdout.count("phase") == 1, r.stdout


def test_job_list_at_80_columns_keeps_each_phase_whole(jobs, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    r = invoke("job", "list")
    assert r.exit_code == 0, r.output
    assert r.stdout.split().count("Succeeded") == 2, r.stdout
    assert all(len(line) <= 80 for line in r.stdout.splitlines()), r.stdout


def test_diff_of_two_runs_says_whether_the_losses_part(jobs):
    """alpha and beta logged the same four losses: one line says so, and no rows of 0.000000."""
    r = invoke("job", "diff", "alpha", "beta")
    assert r.exit_code == 0, r.output
    assert "losses: the same at all 4 steps both runs logged" in r.stdout, r.stdout
    assert "0.000000" not in r.stdout


@settings(max_examples=200, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.floats(0, 10, allow_nan=False)),
            st.one_of(st.none(), st.floats(-0.5, 0.5, allow_nan=False)),
        ),
        max_size=40,
    )
)
def test_the_loss_verdict_counts_what_it_says(pairs):
    """Generated curves (a step only one run logged: None on one side): the verdict's counts are the
    rows', 'the same' exactly when no step both logged differs."""
    from fsdpctl.cli.diff_view import loss_verdict

    rows = [
        {"step": i + 1, "a": a, "b": None if a is None or d is None else a + d}
        for i, (a, d) in enumerate(pairs)
    ]
    said = loss_verdict(rows)
    both = [r for r in rows if r["a"] is not None and r["b"] is not None]
    differ = [r for r in both if r["b"] - r["a"] != 0.0]
    if not rows:
        assert said == "losses: neither run logged a step"
    elif not both:
        assert said.startswith("losses: no step logged by both runs")
    elif differ:
        assert f"at {len(differ)} of {len(both)} steps (first at step {differ[0]['step']}:" in said
    else:
        assert said.startswith(f"losses: the same at all {len(both)} steps")


def test_help_lists_whole_first_sentences_in_the_order_a_user_meets_them():
    """No command line of a group's help is cut with '...' (click cut them at 45 characters), and
    the commands come in the groups' ORDER."""
    from fsdpctl.cli import _Group
    from fsdpctl.cli.common import _SubGroup

    for args, order in ((("--help",), _Group.ORDER), (("job", "--help"), _SubGroup.ORDER)):
        text = invoke(*args).stdout
        section = text.split("Commands:\n", 1)[1]
        assert not any(line.rstrip().endswith("...") for line in section.splitlines()), section
        names = [
            line.split()[0]
            for line in section.splitlines()
            if line[:3] == "  " + line[2:3] and line[2] != " "
        ]
        assert names == [n for n in order if n in names], names


def test_a_usage_error_says_error_as_every_line_does():
    r = invoke("job", "list", "--no-such-option")
    assert r.exit_code == 2 and "error: No such option: --no-such-option" in r.stderr, r.stderr
    assert "Error:" not in r.stderr
    assert json.dumps(r.stderr)  # one text, nothing else


@given(max_steps=st.integers(1, 10_000), at=st.integers(0, 10_050))
@settings(max_examples=100, derandomize=True)
def test_stop_never_waits_for_a_step_past_max_steps(max_steps, at):
    """Item 1: `job stop` of a 60-step job said "waiting: step 61 to finish". Whatever step the
    SIGTERM came after, the step it says it waits for is one the job will train."""
    import re

    from fsdpctl.backends.local import backend

    report = {"summary": None, "nodes_running": 1, "max_steps": max_steps, "checkpoint": None}
    real = backend.job_report
    backend.job_report = lambda st, stall: report  # the report's fields alone decide the note
    try:
        note = backend._stop_note({"job": "j"}, at)
    finally:
        backend.job_report = real
    waits = re.match(r"step (\d+) to finish", note)
    assert waits is None or int(waits[1]) <= max_steps, note
    assert waits is not None or "last step" in note, note
