"""A command loads only what it uses (issue 44): the read verbs run in a real process, as the
`fsdpctl` script runs them, and the modules they imported are checked; the root's --help, which
lists every command without importing it, is held equal to the commands themselves.

The lazy root group follows click's documented pattern (click docs, "Complex Applications: Lazily
Loading Subcommands", https://click.palletsprojects.com/en/stable/complex/): `list_commands` names
every command without importing it, `get_command` imports one. Peer: the real executable in a
subprocess (sys.modules at its exit), and typer's own conversion of option values (typer/_coercion.py
`build_runtime_param`, a pydantic TypeAdapter) for the root options fsdpctl converts itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import typer.main
from hypothesis import given, settings
from hypothesis import strategies as st

from fsdpctl.cli import COMMANDS, _Group, app
from fsdpctl.cli.common import first_sentence
from fsdpctl.cli.lazy import PlainValues, plain_converter
from fsdpctl.errors import ExitCode

# out of the fast lane (it keeps under 2 minutes): beside the serial slow lane (conftest)
pytestmark = pytest.mark.slow

# the console script's lines, then sys.modules written where FSDPCTL_TEST_MODULES says at exit
RUN = (
    "import atexit, json, os, sys\n"
    "atexit.register(lambda: open(os.environ['FSDPCTL_TEST_MODULES'], 'w').write("
    "json.dumps(sorted(sys.modules))))\n"
    "from fsdpctl.entry import main\n"
    "sys.argv[0] = 'fsdpctl'\n"
    "sys.exit(main())\n"
)
# never for a verb that reads: SDKs, the trainer's frameworks, templates
HEAVY = ("torch", "transformers", "boto3", "botocore", "kubernetes", "jinja2", "docker", "datasets")
# nothing that reads settings or speaks to a place: `fsdpctl version` and --help
SETTINGS = ("pydantic", "fsdpctl.settings", "fsdpctl.backends", "fsdpctl.job", "yaml", "fsdptrain")
# the job group's commands are declared in these too
JOB_PARTS = ("fsdpctl.cli.job_record_cmd", "fsdpctl.cli.job_plot_cmd")
# what only a verb that starts or changes a job needs: the submit machinery, the objects a job is
# rendered into and the planner behind their policy
STARTS = (
    "fsdpctl.job.runner",
    "fsdpctl.job.submit",
    "fsdpctl.job.render",
    "fsdpctl.job.policy",
    "fsdpctl.plan.planner",
)
# the whole settings model: a local `job list` / `job status` reads BACKEND and JOB_NAME without it
# (fsdpctl.settings.reading), and converts its options without typer's pydantic adapters
MODEL = (
    "pydantic",
    "pydantic_core",
    "typer._adapters",
    "fsdpctl.settings.model",
    "fsdpctl.settings.config",
    "fsdpctl.settings.load",
)
CASES = {
    "version": (["version"], HEAVY + SETTINGS),
    "help": (["--help"], HEAVY + SETTINGS),
    # BACKEND=local (the default): no other place's backend, no cluster adapter
    "job list": (
        ["job", "list"],
        (
            *HEAVY,
            *STARTS,
            *MODEL,
            "fsdpctl.backends.eks",
            "fsdpctl.backends.slurm",
            "fsdpctl.adapters.kube",
        ),
    ),
    "job status": (
        ["job", "status", "missing"],
        (
            *HEAVY,
            *STARTS,
            *MODEL,
            "fsdpctl.backends.eks",
            "fsdpctl.backends.slurm",
            "fsdpctl.adapters.kube",
        ),
    ),
}


def modules_of(
    args: list[str], tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """The modules a real `fsdpctl ARGS` had imported when it exited, on a fresh FSDPCTL_HOME."""
    dump = tmp_path / "modules.json"
    env = {
        **os.environ,
        "FSDPCTL_HOME": str(tmp_path / "home"),
        "FSDPCTL_TEST_MODULES": str(dump),
        "NO_COLOR": "1",
    }
    p = subprocess.run(
        [sys.executable, "-c", RUN, *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    return p, set(json.loads(dump.read_text()))


def loaded(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.mark.parametrize("case", CASES)
def test_a_read_verb_imports_nothing_it_does_not_use(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read verb runs to its usual end (a missing job: exit 4 and its line), having imported
    no module it does not use: no SDK or framework for any, no settings or pydantic for `version`
    and --help, no other place's backend for a local `job list` / `job status`. Only its own
    command module of the cli's *_cmd modules is imported (the job group's modules for `job`)."""
    for key in ("BACKEND", "FSDPCTL_BACKEND", "FSDPCTL_ENV_FILE"):
        monkeypatch.delenv(key, raising=False)
    args, banned = CASES[case]
    p, modules = modules_of(args, tmp_path)
    missing = ExitCode.JOB_NOT_FOUND if args[-1] == "missing" else ExitCode.OK
    assert p.returncode == missing, p.stderr
    assert "Traceback" not in p.stderr
    assert loaded(modules, banned) == [], f"fsdpctl {' '.join(args)} imported them"
    own = {COMMANDS[args[0]][0], *JOB_PARTS} if args[0] in COMMANDS else set()
    commands = {m for m in modules if m.startswith("fsdpctl.cli.") and m.endswith("_cmd")}
    assert commands <= own, commands


