"""What the commands that change things share: an outside tool run under a spinner (eksctl,
terraform, docker), a question answered on stdin before anything changes, and the table of check
results (doctor, cluster check). No read verb imports it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from fsdpctl.cli.common import Output, emit, err, out
from fsdpctl.cli.tables import PlainTable, styled
from fsdpctl.errors import BadInput
from fsdpctl.redact import redact

if TYPE_CHECKING:
    from collections.abc import Callable

    from fsdpctl.adapters import shell
    from fsdpctl.cluster.checks import Check


def confirm(question: str, *, refused: str, hint: str) -> None:
    """Ask on stderr and read one line of stdin: "y"/"yes" goes on; anything else, and no answer at
    all (end of input: a closed or empty pipe), is refused before anything changed, one line and
    exit 2 either way. click's confirm would turn end of input into Abort (exit 1) and a bare Enter
    into its default; Ctrl-C stays an interrupt (130)."""
    import sys

    err.print(f"{question} [y/N]: ", end="", markup=False)
    answer = sys.stdin.readline()
    if (
        not answer or not sys.stdin.isatty()
    ):  # no terminal echoed the Enter: the next line starts anew
        err.print()
    if not answer:
        raise BadInput(f"{refused}: no answer (end of input)", hint=hint)
    if answer.strip().lower() not in ("y", "yes"):
        raise BadInput(f"{refused}: answered {answer.strip()[:20]!r}", hint=hint)


def run_tool(
    cmd: shell.Command,
    log: Path,
    *,
    dry_run: bool = False,
    stdin_text: str | None = None,
    on_line: Callable[[str], None] | None = None,
    failed: str = "",
    hint: str | None = None,
    comment: bool = False,
    shown: list[str] | None = None,
) -> None:
    """An outside command line (eksctl, terraform, docker) under a spinner, its output streamed and
    logged; an error naming the log when it fails (`failed`: what to call it, default its first
    words). With `dry_run` the shell adapter runs nothing and the command line goes to stdout (as a
    `# ` comment with `comment`: after a YAML or JSON document there); with `shown` it goes there
    instead, and a real run's command line too (a -o json document's `commands`: what ran, or
    would)."""
    from fsdpctl.adapters import shell
    from fsdpctl.errors import FsdpctlError

    if dry_run:
        prefix = "# " if comment else ""
        say = shown.append if shown is not None else lambda s: out.print(prefix + s, markup=False)
        shell.run(cmd, log_file=log, dry_run=True, on_line=say)
        return
    if shown is not None:
        shown.append(cmd.shell_line())
    words = " ".join(a for a in cmd.argv[1:3] if not a.startswith("-"))
    with err.status(f"{cmd.argv[0]} {words} ... (log: {log})"):
        rc = shell.run(
            cmd, log_file=log, stdin_text=stdin_text, on_line=lambda line: _show(line, on_line)
        )
    if rc != 0:
        raise FsdpctlError(f"{failed or ' '.join(cmd.argv[:3])} failed: see {log}", hint=hint)


def _show(line: str, also) -> None:
    err.print("  " + redact(line), markup=False, highlight=False)
    if also:
        also(line)


CHECK_STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "skipped": "dim"}


def report_checks(checks: list[Check], output: Output) -> None:
    """The table (or -o json) of doctor / cluster check results; exits 1 when any failed."""
    from fsdpctl.cluster.checks import any_failed
    from fsdpctl.errors import ExitCode

    failed = any_failed(checks)
    if not emit({"checks": [c.as_dict() for c in checks], "ok": not failed}, output):
        t = PlainTable("check", "status", "detail", "fix", box=None, pad_edge=False)
        for c in checks:
            t.add_row(c.name, styled(c.status, CHECK_STYLE[c.status]), c.detail, c.fix)
        out.print(t)
    raise typer.Exit(ExitCode.FAILURE if failed else ExitCode.OK)
