"""`--set KEY=VALUE` before or after the subcommand (issue 16: "`--set` works only before the
subcommand"), as kubectl and helm take their global flags anywhere on the line: `fsdpctl plan --set
SEQ_LEN=2048` is `fsdpctl --set SEQ_LEN=2048 plan`, with the same precedence (flags > environment >
.env > defaults) and the same one-line errors.

The root group moves every --set it finds after the subcommand to before it
(fsdpctl.cli._sets_first), walking the line as click reads it: a value of another option stays that
option's value, and nothing after `--` moves (click's parser: "--" ends option processing; an option
that takes a value consumes the next argument whatever it looks like, click/parser.py
`_match_long_opt`/`_match_short_opt`). The commands are enumerated from the app itself, as
tests/test_golden.py does, so a new command is covered without a change here.
"""

from __future__ import annotations

import json

import pytest
import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdpctl.cli import SET_OPTS, _sets_first, app

ROOT = typer.main.get_command(app)


def _leaves(cmd=ROOT, path: tuple[str, ...] = ()):
    """Every runnable command path (groups walked, hidden ones included: they parse the line too)."""
    subs = getattr(cmd, "commands", None)
    if not subs:
        yield path, cmd
        return
    for name in sorted(subs):
        yield from _leaves(subs[name], (*path, name))


LEAVES = list(_leaves())
IDS = [" ".join(p) for p, _ in LEAVES]


def test_the_walk_finds_every_command():
    """The enumeration is the app's: groups and verbs both, the ones the issue names among them."""
    paths = {p for p, _ in LEAVES}
    assert {
        ("plan",),
        ("job", "run"),
        ("config", "show"),
        ("manifest",),
        ("cluster", "create"),
    } <= paths
    assert len(paths) >= 20


@pytest.mark.parametrize(("path", "cmd"), LEAVES, ids=IDS)
def test_no_command_has_a_set_option_of_its_own(path, cmd):
    """Moving --set/-s to the root is only right while no command means something else by it."""
    for param in cmd.params:
        assert not set(getattr(param, "opts", ())) & set(SET_OPTS), f"{path}: {param.name}"
        assert not any(
            o.startswith("-s") and len(o) > 2 and o[1] != "-" for o in getattr(param, "opts", ())
        )


def _options(cmd) -> list[tuple[str, bool]]:
    """(spelling, takes a value) for each option of `cmd`."""
    return [
        (opt, not (p.is_flag or p.count))
        for p in cmd.params
        if getattr(p, "opts", None) and p.param_type_name == "option"
        for opt in p.opts
    ]


