"""fsdpctl cleanup: ended jobs and what they leave behind; checkpoints only when asked. Asks first."""

from __future__ import annotations

from typing import Annotated

import typer

from fsdpctl import backends
from fsdpctl.cli.common import (
    DryRunOpt,
    Output,
    OutputOpt,
    confirm,
    emit,
    err,
    ok,
    out,
    state,
    warn,
)
from fsdpctl.targets import NAMES


def cleanup(
    ctx: typer.Context,
    checkpoints: Annotated[
        bool, typer.Option("--checkpoints", help="also delete the ended jobs' checkpoints")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="remove without asking")] = False,
    dry_run: DryRunOpt = False,
    backend: Annotated[
        str | None, typer.Option("--backend", help=f"{' or '.join(NAMES)} (default: BACKEND)")
    ] = None,
    output: Output = OutputOpt,
) -> None:
    """Remove ended jobs (succeeded, failed or stopped) and what they left: on a cluster the job,
    its pods, its Secret and its rendezvous keys in etcd (no RendezvousClosedError on the next run,
    etcd keeps running); on this machine the job's logs, state, etcd data and node disks, and a
    network its supervisor did not tear down. Checkpoints stay unless --checkpoints; run records
    stay (`job diff` reads them). Running jobs are never touched. Lists what it would remove and
    asks first, unless --yes.

    Example: fsdpctl cleanup --dry-run
    """
    be = backends.create(backends.placed(state(ctx).config(), None, backend))
    warned: list[str] = []
    if not dry_run and not yes:
        doomed = be.cleanup(checkpoints=checkpoints, dry_run=True)
        warned = _warn_notes(be, warned)
        if doomed:
            for item in doomed:  # on stderr: with -o json stdout holds the document alone
                err.print("would remove " + item, markup=False, highlight=False)
            confirm(
                f"remove these {len(doomed)} items?",
                refused="cleanup: nothing removed",
                hint="answer y, or pass --yes (--dry-run shows what would go)",
            )
    removed = (
        be.cleanup(checkpoints=checkpoints, dry_run=dry_run) if dry_run or yes or doomed else []
    )
    notes = _warn_notes(be, warned)
    data = {"dry_run": "client" if dry_run else "none", "removed": removed, "skipped": notes}
    if not emit({**data, "checkpoints": checkpoints}, output):
        for item in removed:
            out.print(("would remove " if dry_run else "removed ") + item, markup=False)
    kept = "" if checkpoints else "; checkpoints kept"
    ok(f"{'dry run: ' if dry_run else ''}{len(removed)} items{kept}")


def _warn_notes(be: backends.Backend, warned: list[str]) -> list[str]:
    """The backend's notes (a stray file, a damaged state: skipped, the rest is cleaned), each
    warned once however often the command looked."""
    notes = list(dict.fromkeys([*warned, *getattr(be, "notes", ())]))
    for note in notes[len(warned) :]:
        warn(note)
    return notes
