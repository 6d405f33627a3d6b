"""One exit-code table (docs/reference/output.md "Exit codes", fsdpctl.errors.ExitCode), held per
command.

Every leaf command of the CLI is found from the click command tree (`typer.main.get_command`), so a
new command is held to the table without a change here. Each row that applies is driven through each
command: success (`--help`), a usage error, a bad setting, the same two with `--debug` (which adds a
traceback and never changes the code); and the situations that only some commands reach: a job that
is already running (local) or already exists (EKS, the Kubernetes API peer), a prompt declined with
"n", with anything else, or not answered at all (end of input).

What the codes follow: click's UsageError.exit_code = 2 and Abort (end of input or Ctrl-C at a
prompt) is turned into exit 1 by click's own standalone main (typer/_click/exceptions.py, core.py);
kubectl exits cmdutil.DefaultErrorExitCode = 1 on every error, AlreadyExists included
(k8s.io/kubectl/pkg/cmd/util/ helpers.go, fatalErrHandler). fsdpctl keeps 1 for failures at runtime
and makes every refusal before a change 2, whichever way it is reached.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import typer.main

from conftest import ROOT, invoke
from fsdpctl.cli import app
from fsdpctl.errors import ExitCode
from invariants import DOCUMENTED, JOB_WAIT, TRACEBACK, check_outcome, error_lines, snapshot
from test_kube import peer  # noqa: F401  (a fixture)


def _leaves(cmd=None, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
    cmd = cmd if cmd is not None else typer.main.get_command(app)
    subs = getattr(cmd, "commands", None)
    if not subs:
        return [(path, cmd)]
    return [leaf for name, sub in sorted(subs.items()) for leaf in _leaves(sub, (*path, name))]


LEAVES = _leaves()
# commands that read no setting: `deploy fetch` goes by the release pins alone
NO_SETTINGS = {("deploy", "fetch"), ("version",)}
# the sandbox is a place, not a job: a bad setting in .env must not keep a user from starting or stopping it
NO_SETTINGS |= {("sandbox", "slurm", verb) for verb in ("up", "down", "status")}


def _has(cmd, flag: str) -> bool:
    return any(flag in getattr(p, "opts", ()) for p in cmd.params)


def _required_args(cmd) -> tuple[str, ...]:
    """A value for each required argument (`job diff A B`), so the command gets as far as its
    settings."""
    return tuple("x" for p in cmd.params if p.param_type_name == "argument" and p.required)


def test_the_readme_table_is_the_exit_code_enum():
    """The docs' table (docs/reference/output.md, "Exit codes") names every code of
    fsdpctl.errors.ExitCode with its value, and nothing else; the codes the invariants checker allows
    are all in it."""
    page = (ROOT / "docs" / "reference" / "output.md").read_text()
    section = page.split("## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| (\w+) \| (.+) \|$", section, re.M)
    assert {int(code): name for code, name, _ in rows} == {int(e): e.name for e in ExitCode}
    assert all(when.strip() for _, _, when in rows)
    assert {int(c) for c in JOB_WAIT} | {int(c) for c in DOCUMENTED} <= {int(e) for e in ExitCode}


@pytest.mark.parametrize("path", [p for p, _ in LEAVES], ids=[" ".join(p) for p, _ in LEAVES])
def test_every_command_keeps_the_table(path, cli):
    """Per command: --help is 0; an unknown option is click's usage error, 2; a bad setting is one line
    naming the key, 2, nothing written (a command with --dry-run gets it, so nothing could start); with
    --debug each code is the same and the bad setting shows its traceback."""
    cmd = dict(LEAVES)[path]
    helped = invoke(*path, "--help")
    assert helped.exit_code == ExitCode.OK and "Usage:" in helped.stdout, helped.output
    dry = ("--dry-run",) if _has(cmd, "--dry-run") else ()
    for debug in ((), ("--debug",)):
        usage = invoke(*debug, *path, "--no-such-option")
        assert usage.exit_code == ExitCode.BAD_INPUT, usage.output
        assert any("--no-such-option" in line for line in error_lines(usage.stderr)), usage.stderr
        if path in NO_SETTINGS:
            continue
        before = snapshot(cli.home, cli.cwd)
        bad = invoke(*debug, "--set", "JOB_NODES=abc", *path, *_required_args(cmd), *dry)
        check_outcome(
            bad,
            written_before=before,
            written_after=snapshot(cli.home, cli.cwd),
            allowed_codes={ExitCode.BAD_INPUT},
            names=("JOB_NODES",),
            debug=bool(debug),
        )
        assert (TRACEBACK in bad.stderr) == bool(debug), bad.stderr


def test_the_commands_that_read_no_setting_are_the_ones_named(cli, monkeypatch):
    """NO_SETTINGS is not a way to skip a command: `deploy fetch` with no release file to fetch
    succeeds with a bad setting, since it never reads one."""
    from fsdpctl.cluster import deploy

    monkeypatch.setattr(deploy, "releases", lambda: {})
    assert NO_SETTINGS <= set(dict(LEAVES))
    r = invoke("--set", "JOB_NODES=abc", "deploy", "fetch")
    assert r.exit_code == ExitCode.OK, r.output
    r = invoke("--set", "JOB_NODES=abc", "version")
    assert r.exit_code == ExitCode.OK and r.stdout.startswith("fsdpctl "), r.output
    r = invoke("--set", "JOB_NODES=abc", "sandbox", "slurm", "status")
    assert r.exit_code == ExitCode.OK and "no Slurm sandbox" in r.stderr, r.output


def _terraform_state(cli) -> None:
    from test_cluster_delete import CRAFTED_STATE

    state_dir = cli.home / "clusters/fsdp-eks/terraform"
    state_dir.mkdir(parents=True)
    (state_dir / "terraform.tfstate").write_text(json.dumps(CRAFTED_STATE))


@pytest.mark.parametrize("answer", ["n\n", "no\n", "\n", "maybe\n", "", None])
def test_a_declined_prompt_is_2_however_it_is_declined(answer, cli):
    """`cluster delete` (terraform, a state with resources: read offline, no AWS needed) asks; "n",
    an empty line, anything but y/yes and no answer at all (end of input: an empty pipe, or no
    stdin) are all the same refusal, exit 2, with --debug too. End of input says so instead of
    click's bare `Aborted!`. A refusal writes nothing: the cluster's directory (terraform's state
    and the variables it was made with) is byte for byte as it was."""
    _terraform_state(cli)
    before = tree(cli.home / "clusters")
    for debug in ((), ("--debug",)):
        r = invoke(*debug, "cluster", "delete", "--tool", "terraform", input=answer)
        assert r.exit_code == ExitCode.BAD_INPUT, r.output
        [line] = error_lines(r.stderr)
        assert line.startswith("error: not confirmed"), r.stderr
        assert ("no answer" in line) == (not answer), line
        assert "Aborted" not in r.output and "destroy" not in r.stdout
        assert tree(cli.home / "clusters") == before


def tree(root) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_a_job_whose_lock_another_verb_holds_is_2(cli, monkeypatch):
    """A start of a local job whose lock another verb holds past the bounded wait: flock(2) locks
    belong to the open file description, so a lock held here through its own open() is refused to
    the command as a lock held by another process would be; the line names the holder as the
    kernel does (/proc/locks)."""
    from fsdpctl.cli.quickstart_cmd import QUICKSTART
    from fsdpctl.job import home, lock

    monkeypatch.setattr(lock, "WAIT_S", 0.2)
    sets = [a for k, v in QUICKSTART.items() for a in ("--set", f"{k}={v}")]
    with lock.held(home.job_dir("quickstart")) as held:
        assert held
        for debug in ((), ("--debug",)):
            r = invoke(*debug, *sets, "job", "run", "-d")
            assert r.exit_code == ExitCode.BAD_INPUT, r.output
            first = error_lines(r.stderr)[0]
            assert "job quickstart is busy" in first and f"pid {os.getpid()}" in first, r.stderr


def test_a_job_that_already_exists_on_eks_is_2(peer):  # noqa: F811
    """The same refusal on EKS (the Kubernetes API peer): the job exists, no --replace: 2, as
    locally."""
    from test_kube import cli as kcli
    from test_kube import install_operator

    install_operator(peer)
    assert kcli("job", "run", "-d").exit_code == ExitCode.OK
    for debug in ((), ("--debug",)):
        r = kcli(*debug, "job", "run", "-d")
        assert r.exit_code == ExitCode.BAD_INPUT, r.output
        assert "job fsdp is running" in error_lines(r.stderr)[0], r.stderr
    assert len(peer.objects("pytorchjobs")) == 1


def test_clicks_abort_is_a_refusal_or_an_interrupt(capsys):
    """click raises Abort for end of input or Ctrl-C in its own prompts and parsing (core.py `main`:
    `except (EOFError, KeyboardInterrupt): raise Abort()`), which its standalone main exits 1 with
    (`Aborted!`). fsdpctl's group (fsdpctl.cli._Group) makes the first a refusal, 2, and the second
    an interrupt, 130."""
    import typer

    from fsdpctl.cli import _Group

    def raising(cause: BaseException):
        tiny = typer.Typer(cls=_Group)

        @tiny.command()
        def ask() -> None:
            raise typer.Abort() from cause

        @tiny.command()
        def other() -> None:  # two commands: a group, as fsdpctl's root is
            pass

        return tiny

    for cause, code, said in (
        (EOFError(), 2, "no answer"),
        (KeyboardInterrupt(), 130, "interrupted"),
    ):
        with pytest.raises(SystemExit) as ended:
            raising(cause)(["ask"], prog_name="fsdpctl")
        assert ended.value.code == code
        assert said in capsys.readouterr().err
