"""fsdpctl cleanup: finished jobs and what they leave behind; checkpoints only when asked."""

from __future__ import annotations

from typing import Annotated

import typer

from fsdpctl.cli.common import ok, out, state


def cleanup(
    ctx: typer.Context,
    checkpoints: Annotated[
        bool, typer.Option("--checkpoints", help="also delete the finished jobs' checkpoints")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="list what would be removed")] = False,
) -> None:
    """Remove finished (succeeded or failed) jobs: on a cluster the job, its pods, its Secret and its rendezvous
    keys in etcd (no RendezvousClosedError on the next run, etcd keeps running); on this machine the job's logs,
    state and etcd data. Checkpoints stay unless --checkpoints. Running jobs are never touched.

    Example: fsdpctl cleanup --dry-run
    """
    cfg = state(ctx).config()
    if cfg.backend == "eks":
        from fsdpctl import kjobs

        removed = kjobs.cleanup(kjobs.connect(cfg), cfg, checkpoints=checkpoints, dry_run=dry_run)
    else:
        removed = _local(checkpoints, dry_run)
    for item in removed:
        out.print(("would remove " if dry_run else "removed ") + item, markup=False)
    ok(
        f"{'dry run: ' if dry_run else ''}{len(removed)} items"
        + ("" if checkpoints else "; checkpoints kept")
    )


def _local(checkpoints: bool, dry_run: bool) -> list[str]:
    import shutil

    from fsdpctl.adapters import local

    removed = []
    for st in local.list_jobs():
        if local.effective_phase(st) in local.ACTIVE:
            continue
        jdir = local.job_dir(st["job"])
        for child in sorted(jdir.iterdir()):
            if child.name == "checkpoints" and not checkpoints:
                continue
            removed.append(str(child))
            if not dry_run:
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    return removed