def test_the_root_help_lists_every_command_with_its_own_first_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """COMMANDS (what --help shows without importing) is each command's: its module and attribute
    exist, the command is not hidden, and its line is the first sentence of its help; the root's
    --help is the same text with every command built as without."""
    root = typer.main.get_command(app)
    assert isinstance(root, _Group)
    for name, (_, _, line) in COMMANDS.items():
        cmd = root.commands[name]  # built: its module imported
        assert cmd.name == name and not cmd.hidden
        assert first_sentence(cmd.help or cmd.short_help or "") == line, name
    assert set(root.commands) == set(COMMANDS) and set(_Group.ORDER) == set(COMMANDS)
    lazy = _help(root)
    assert all(f"  {name} " in lazy for name in COMMANDS)
    monkeypatch.setattr(_Group, "short_help_of", lambda self, name: None)  # ask each command
    assert _help(root) == lazy


def _help(root: Any) -> str:
    ctx = root.make_context("fsdpctl", [], resilient_parsing=True)
    return str(root.get_help(ctx))


def _plain_options() -> tuple[Any, list[tuple[Any, Any]]]:
    """A context, and each option of the root and of every command that fsdpctl converts, with
    typer's own conversion of it."""
    from typer._coercion import build_runtime_param

    root = typer.main.get_command(app)
    ctx = root.make_context("fsdpctl", [], resilient_parsing=True)
    found: dict[int, Any] = {}

    def walk(cmd: Any) -> None:
        for p in cmd.get_params(ctx):
            if isinstance(p.get_runtime_param(), PlainValues):
                found[id(p)] = p
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(root)
    return ctx, [(p, build_runtime_param(p.type_descriptor)) for p in found.values()]


WORDS = st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=12), max_size=4)
WORD = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
NUMBER = st.one_of(
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False),
    st.from_regex(r"[+-]?[0-9]{1,17}(\.[0-9]{0,17})?", fullmatch=True),
    st.sampled_from(["1e3", "1_000", " 2", "inf", "-0", ".5", "5.", "0x10", "nan"]),
    WORD,
)
CTX, OPTIONS = _plain_options()


def _values(annotation: Any) -> st.SearchStrategy[Any]:
    """Values a command line (or a default) gives an option of `annotation`."""
    if annotation in (bool, bool | None):
        return st.booleans()
    if annotation in (float, float | None):
        return NUMBER
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return st.one_of(
            st.sampled_from([m.value for m in annotation]), st.sampled_from(list(annotation)), WORD
        )
    if getattr(annotation, "__origin__", None) is list or "list[" in str(annotation):
        return WORDS.map(tuple)
    return WORD


def _converted(runtime: Any, value: Any, p: Any) -> Any:
    try:
        return ("value", repr(runtime.coerce(value, param=p, ctx=CTX)))  # (nan is nan)
    except typer.BadParameter as e:
        return ("refused", str(e))


@settings(max_examples=40, derandomize=True, deadline=None)
@given(data=st.data())
def test_plain_options_convert_as_typer_would(data: st.DataObject) -> None:
    """Every option that fsdpctl converts without pydantic (--env-file paths, --set strings, flags,
    numbers, -o choices, names), of the root and of every command, gives what typer's own
    conversion gives for any value a command line or a default holds, or the same refusal."""
    names = {p.name for p, _ in OPTIONS}
    assert names >= {"env_file", "set_", "debug", "output", "stall_after", "phase", "name", "plot"}
    for p, typers in OPTIONS:
        assert plain_converter(p.type_descriptor.annotation) is not None
        value = data.draw(_values(p.type_descriptor.annotation), label=p.name)
        ours = _converted(p.get_runtime_param(), value, p)
        assert ours == _converted(typers, value, p), (p.name, value)
