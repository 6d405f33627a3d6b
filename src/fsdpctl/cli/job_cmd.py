"""fsdpctl job run|status|logs|stop|list|wait"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from fsdpctl.cli.common import Output, OutputOpt, emit, end_wait, err, ok, out, state, warn
from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.progress import (
    fmt_duration,
    hung_warning,
    progress,
    progress_rows,
    records,
    stalled,
    step_and_loss,
)
from fsdpctl.redact import redact

app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Run and watch training jobs: BACKEND=local on this machine, BACKEND=eks on the cluster "
    "of the kubeconfig (KUBE_CONTEXT).",
)

NameArg = typer.Argument(None, help="job name (default: JOB_NAME)")


def _local():
    from fsdpctl.adapters import local

    return local


def _cfg(ctx: typer.Context):
    return state(ctx).config()


def _eks(ctx: typer.Context) -> bool:
    return _cfg(ctx).backend == "eks"


def _state(name: str) -> dict:
    local = _local()
    st = local.read_state(local.job_dir(name))
    if st is None:
        raise FsdpctlError(
            f"no job named {name!r}",
            hint="`fsdpctl job list` shows the jobs; `fsdpctl job run` starts one",
            code=ExitCode.JOB_NOT_FOUND,
        )
    return st


def job_report(st: dict, stall_after: float) -> dict:
    """Everything `status` shows, computed from the state file and the leader's log."""
    local = _local()
    leader = local.leader_log(st)
    lines = leader.read_text(errors="replace").splitlines() if leader else []
    now = time.time()
    prog = progress(records(lines), now)
    # each worker failure the elastic agent saw (it restarts the group while MAX_RESTARTS allows)
    restarts = sum(f.read_text(errors="replace").count("failed (exitcode:") for f in local.log_files(st))
    alive = sum(local.pid_alive(lz["pid"]) for lz in st.get("launchers", []))
    phase = local.effective_phase(st)
    report = {
        "job": st["job"],
        "phase": phase,
        "run_id": st["run_id"],
        "nodes": st["replicas"],
        "nodes_running": alive,
        "restarts": restarts,
        "age_s": now - st["created"],
        "leader_log": str(leader) if leader else None,
        "checkpoint_dir": st["checkpoint_dir"],
        **{k: v for k, v in prog.items() if k != "summary"},
        "summary": prog["summary"],
        "reason": st.get("reason"),
    }
    report["stalled"] = stalled(phase, prog, now - st.get("started", st["created"]), stall_after)
    return report


def _status_table(r: dict) -> Table:
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_row("job", f"{r['job']}  (run {r['run_id']})")
    color = {"Succeeded": "green", "Failed": "red", "Running": "cyan", "Stopped": "yellow"}.get(
        r["phase"], "white"
    )
    t.add_row("phase", f"[{color}]{r['phase']}[/]" + (f"  ({r['reason']})" if r.get("reason") else ""))
    t.add_row(
        "nodes",
        f"{r['nodes_running']}/{r['nodes']} running, {r['restarts']} restarts, age {fmt_duration(r['age_s'])}",
    )
    for row in progress_rows(r):
        t.add_row(*row)
    t.add_row("checkpoint", r["checkpoint"] or "-")
    t.add_row("leader log", r["leader_log"] or "-")
    return t


@app.command()
def run(
    ctx: typer.Context,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="start and return; watch with `job status`")
    ] = False,
    replace: Annotated[
        bool, typer.Option("--replace", help="stop a running job of the same name first")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print what would run, start nothing")] = False,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="rendezvous id (default: a fresh one)")
    ] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="local or eks (default: BACKEND)")] = None,
) -> None:
    """Start the job (the same PyTorchJob `fsdpctl manifest` renders) and follow it with a progress bar.

    Ctrl-C stops the job the way Kubernetes does (SIGTERM: the trainer checkpoints first).

    Example: fsdpctl --set MODEL=tiny --set JOB_NODES=2 job run --backend local
    """
    from fsdpctl import jobs

    cfg = state(ctx).config(**({"BACKEND": backend} if backend else {}))
    if cfg.backend == "eks":
        from fsdpctl.cli import job_eks

        return job_eks.run(cfg, run_id=run_id, replace=replace, dry_run=dry_run, detach=detach)
    if dry_run:
        from fsdpctl import render
        from fsdpctl.adapters import local

        job = render.render_job(cfg, run_id or render.new_run_id(cfg.job_name))[-1]
        spec = local.spec_from_job(job, local.job_dir(cfg.job_name), render.POD_CHECKPOINT_ROOT)
        for launch in local.launches(spec, "127.0.0.1:<port>", {}):
            out.print(f"node {launch.node}: " + " ".join(launch.argv), markup=False)
        ok(f"dry run: {spec['replicas']} launchers x {spec['nproc_per_node']} processes; nothing started")
        return
    st = jobs.run_local(cfg, run_id=run_id, replace=replace)
    ok(f"started job {st['job']} (run {st['run_id']}), logs in {st['log_dir']}")
    if detach:
        err.print(f"  next: fsdpctl job status {st['job']}   fsdpctl job logs -f {st['job']}")
        return
    final = follow(st["job"])
    raise typer.Exit(report_outcome(final))


