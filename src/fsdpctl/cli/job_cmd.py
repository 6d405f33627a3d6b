"""fsdpctl job run|status|logs|stop|list|wait: each verb resolves its backend once and prints."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from fsdpctl import backends, files
from fsdpctl.backends import FINAL, Backend
from fsdpctl.cli import job_record_cmd, job_view
from fsdpctl.cli.common import (
    DryRunOpt,
    ForceOpt,
    Output,
    OutputOpt,
    ServerDryRunOpt,
    admit,
    command_group,
    emit,
    end_wait,
    err,
    finite,
    ok,
    out,
    state,
    warn,
)
from fsdpctl.redact import redact

app = command_group(
    "Run and watch training jobs: BACKEND=local on this machine, BACKEND=eks on the cluster "
    "of the kubeconfig (KUBE_CONTEXT)."
)

NameArg = typer.Argument(None, help="job name (default: JOB_NAME)")
BackendOpt = Annotated[
    str | None,
    typer.Option("--backend", help="local or eks (default: where the job was started, else BACKEND)"),
]


def _resolve(ctx: typer.Context, name: str | None, backend: str | None) -> tuple[Backend, str]:
    """The backend holding job NAME: --backend, else the one it was started on, else BACKEND."""
    cfg = state(ctx).config()
    name = files.job_name(name) if name is not None else cfg.job_name  # before any path is built from it
    return backends.create(backends.placed(cfg, name, backend)), name


@app.command()
def run(
    ctx: typer.Context,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="start and return; watch with `job status`")
    ] = False,
    replace: Annotated[
        bool, typer.Option("--replace", help="stop a running job of the same name first")
    ] = False,
    dry_run: DryRunOpt = False,
    server_dry_run: ServerDryRunOpt = False,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="rendezvous id (default: a fresh one)")
    ] = None,
    backend: BackendOpt = None,
    force: ForceOpt = False,
) -> None:
    """Start the job (the same PyTorchJob `fsdpctl manifest` renders) and follow it with a progress bar.
    A job that does not fit or cannot be scheduled is refused before anything is created, unless --force.

    Ctrl-C stops a local job the way Kubernetes does (SIGTERM: the trainer checkpoints first); on a cluster it
    detaches and the job keeps running.

    Example: fsdpctl --set MODEL=tiny --set JOB_NODES=2 job run --backend local
    """
    backends.check_name(backend)
    run_id = files.run_id(run_id) if run_id is not None else None
    cfg = state(ctx).config(**({"BACKEND": backend} if backend else {}))
    admit(cfg, force=force)
    be = backends.create(cfg)
    started = be.run(run_id=run_id, replace=replace, dry_run=dry_run, server_dry_run=server_dry_run)
    if dry_run or server_dry_run:
        for line in started.dry_run_lines:
            out.print(line, markup=False)
        ok(f"dry run: {started.where}; nothing was created")
        return
    ok(f"started job {started.job} (run {started.run_id}) on {be.name}: {started.where}")
    if detach:
        err.print(f"  next: fsdpctl job status {started.job}   fsdpctl job logs -f {started.job}")
        return
    raise typer.Exit(job_view.outcome(be, started.job, job_view.follow(be, started.job)))


@app.command()
def status(
    ctx: typer.Context,
    name: str | None = NameArg,
    output: Output = OutputOpt,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="refresh every 2 s until the job ends")
    ] = False,
    stall_after: Annotated[
        float,
        typer.Option("--stall-after", help="warn when no step finished for this many s", callback=finite()),
    ] = 300,
    backend: BackendOpt = None,
) -> None:
    """Phase, nodes, restarts and training progress (step, ETA, loss, tokens/s) of a job; on a cluster also
    pods by state, the leader pod, why pods are Pending, and the network path NCCL took (EFA or sockets).

    Example: fsdpctl job status -o json
    """
    be, name = _resolve(ctx, name, backend)
    while True:
        r = be.report(name, stall_after)
        if not emit(r, output):
            job_view.print_status(r, stall_after)
        if not watch or r["phase"] in FINAL:
            return
        time.sleep(2)


@app.command()
def logs(
    ctx: typer.Context,
    name: str | None = NameArg,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the job ends")] = False,
    all_: Annotated[bool, typer.Option("--all", help="every node, each line prefixed with its node")] = False,
    node: Annotated[
        int | None, typer.Option("--node", help="one node's log (local; eks: worker pod N)")
    ] = None,
    pod: Annotated[str | None, typer.Option("--pod", help="one pod's log (eks)")] = None,
    backend: BackendOpt = None,
) -> None:
    """Logs of the leader (the node that hosts rank 0), one node or pod, or all of them.

    Example: fsdpctl job logs -f --all
    """
    be, name = _resolve(ctx, name, backend)
    for line in be.logs(name, follow=follow_, all_=all_, node=node, pod=pod):
        out.print(redact(line), markup=False, highlight=False)


@app.command()
def stop(
    ctx: typer.Context,
    name: str | None = NameArg,
    wait_: Annotated[bool, typer.Option("--wait/--no-wait", help="wait until the job has stopped")] = True,
    dry_run: DryRunOpt = False,
    backend: BackendOpt = None,
) -> None:
    """Stop a job: SIGTERM reaches the trainer, which saves a checkpoint and exits. Idempotent. On a cluster
    the job is deleted with foreground propagation (its pods first).

    Example: fsdpctl job stop
    """
    be, name = _resolve(ctx, name, backend)
    ok(be.stop(name, wait=wait_, dry_run=dry_run))


@app.command("list")
def list_(ctx: typer.Context, output: Output = OutputOpt, backend: BackendOpt = None) -> None:
    """All jobs with their phase and progress.

    Example: fsdpctl job list -o json
    """
    be, _ = _resolve(ctx, None, backend or state(ctx).config().backend)
    reports = be.list_jobs()
    for note in getattr(be, "notes", ()):  # a stray file or damaged state, skipped: every other job is listed
        warn(note)
    if not emit(reports, output):
        out.print(job_view.list_table(reports))


@app.command()
def wait(
    ctx: typer.Context,
    name: str | None = NameArg,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="seconds (default: no limit)", callback=finite())
    ] = None,
    backend: BackendOpt = None,
) -> None:
    """Wait for a job to end; the exit code says how: 0 succeeded, 3 failed, 4 not found, 5 timed out,
    6 stopped.

    Example: fsdpctl job wait --timeout 3600 && echo trained
    """
    be, name = _resolve(ctx, name, backend)
    end_wait(name, be.wait(name, timeout))


job_record_cmd.register(app)  # describe, rerun, diff: a run's record (after the verbs above in the help)
