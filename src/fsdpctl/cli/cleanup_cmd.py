"""fsdpctl cleanup: finished jobs and what they leave behind; checkpoints only when asked."""

from __future__ import annotations

from typing import Annotated

import typer

from fsdpctl import backends
from fsdpctl.cli.common import DryRunOpt, Output, OutputOpt, emit, ok, out, state, warn


def cleanup(
    ctx: typer.Context,
    checkpoints: Annotated[
        bool, typer.Option("--checkpoints", help="also delete the finished jobs' checkpoints")
    ] = False,
    dry_run: DryRunOpt = False,
    backend: Annotated[str | None, typer.Option("--backend", help="local or eks (default: BACKEND)")] = None,
    output: Output = OutputOpt,
) -> None:
    """Remove finished (succeeded or failed) jobs: on a cluster the job, its pods, its Secret and its
    rendezvous keys in etcd (no RendezvousClosedError on the next run, etcd keeps running); on this machine
    the job's logs, state and etcd data. Checkpoints stay unless --checkpoints. Running jobs are never
    touched.

    Example: fsdpctl cleanup --dry-run
    """
    be = backends.create(backends.placed(state(ctx).config(), None, backend))
    removed = be.cleanup(checkpoints=checkpoints, dry_run=dry_run)
    notes = list(getattr(be, "notes", ()))
    for note in notes:  # a stray file or damaged state, skipped: the rest is cleaned
        warn(note)
    data = {"dry_run": "client" if dry_run else "none", "removed": removed, "skipped": notes}
    if not emit({**data, "checkpoints": checkpoints}, output):
        for item in removed:
            out.print(("would remove " if dry_run else "removed ") + item, markup=False)
    kept = "" if checkpoints else "; checkpoints kept"
    ok(f"{'dry run: ' if dry_run else ''}{len(removed)} items{kept}")
