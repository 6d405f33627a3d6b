"""The job commands on a cluster (BACKEND=eks): the same verbs as on this machine, through `kjobs`."""

from __future__ import annotations

import time

import typer
from rich.table import Table

from fsdpctl.cli.common import emit, end_wait, err, ok, out, warn
from fsdpctl.errors import ExitCode
from fsdpctl.progress import fmt_duration, hung_warning, progress_rows, step_and_loss
from fsdpctl.redact import redact


def run(cfg, *, run_id: str | None, replace: bool, dry_run: bool, detach: bool) -> None:
    from fsdpctl import jobs, kjobs

    kube = kjobs.connect(cfg)
    token = jobs.secret_env(cfg).get("HF_TOKEN", "")
    started = kjobs.run(kube, cfg, run_id=run_id, replace=replace, token=token, server_dry_run=dry_run)
    if dry_run:
        for name in started["objects"]:
            out.print(
                f"{name} (+ Secret {cfg.job_name}-hf-token)" if name.startswith("Namespace") else name,
                markup=False,
            )
        ok(f"dry run: the API server accepted {len(started['objects']) + 1} objects; nothing was created")
        return
    ok(
        f"started {cfg.job_kind} {cfg.job_name} (run {started['run_id']}) in namespace {cfg.job_namespace} "
        f"on {kube.server}"
    )
    if detach:
        err.print("  next: fsdpctl job status -w   fsdpctl job logs -f")
        return
    raise typer.Exit(follow(kube, cfg, cfg.job_name))


def follow(kube, cfg, name: str) -> int:
    """A progress bar from the leader's JSON lines until the job ends. Ctrl-C detaches: the job keeps running."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from fsdpctl import kjobs

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    )
    warned: set[str] = set()
    try:
        with Progress(*columns, console=err) as bar:
            task = bar.add_task("starting", total=None, info="")
            while True:
                r = kjobs.report(kube, cfg, name)
                for line in [*r["problems"], *([r["network_warning"]] if r["network_warning"] else [])]:
                    if line not in warned:
                        warned.add(line)
                        bar.console.print(f"[yellow]warning:[/] {redact(line)}")
                if r["max_steps"]:
                    bar.update(
                        task,
                        description="training",
                        total=r["max_steps"],
                        completed=r["step"],
                        info=f"loss {r['loss']:.4f} | {r['tokens_per_s']:.0f} tok/s",
                    )
                else:
                    bar.update(task, description=r["phase"].lower())
                if r["phase"] in kjobs.FINAL:
                    return outcome(r)
                time.sleep(2)
    except KeyboardInterrupt:
        err.print(f"detached; job {name} keeps running (`fsdpctl job stop` stops it)")
        return ExitCode.OK


def outcome(r: dict) -> int:
    if r["phase"] == "Succeeded":
        ok(f"job {r['job']} succeeded" + (f": loss {r['loss']:.4f} at step {r['step']}" if r["loss"] else ""))
        return ExitCode.OK
    err.print(f"[red]✗[/] job {r['job']} {r['phase']}" + (f": {r['reason']}" if r["reason"] else ""))
    return ExitCode.JOB_FAILED


def status_table(r: dict) -> Table:
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_row("job", f"{r['kind']} {r['job']}  (run {r['run_id']})")
    color = {"Succeeded": "green", "Failed": "red", "Running": "cyan"}.get(r["phase"], "yellow")
    t.add_row("phase", f"[{color}]{r['phase']}[/]" + (f"  ({r['reason']})" if r.get("reason") else ""))
    pods = ", ".join(f"{n} {s.lower()}" for s, n in sorted(r["pods"].items())) or "no pods yet"
    t.add_row(
        "nodes",
        f"{r['nodes']} wanted; pods: {pods}; {r['restarts']} restarts; age {fmt_duration(r['age_s'])}",
    )
    t.add_row("leader", r["leader"] or "-")
    for row in progress_rows(r):
        t.add_row(*row)
    t.add_row("network", r["network"])
    t.add_row("checkpoint", r["checkpoint"] or "-")
    return t


def status(cfg, name: str, output, watch: bool, stall_after: float) -> None:
    from fsdpctl import kjobs

    kube = kjobs.connect(cfg)
    while True:
        r = kjobs.report(kube, cfg, name, stall_after)
        if not emit(r, output):
            out.print(status_table(r))
            for line in r["problems"]:
                warn(line)
            if r["network_warning"]:
                warn(r["network_warning"])
            if r["stalled"]:
                warn(hung_warning(stall_after))
        if not watch or r["phase"] in kjobs.FINAL:
            return
        time.sleep(2)


def logs(cfg, name: str, follow: bool, pod: str | None, all_pods: bool) -> None:
    from fsdpctl import kjobs

    kube = kjobs.connect(cfg)
    for line in kjobs.logs(kube, cfg, name, follow=follow, pod=pod, all_pods=all_pods):
        out.print(redact(line), markup=False, highlight=False)


def stop(cfg, name: str, wait: bool, dry_run: bool) -> None:
    from fsdpctl import kjobs

    kube = kjobs.connect(cfg)
    job = kjobs.get_job(kube, cfg, name)
    if job is None:
        ok(f"no job {name} in {cfg.job_namespace}; nothing to stop")
        return
    if dry_run:
        ok(f"dry run: would delete {job['kind']} {name} (pods get SIGTERM and checkpoint)")
        return
    kjobs.stop(kube, cfg, name, wait=wait)
    ok(f"job {name}: {'stopped and deleted' if wait else 'stopping'}")


def list_(cfg, output) -> None:
    from fsdpctl import kjobs

    reports = kjobs.list_jobs(kjobs.connect(cfg), cfg)
    if emit(reports, output):
        return
    t = Table("job", "kind", "phase", "run", "pods", "step", "loss", "age")
    for r in reports:
        pods = ", ".join(f"{n} {s.lower()}" for s, n in sorted(r["pods"].items())) or "-"
        t.add_row(
            r["job"], r["kind"], r["phase"], r["run_id"], pods, *step_and_loss(r), fmt_duration(r["age_s"])
        )
    out.print(t)


def wait(cfg, name: str, timeout: float | None) -> None:
    from fsdpctl import kjobs

    end_wait(name, kjobs.wait(kjobs.connect(cfg), cfg, name, timeout))
