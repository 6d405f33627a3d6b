"""Golden files: what fsdpctl prints, frozen, so that a change to it shows up in review as a diff of
tests/golden/ rather than passing unseen.

- the --help of every command, the list walked from the app's own click tree: a new or renamed command fails
  until its golden exists, and a golden no command prints any more fails too;
- the main outputs: `config show`, `plan` of a named model, `manifest` (the YAML on stdout) and `job status`
  of a finished local job (slow: a real two-node run; times, paths and run ids normalised).

After an intended change, rewrite them with one command and review the diff:

    FSDPCTL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_golden.py -p no:cacheprovider
    git diff tests/golden/

(`-m "not slow"` leaves the job status golden as it is and skips its real run; `make golden`
rewrites these and test_manifests' golden manifests together.)
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"
HELP = GOLDEN / "help"
UPDATE = bool(os.environ.get("FSDPCTL_UPDATE_GOLDEN"))  # the same switch as test_manifests' goldens
REGENERATE = (
    "FSDPCTL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_golden.py -p no:cacheprovider"
    "   (or `make golden`: these and the manifest goldens)"
)


def commands() -> list[tuple[str, ...]]:
    """Every command path the app has, root first: () is `fsdpctl` itself, then groups and their
    verbs."""
    import typer.main

    from fsdpctl.cli import app

    def walk(cmd, path: tuple[str, ...]):
        yield path
        subs = getattr(cmd, "commands", {})  # a group (typer carries its own click: no isinstance)
        for name in sorted(subs):
            if not subs[name].hidden:
                yield from walk(subs[name], (*path, name))

    return list(walk(typer.main.get_command(app), ()))


def help_golden(path: tuple[str, ...]) -> Path:
    return HELP / ("-".join(("fsdpctl", *path)) + ".txt")


def check(golden: Path, text: str) -> None:
    """text equals the golden file, or the failure shows the diff and the command that accepts it."""
    name = golden.relative_to(GOLDEN.parent.parent)
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
        return
    if not golden.exists():
        pytest.fail(
            f"{name} does not exist yet: write it (and every other golden) with\n    {REGENERATE}"
        )
    expected = golden.read_text()
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(True), text.splitlines(True), f"{name}", "printed now"
            )
        )
        pytest.fail(
            f"{name} differs from what fsdpctl prints now:\n{diff}\n"
            f"if the change is intended, rewrite the goldens and review `git diff tests/golden`:\n"
            f"    {REGENERATE}",
            pytrace=False,
        )


def normalised(text: str, root: Path) -> str:
    """The isolated test directory as <TMP>; trailing blanks (rich pads table cells) gone."""
    for spelling in {str(root.resolve()), str(root)}:
        text = text.replace(spelling, "<TMP>")
    return "".join(line.rstrip() + "\n" for line in text.splitlines())


def without_the_clock(text: str) -> str:
    """What changes from run to run of the same job: run ids, durations and ages, timestamps,
    throughput and the loss (float noise across CPUs; its value is the trainer tests' business, its
    place is frozen here)."""
    text = re.sub(r"\b([a-z0-9][-a-z0-9]*)-[0-9a-f]{8}-[0-9a-f]{6}\b", r"\1-<RUN-ID>", text)
    text = re.sub(r"\d{4}-\d\d-\d\d[T _]\d\d:\d\d:\d\d(\.\d+)?Z?", "<TIME>", text)
    text = re.sub(r"\b(\d+h ?)?(\d+m ?)?\d+(\.\d+)?s\b", "<DUR>", text)
    text = re.sub(r"\b\d[\d,]*(\.\d+)? (tokens/s|tok/s)", r"<N> \2", text)
    # a network namespace per node as root (its /24 moves past those in use), loopback otherwise
    text = re.sub(r"(?m)^(network\s+).+$", r"\1<NETWORK>", text)
    # the pods' uid where this machine lets them reach the interpreter, else this user and why
    text = re.sub(r"(?m)^(user\s+).+$", r"\1<USER>", text)
    return re.sub(r"\b(loss\s+)\d+\.\d+", r"\1<LOSS>", text)


# --- --help of every command ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", commands(), ids=lambda p: " ".join(("fsdpctl", *p)))
def test_help_of_every_command(cli, path):
    r = cli(*path, "--help")
    assert (r.exit_code, r.stderr) == (0, ""), r.output
    check(help_golden(path), normalised(r.stdout, cli.cwd))


def test_every_help_golden_belongs_to_a_command():
    """A renamed or removed command leaves its old golden behind: that fails too (rewriting removes
    it)."""
    wanted = {help_golden(path) for path in commands()}
    stale = sorted(p for p in HELP.glob("*.txt") if p not in wanted)
    if UPDATE:
        for path in stale:
            path.unlink()
        return
    assert not stale, (
        f"goldens of commands the app no longer has: {[p.name for p in stale]}; {REGENERATE}"
    )


def test_the_command_walk_finds_groups_and_verbs():
    """The walk itself: the root, a group and a verb of it, and nothing twice."""
    found = commands()
    assert (
        found[0] == ()
        and ("job",) in found
        and ("job", "status") in found
        and ("config", "show") in found
    )
    assert len(found) == len(set(found))


# --- the main outputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, args",
    [
        ("config-show.txt", ["config", "show"]),
        ("plan-7b.txt", ["plan", "--model", "7b"]),
        ("manifest-eks.yaml", ["--set", "BACKEND=eks", "manifest", "--run-id", "golden-run"]),
    ],
    ids=["config show", "plan --model 7b", "manifest"],
)
def test_main_outputs(cli, name, args):
    """The defaults of a clean environment (the `cli` fixture removes every setting)."""
    r = cli(*args)
    assert (r.exit_code, r.stderr) == (0, ""), r.output
    check(GOLDEN / "cli" / name, normalised(r.stdout, cli.cwd))


def test_config_show_names_every_kind_of_source(cli, monkeypatch):
    """Each kind of source as `config show` prints it: `.env line N`, `environment FSDPCTL_<KEY>`,
    the plain names read by their own tools (`environment AWS_REGION`), `--set`, `model default
    (7b)`; a stray plain name (SEED=abc) is no source at all."""
    (cli.cwd / ".env").write_text("# team settings\nMODEL=7b\n\nexport JOB_NODES=4\nSEED=1\n")
    monkeypatch.setenv("FSDPCTL_SEED", "7")
    monkeypatch.setenv("SEED", "abc")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    r = cli("--set", "PRECISION=fp32", "config", "show")
    assert (r.exit_code, r.stderr) == (0, ""), r.output
    check(GOLDEN / "cli" / "config-show-sources.txt", normalised(r.stdout, cli.cwd))


@pytest.mark.slow
def test_job_status_of_a_finished_local_job(cli):
    """A real local run (two simulated nodes, torchrun on CPU) to its end, then `job status` of it."""
    short = [
        f"--set={kv}" for kv in ("MAX_STEPS=4", "WARMUP_STEPS=1", "SEQ_LEN=64", "PRECISION=fp32")
    ]
    run = cli(*short, "--set=JOB_NAME=golden", "job", "run")
    assert run.exit_code == 0, run.output
    r = cli("job", "status", "golden")
    assert (r.exit_code, r.stderr) == (0, ""), r.output
    assert "Succeeded" in r.stdout
    check(GOLDEN / "cli" / "job-status-local.txt", without_the_clock(normalised(r.stdout, cli.cwd)))


def test_status_curves_of_a_fixed_run():
    """The loss and tokens/s curves `job status --plot` draws (plotext) for a fixed run, 30 steps of
    a decaying loss and a periodic throughput, at a fixed size: the drawing frozen, whatever the
    terminal."""
    import math

    from fsdpctl.cli.plots import terminal_plot
    from fsdptrain.events import Step

    steps = [
        Step(
            step=s,
            max_steps=30,
            loss=round(6.3 * math.exp(-s / 12) + 2, 4),
            step_time_s=0.5,
            time=0.0,
            tokens_per_s=round(1000 + 300 * math.sin(s / 3), 1),
        )
        for s in range(1, 31)
    ]
    check(
        GOLDEN / "cli" / "job-status-curves.txt", terminal_plot(steps, width=100, height=24) + "\n"
    )


def test_the_clock_normalisation():
    """The normalisation of test_job_status_of_a_finished_local_job, on a status as fsdpctl prints
    it."""
    printed = (
        "job         golden  (run golden-6b116ada-271a5a, local)\n"
        "nodes       0/2 running; 0 restarts; age 1m02s\n"
        "progress    step 4/4 (100%), ETA 0s\n"
        "loss        5.9931\n"
        "throughput  2,428 tokens/s\n"
        "last step   3.5s ago at 2026-12-03T13:13:59Z\n"
        "network     a network namespace per node (10.231.40.0/24)\n"
    )
    assert without_the_clock(printed) == (
        "job         golden  (run golden-<RUN-ID>, local)\n"
        "nodes       0/2 running; 0 restarts; age <DUR>\n"
        "progress    step 4/4 (100%), ETA <DUR>\n"
        "loss        <LOSS>\n"
        "throughput  <N> tokens/s\n"
        "last step   <DUR> ago at <TIME>\n"
        "network     <NETWORK>\n"
    )