# values an option may be given that look like --set: they are that option's, and must stay where
# they are
TRICKY = st.sampled_from(
    ["--set", "-s", "--set=SEQ_LEN=1", "-sSEQ_LEN=1", "--", "x", "SEQ_LEN=3", "-o"]
)
SET_ITEM = st.sampled_from(["SEQ_LEN=64", "MODEL=7b", "BAD", "A=b=c", "=x"]).flatmap(
    lambda v: st.sampled_from([["--set", v], ["-s", v], [f"--set={v}"], [f"-s{v}"]])
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.parametrize(("path", "cmd"), LEAVES, ids=IDS)
@given(data=st.data())
def test_every_set_after_the_subcommand_moves_before_it_and_nothing_else_moves(path, cmd, data):
    """For every command, a generated line: --set items before the subcommand, then the command's
    own options (values drawn to look like --set, `-s`, `--`) mixed with --set items, then maybe
    `--` and more: the rewritten line is the root's --set items, then the moved ones in their order
    (the last of a key still wins), then the command line without them; the part after `--` is
    untouched."""
    opts = _options(cmd)
    before = data.draw(st.lists(SET_ITEM, max_size=2))
    pieces = data.draw(
        st.lists(
            st.one_of(
                SET_ITEM.map(lambda s: ("set", s)),
                (st.sampled_from(opts) if opts else st.nothing()).flatmap(
                    lambda o: (
                        TRICKY.map(lambda v: ("opt", [o[0], v]))
                        if o[1]
                        else st.just(("opt", [o[0]]))
                    )
                ),
            ),
            max_size=6,
        )
    )
    after_dashes = data.draw(st.lists(st.one_of(TRICKY, st.just("--set")), max_size=3))
    line = [
        *(a for s in before for a in s),
        *path,
        *(a for _, p in pieces for a in p),
        *(["--", *after_dashes] if after_dashes else []),
    ]
    moved = [
        ["-s", s[0][2:]] if s[0].startswith("-s") and len(s) == 1 else s
        for k, s in pieces
        if k == "set"
    ]
    want = [
        *(a for s in before for a in s),
        *(a for s in moved for a in s),
        *path,
        *(a for k, p in pieces if k == "opt" for a in p),
        *(["--", *after_dashes] if after_dashes else []),
    ]
    assert _sets_first(ROOT, line) == want


def test_a_set_with_no_value_after_the_subcommand_is_clicks_usage_error(cli):
    """`fsdpctl plan --set` says what `fsdpctl --set` says (click: "Option '--set' requires an
    argument."), exit 2, and never takes the subcommand's name as the value."""
    after, before = cli("plan", "--set"), cli("--set")
    assert after.exit_code == before.exit_code == 2
    assert "Option '--set' requires an argument." in after.stderr
    assert after.stderr.splitlines()[-1] == before.stderr.splitlines()[-1]


@pytest.mark.parametrize(("path", "cmd"), LEAVES, ids=IDS)
def test_a_malformed_set_after_any_command_is_the_same_one_line_error(cli, path, cmd):
    """`--set SEQ_LEN` (no `=`) after any command gives exactly what it gives before it: exit 2, one
    `error:` line naming the item and a hint, no traceback, nothing written (the root parses it
    before the command runs)."""
    after = cli(*path, "--set", "SEQ_LEN")
    before = cli("--set", "SEQ_LEN", *path)
    assert (after.exit_code, after.stdout, after.stderr) == (
        before.exit_code,
        before.stdout,
        before.stderr,
    )
    assert after.exit_code == 2
    assert [line for line in after.stderr.splitlines() if line.startswith("error:")] == [
        "error: --set 'SEQ_LEN' is not KEY=VALUE"
    ]
    assert "Traceback" not in after.output
    assert not cli.home.exists() or not any(cli.home.rglob("*"))


SETTINGS_COMMANDS = [
    ("config", "show", "-o", "json"),
    ("config", "validate"),
    ("plan", "-o", "json"),
    ("manifest",),
    ("job", "run", "--dry-run"),
]


@pytest.mark.parametrize("args", SETTINGS_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("item", ["SEQ_LEN=abc", "SEQ_LEN=4", "NO_SUCH_KEY=1", "MODEL=nope"])
def test_a_bad_value_after_the_command_is_the_same_error(cli, args, item):
    """A value the settings refuse (not a number, under the minimum, an unknown key, an unknown
    model): identical exit code and output in both places; exit 2 with one error line naming the
    key."""
    after = cli(*args, "--set", item)
    before = cli("--set", item, *args)
    assert (after.exit_code, after.stdout, after.stderr) == (
        before.exit_code,
        before.stdout,
        before.stderr,
    )
    assert after.exit_code == 2, after.output
    errors = [line for line in after.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and item.split("=")[0] in errors[0], after.stderr


def _shown(cli, *args: str) -> dict:
    r = cli(*args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("where", ["env", ".env"])
def test_a_set_after_the_command_beats_environment_and_env_file(cli, monkeypatch, where):
    """Precedence is unchanged: `config show --set SEQ_LEN=2048` wins over the environment and .env,
    and config show names the flag as the source, exactly as with --set first."""
    if where == "env":
        monkeypatch.setenv("FSDPCTL_SEQ_LEN", "512")
    else:
        (cli.cwd / ".env").write_text("SEQ_LEN=512\n")
    after = _shown(cli, "config", "show", "-o", "json", "--set", "SEQ_LEN=2048")
    before = _shown(cli, "--set", "SEQ_LEN=2048", "config", "show", "-o", "json")
    assert after == before
    assert after["settings"]["SEQ_LEN"] == 2048 and after["sources"]["SEQ_LEN"] == "--set"
    untouched = _shown(cli, "config", "show", "-o", "json")
    assert untouched["settings"]["SEQ_LEN"] == 512 and untouched["sources"]["SEQ_LEN"] != "--set"


def test_the_last_set_of_a_key_wins_wherever_it_stands(cli):
    """--set before and after: the one further right wins, as two --set before the command always did."""
    shown = _shown(
        cli, "--set", "SEQ_LEN=256", "config", "show", "--set", "SEQ_LEN=1024", "-o", "json"
    )
    assert shown["settings"]["SEQ_LEN"] == 1024


def test_plan_and_a_dry_run_take_a_set_after_the_subcommand(cli):
    """The issue's two lines: `plan --set SEQ_LEN=2048` plans at 2048; `job run --set MAX_STEPS=5
    --dry-run` (with JOB_NODES=3, which the dry run shows) prints the same as with --set first, and
    writes no job."""
    plan_after = _shown(cli, "plan", "--set", "SEQ_LEN=2048", "-o", "json")
    assert plan_after == _shown(cli, "--set", "SEQ_LEN=2048", "plan", "-o", "json")
    assert plan_after != _shown(cli, "plan", "-o", "json")
    sets = ("--set", "MAX_STEPS=5", "-s", "JOB_NODES=3")
    after = cli("job", "run", *sets, "--dry-run", "--run-id", "r1")
    before = cli(*sets, "job", "run", "--dry-run", "--run-id", "r1")
    assert after.exit_code == before.exit_code == 0, after.output
    assert (after.stdout, after.stderr) == (before.stdout, before.stderr)
    assert "node 2:" in after.stdout and "3 launchers" in after.stderr
    assert not (cli.home / "jobs").exists()
