"""fsdpctl cleanup: ended jobs and what they leave behind; checkpoints only when asked. Asks
first."""

from __future__ import annotations

from typing import Annotated

import typer

from fsdpctl import backends, files
from fsdpctl.cli import completion
from fsdpctl.cli.common import DryRunOpt, Output, OutputOpt, emit, err, ok, out, state, warn
from fsdpctl.cli.tools import confirm
from fsdpctl.job import listing
from fsdpctl.settings import Config
from fsdpctl.targets import NAMES

# The options, as cleanup takes them (in its signature's order)
CleanupNameArg = Annotated[
    str | None,
    typer.Argument(
        metavar="NAME",
        help="only this job (default: every ended job)",
        autocompletion=completion.job_names,
    ),
]
CheckpointsOpt = Annotated[
    bool, typer.Option("--checkpoints", help="also delete the ended jobs' checkpoints")
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="remove without asking")]
CleanupForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="also what fsdpctl cannot prove: what carries no owner mark (made before owner "
        'marks, or by hand), a job whose place cannot prove it ended (Slurm: "Invalid job id" '
        "while its log is fresh); never another home's or job's, never a running job",
    ),
]
CleanupBackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend",
        help=f"{' or '.join(NAMES)} (default: every backend holding a job here, and BACKEND)",
    ),
]


def cleanup(
    ctx: typer.Context,
    name: CleanupNameArg = None,
    checkpoints: CheckpointsOpt = False,
    yes: YesOpt = False,
    force: CleanupForceOpt = False,
    dry_run: DryRunOpt = False,
    backend: CleanupBackendOpt = None,
    output: Output = OutputOpt,
) -> None:
    """Remove ended jobs and what they left; checkpoints only with --checkpoints. Ended: succeeded,
    failed or stopped. On a cluster the job,
    its pods, its Secret and its rendezvous keys in etcd (no RendezvousClosedError on the next run,
    etcd keeps running); on this machine the job's logs, state, etcd data and node disks, and a
    network its supervisor did not tear down; on Slurm its runs' scripts and logs on the shared file
    system. Checkpoints stay unless --checkpoints; run records stay (`job diff` reads them). Running
    jobs are never touched, nor (without --force) jobs whose place cannot say whether they still run.
    Only what carries this home's owner mark goes (docs/ownership.md); each line names the owner,
    and what is kept says why ("kept <what>: <why> (owner: ...)"). Lists what it would remove and
    asks first, unless --yes.

    Example: fsdpctl cleanup --dry-run
    """
    cfg = state(ctx).config()
    backends.check_name(backend)
    job = files.job_name(name) if name is not None else None
    places = _places(cfg, job, backend)
    removed, notes = _remove(places, job, checkpoints, force, dry_run=dry_run, yes=yes)
    kept = [line for be in places for line in getattr(be, "kept", ())]
    data = {"dry_run": "client" if dry_run else "none", "removed": removed, "skipped": notes}
    if not emit({**data, "kept": kept, "checkpoints": checkpoints}, output):
        _say(removed, kept, dry_run)
    left = "" if checkpoints else "; checkpoints kept"
    left += f"; {len(kept)} kept (not proven this home's)" if kept else ""
    ok(f"{'dry run: ' if dry_run else ''}{len(removed)} items{left}")


def _remove(
    places: list[backends.Backend],
    job: str | None,
    checkpoints: bool,
    force: bool,
    *,
    dry_run: bool,
    yes: bool,
) -> tuple[list[str], list[str]]:
    """What went (or would go, --dry-run) and the backends' notes. Without --yes or --dry-run, a
    dry pass first lists the items and asks: nothing listed, nothing removed."""

    def clean(dry: bool) -> list[str]:
        return [
            item
            for be in places
            for item in be.cleanup(checkpoints=checkpoints, dry_run=dry, job=job, force=force)
        ]

    warned: list[str] = []
    doomed: list[str] = []
    if not dry_run and not yes:
        doomed = clean(True)
        warned = _warn_notes(places, warned)
        if doomed:
            for item in doomed:  # on stderr: with -o json stdout holds the document alone
                err.print("would remove " + item, markup=False, highlight=False)
            confirm(
                f"remove these {len(doomed)} items?",
                refused="cleanup: nothing removed",
                hint="answer y, or pass --yes (--dry-run shows what would go)",
            )
    removed = clean(dry_run) if dry_run or yes or doomed else []
    return removed, _warn_notes(places, warned)


def _say(removed: list[str], kept: list[str], dry_run: bool) -> None:
    """The lines every backend's items make (docs/ownership.md): "removed <what> (owner: ...)" or
    "would remove ...", then "kept <what>: <why> (owner: ...)"."""
    for item in removed:
        out.print(("would remove " if dry_run else "removed ") + item, markup=False)
    for line in kept:
        out.print("kept " + line, markup=False)


def _places(cfg: Config, job: str | None, flag: str | None) -> list[backends.Backend]:
    """The backends to clean: --backend's; a named job's own (where its state says it runs); else
    every backend holding a job here, and BACKEND."""
    if flag is not None or job is not None:
        return [backends.create(backends.placed(cfg, job, flag, acts=True))]
    get = backends.factory(cfg)
    return [get(n) for n in listing.backends_here(cfg.backend)]


def _warn_notes(places: list[backends.Backend], warned: list[str]) -> list[str]:
    """The backends' notes (a stray file, a damaged state: skipped, the rest is cleaned), each
    warned once however often the command looked."""
    notes = list(dict.fromkeys([*warned, *(n for be in places for n in getattr(be, "notes", ()))]))
    for note in notes[len(warned) :]:
        warn(note)
    return notes