def follow(name: str) -> dict:
    """A progress bar fed by the leader's JSON lines until the job ends; returns the final report."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    local = _local()
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=err, transient=False) as bar:
            task = bar.add_task("starting", total=None, info="")
            while True:
                st = _state(name)
                r = job_report(st, stall_after=float("inf"))
                if r["max_steps"]:
                    bar.update(
                        task,
                        description="training",
                        total=r["max_steps"],
                        completed=r["step"],
                        info=f"loss {r['loss']:.4f} | {r['tokens_per_s']:.0f} tok/s",
                    )
                if local.effective_phase(st) not in local.ACTIVE:
                    return r
                time.sleep(0.5)
    except KeyboardInterrupt:
        err.print("stopping (SIGTERM: the trainer saves a checkpoint) ...")
        local.stop(name)
        local.wait(name)
        return job_report(_state(name), stall_after=float("inf"))


def report_outcome(r: dict) -> int:
    s = r.get("summary")
    if s:
        t = Table(title=f"{r['job']}: {r['phase']}", show_header=False)
        t.add_column("what", no_wrap=True)
        t.add_column("value", overflow="fold")  # paths are shown whole, folded, never cut
        t.add_row("steps", f"{s['start_step'] + s['steps']} (this run {s['steps']})")
        t.add_row("loss", f"{s['first_loss']:.4f} -> {s['final_loss']:.4f}")
        t.add_row("tokens/s", f"{s['tokens_per_s']:.0f} ({s['tokens_per_s_per_device']:.0f} per process)")
        t.add_row(
            "state per rank", f"{(s['param_bytes'] + s['optim_bytes']) / 2**20:.2f} MiB (params + optimizer)"
        )
        t.add_row("checkpoint", str(s["checkpoint"]))
        out.print(t)
    if r["phase"] == "Succeeded":
        ok(f"job {r['job']} succeeded; logs: {r['leader_log']}")
        return ExitCode.OK
    if r["phase"] == "Stopped":
        warn(
            f"job {r['job']} stopped at step {r['step']}; `fsdpctl job run` resumes from {r['checkpoint'] or 'the start'}"
        )
        return ExitCode.JOB_STOPPED
    err.print(f"[red]✗[/] job {r['job']} {r['phase']}; last lines of {r['leader_log']}:")
    if r["leader_log"]:
        for line in Path(r["leader_log"]).read_text(errors="replace").splitlines()[-15:]:
            err.print("  " + line, markup=False)
    return ExitCode.JOB_FAILED


@app.command()
def status(
    ctx: typer.Context,
    name: str | None = NameArg,
    output: Output = OutputOpt,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="refresh every 2 s until the job ends")
    ] = False,
    stall_after: Annotated[
        float, typer.Option("--stall-after", help="warn when no step finished for this many s")
    ] = 300,
) -> None:
    """Phase, nodes, restarts and training progress (step, ETA, loss, tokens/s) of a job; on a cluster also
    pods by state, the leader pod, why pods are Pending, and the network path NCCL took (EFA or sockets).

    Example: fsdpctl job status -o json
    """
    name = name or _cfg(ctx).job_name
    if _eks(ctx):
        from fsdpctl.cli import job_eks

        return job_eks.status(_cfg(ctx), name, output, watch, stall_after)
    local = _local()
    while True:
        r = job_report(_state(name), stall_after)
        if not emit(r, output):
            out.print(_status_table(r))
            if r["stalled"]:
                warn(hung_warning(stall_after))
        if not watch or r["phase"] not in local.ACTIVE:
            return
        time.sleep(2)


@app.command()
def logs(
    ctx: typer.Context,
    name: str | None = NameArg,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the job ends")] = False,
    all_: Annotated[bool, typer.Option("--all", help="every node, each line prefixed with its node")] = False,
    node: Annotated[int | None, typer.Option("--node", help="one node's log (local)")] = None,
    pod: Annotated[str | None, typer.Option("--pod", help="one pod's log (eks)")] = None,
) -> None:
    """Logs of the leader (the node that hosts rank 0), one node or pod, or all of them.

    Example: fsdpctl job logs -f --all
    """
    name = name or _cfg(ctx).job_name
    if _eks(ctx):
        from fsdpctl.cli import job_eks

        return job_eks.logs(_cfg(ctx), name, follow_, pod, all_)
    local = _local()
    st = _state(name)
    files = local.log_files(st)
    if node is not None:
        files = [f for f in files if f.stem == f"node-{node}"]
    elif not all_:
        files = [local.leader_log(st)] if local.leader_log(st) else []
    if not files:
        raise FsdpctlError(f"job {name!r} has no such log yet", hint="`fsdpctl job status` shows its nodes")
    offsets = {f: 0 for f in files}
    while True:
        active = local.effective_phase(_state(name)) in local.ACTIVE
        for f in files:
            with open(f, "rb") as fh:
                fh.seek(offsets[f])
                chunk = fh.read()
            offsets[f] += len(chunk)
            for line in chunk.decode(errors="replace").splitlines():
                out.print(redact(f"[{f.stem}] {line}" if all_ else line), markup=False, highlight=False)
        if not follow_ or not active:
            return
        time.sleep(0.3)


@app.command()
def stop(
    ctx: typer.Context,
    name: str | None = NameArg,
    wait_: Annotated[bool, typer.Option("--wait/--no-wait", help="wait until the job has stopped")] = True,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="say what would be stopped")] = False,
) -> None:
    """Stop a job: SIGTERM reaches the trainer, which saves a checkpoint and exits. Idempotent. On a cluster the
    job is deleted with foreground propagation (its pods first).

    Example: fsdpctl job stop
    """
    name = name or _cfg(ctx).job_name
    if _eks(ctx):
        from fsdpctl.cli import job_eks

        return job_eks.stop(_cfg(ctx), name, wait_, dry_run)
    local = _local()
    st = _state(name)
    phase = local.effective_phase(st)
    if phase not in local.ACTIVE:
        ok(f"job {name} is not running ({phase}); nothing to stop")
        return
    if dry_run:
        ok(f"dry run: would send SIGTERM to job {name} (run {st['run_id']}, {st['replicas']} nodes)")
        return
    local.stop(name)
    if wait_:
        st = local.wait(name)
    ok(f"job {name}: {local.effective_phase(st) if wait_ else 'stopping'}")


@app.command("list")
def list_(ctx: typer.Context, output: Output = OutputOpt) -> None:
    """All jobs with their phase and progress.

    Example: fsdpctl job list -o json
    """
    if _eks(ctx):
        from fsdpctl.cli import job_eks

        return job_eks.list_(_cfg(ctx), output)
    reports = [job_report(st, stall_after=float("inf")) for st in _local().list_jobs()]
    if emit(reports, output):
        return
    t = Table("job", "phase", "run", "nodes", "step", "loss", "age")
    for r in reports:
        t.add_row(
            r["job"], r["phase"], r["run_id"], str(r["nodes"]), *step_and_loss(r), fmt_duration(r["age_s"])
        )
    out.print(t)


@app.command()
def wait(
    ctx: typer.Context,
    name: str | None = NameArg,
    timeout: Annotated[float | None, typer.Option("--timeout", help="seconds (default: no limit)")] = None,
) -> None:
    """Wait for a job to end; the exit code tells how: 0 succeeded, 3 failed, 4 not found, 5 timed out, 6 stopped.

    Example: fsdpctl job wait --timeout 3600 && echo trained
    """
    name = name or _cfg(ctx).job_name
    if _eks(ctx):
        from fsdpctl.cli import job_eks

        return job_eks.wait(_cfg(ctx), name, timeout)
    local = _local()
    _state(name)
    end_wait(name, local.effective_phase(local.wait(name, timeout=timeout)))
