"""fsdpctl job run|status|logs|stop|list|wait: each verb resolves its backend once and prints."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from enum import Enum
from typing import Annotated

import typer

from fsdpctl import backends, files
from fsdpctl.backends import LogLine
from fsdpctl.cli import job_record_cmd, job_view, job_wait
from fsdpctl.cli.admission import admit
from fsdpctl.cli.common import (
    BackendOpt,
    DetachOpt,
    DryRunOpt,
    ForceOpt,
    NameArg,
    Output,
    OutputOpt,
    ReplaceOpt,
    ServerDryRunOpt,
    ViewOutput,
    ViewOutputOpt,
    command_group,
    dry_run_mode,
    emit,
    end_wait,
    finite,
    note,
    ok,
    out,
    plain,
    resolve_job,
    state,
    warn,
)
from fsdpctl.errors import BadInput, ExitCode
from fsdpctl.job import crilog, failures, listing, waitfor
from fsdpctl.job.reports import FINAL, Phase
from fsdpctl.redact import redact

app = command_group(
    "Run and watch training jobs: on this machine (BACKEND=local), an EKS cluster (eks: the "
    "kubeconfig's, KUBE_CONTEXT) or a Slurm cluster (slurm)."
)


class LogFormat(str, Enum):
    """`job logs -o`: lines for people, or one JSON object per line."""

    text = "text"
    json = "json"


@app.command()
def run(
    ctx: typer.Context,
    detach: DetachOpt = False,
    replace: ReplaceOpt = False,
    dry_run: DryRunOpt = False,
    server_dry_run: ServerDryRunOpt = False,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="rendezvous id (default: a fresh one)")
    ] = None,
    backend: BackendOpt = None,
    force: ForceOpt = False,
    output: Output = OutputOpt,
) -> None:
    """Start the job (the same PyTorchJob `fsdpctl manifest` renders) and follow it with a progress
    bar. A job that does not fit or cannot be scheduled is refused before anything is created,
    unless --force.

    Ctrl-C stops a local job the way Kubernetes does (SIGTERM: the trainer checkpoints first); on a
    cluster it detaches and the job keeps running.

    With -o json (or yaml) stdout gets one object: job, run_id, backend, where; a followed run adds
    `report`, the final `job status` report (null when detached), once the job ends. Messages stay
    on stderr.

    Example: fsdpctl --set MODEL=tiny --set JOB_NODES=2 job run --backend local
    """
    backends.check_name(backend)
    dry_run_mode(dry_run, server_dry_run)
    run_id = files.run_id(run_id) if run_id is not None else None
    cfg = state(ctx).config(
        **({"BACKEND": backend} if backend else {}), set_by={"BACKEND": "--backend"}
    )
    admit(cfg, force=force)
    be = backends.create(cfg)
    job_view.launch(
        be,
        cfg,
        run_id=run_id,
        replace=replace,
        dry_run=dry_run,
        server_dry_run=server_dry_run,
        detach=detach,
        output=output,
    )


@app.command()
def status(
    ctx: typer.Context,
    name: str | None = NameArg,
    output: ViewOutput = ViewOutputOpt,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            "-w",
            help="refresh every 2 s until the job ends (redrawn in place on a terminal; elsewhere a "
            "new view only when it changed)",
        ),
    ] = False,
    stall_after: Annotated[
        float,
        typer.Option(
            "--stall-after", help="warn when no step finished for this many s", callback=finite()
        ),
    ] = 300,
    backend: BackendOpt = None,
    plot: Annotated[
        bool | None,
        typer.Option(
            "--plot/--no-plot",
            help="draw loss and tokens/s over steps below the table (default: only on a terminal)",
        ),
    ] = None,
) -> None:
    """A job's phase, nodes, restarts and training progress. Progress: step, ETA, loss, tokens/s; on
    a cluster also pods by state, the leader pod, why pods are Pending, and the network path NCCL
    took (EFA or sockets). On a terminal (or with --plot) the loss and tokens/s curves follow the
    table; never with -o json/yaml.

    Example: fsdpctl job status -o json
    """
    from fsdpctl.cli import job_status_view  # the status view: `job list` does not pay for it

    be, name = resolve_job(ctx, name, backend, reads=True)
    if watch and output in (ViewOutput.table, ViewOutput.wide):
        job_status_view.watch_status(be, name, stall_after, job_status_view.want_plot(plot))
        return
    _show_status(be, name, output, watch=watch, stall_after=stall_after, plot=plot)


def _show_status(
    be: backends.Backend,
    name: str,
    output: ViewOutput,
    *,
    watch: bool,
    stall_after: float,
    plot: bool | None,
) -> None:
    """The report once (exit 1 when its phase is Unknown), or with --watch and -o json|yaml|name
    every 2 s until the job ends."""
    from fsdpctl.cli import job_status_view

    while True:
        r = be.report(name, stall_after)
        if not emit(r, output):
            job_status_view.print_status(r, stall_after)
            if job_status_view.want_plot(plot):
                job_status_view.print_curves(be.history(name))
        if not watch and r["phase"] == Phase.UNKNOWN:  # shown, and told apart from "fine"
            raise typer.Exit(ExitCode.FAILURE)
        if not watch or r["phase"] in FINAL:
            return
        time.sleep(2)


# `job logs`' options, in its signature's order
FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the job ends")]
AllNodesOpt = Annotated[
    bool,
    typer.Option("--all", help="every node (pod), each line prefixed with [node-N] ([pod/NAME/C])"),
]
NodeOpt = Annotated[
    int | None, typer.Option("--node", help="one node's log (local; eks: worker pod N)")
]
PodOpt = Annotated[str | None, typer.Option("--pod", help="one pod's log (eks)")]
TailOpt = Annotated[
    int | None,
    typer.Option(
        "--tail", help="the last N lines of each node or pod (-1: all); with -f, then follow"
    ),
]
SinceOpt = Annotated[
    str | None, typer.Option("--since", help="only lines of the last 10s, 5m, 2h, 1h30m")
]
TimestampsOpt = Annotated[
    bool,
    typer.Option("--timestamps", help="each line after its time (RFC 3339, nanoseconds, UTC)"),
]
LogFormatOpt = Annotated[
    LogFormat, typer.Option("--output", "-o", help="text, or json: one object per line")
]
TrainerOnlyOpt = Annotated[
    bool,
    typer.Option(
        "--trainer-only",
        help="leave out torch's and torchrun's own logging (agent, rendezvous, c10d)",
    ),
]


@app.command()
def logs(
    ctx: typer.Context,
    name: str | None = NameArg,
    follow_: FollowOpt = False,
    all_: AllNodesOpt = False,
    node: NodeOpt = None,
    pod: PodOpt = None,
    tail: TailOpt = None,
    since: SinceOpt = None,
    timestamps: TimestampsOpt = False,
    output: LogFormatOpt = LogFormat.text,
    trainer_only: TrainerOnlyOpt = False,
    backend: BackendOpt = None,
) -> None:
    """A job's logs, as `kubectl logs` shows a pod's. The leader's (the node that hosts rank 0),
    one node or pod, or all of them, as `kubectl
    logs` shows a pod's. The trainer's JSON event lines are not shown raw: a step or summary only as
    the human line the trainer prints with it, a leader or checkpoint event as a short line. `-o
    json`: one JSON object per line for machines (node or pod, time, and the event's fields or the
    text).

    Example: fsdpctl job logs -f --all --tail 20 --since 5m --timestamps
    """
    tail, since_s = _log_window(tail, since)
    be, name = resolve_job(ctx, name, backend)
    _check_node(be, name, node)
    shown = _shown(output, trainer_only)
    quiet = job_wait.Quiet(be, name) if follow_ else contextlib.nullcontext()
    with quiet:
        for line in be.logs(
            name,
            follow=follow_,
            all_=all_,
            node=node,
            pod=pod,
            tail=tail,
            since_s=since_s,
            keep=shown,
        ):
            if not shown(line):
                continue
            if isinstance(quiet, job_wait.Quiet):
                quiet.shown()
            _print_line(line, output, all_, timestamps)


def _shown(output: LogFormat, trainer_only: bool) -> Callable[[LogLine], bool]:
    """Which lines are printed: what --tail counts, so the last N are N printed lines."""

    def shown(line: LogLine) -> bool:
        if trainer_only and failures.from_torch(line.text):
            return False
        return (
            output == LogFormat.json
            or job_view.log_text(line, prefix=False, timestamps=False) is not None
        )

    return shown


def _check_node(be: backends.Backend, name: str, node: int | None) -> None:
    """--node names one of the job's nodes: asked of its report only when given."""
    nodes = be.report(name)["nodes"] if node is not None else 0
    if node is not None and not 0 <= node < nodes:
        raise BadInput(
            f"--node {node}: job {name} has nodes 0 to {nodes - 1}",
            hint="`fsdpctl job status` shows its nodes",
        )


def _print_line(line: LogLine, output: LogFormat, all_: bool, timestamps: bool) -> None:
    if output == LogFormat.json:
        out.print(
            json.dumps(plain(job_view.log_record(line)), allow_nan=False),
            markup=False,
            highlight=False,
        )
    else:
        text = job_view.log_text(line, prefix=all_, timestamps=timestamps)
        if text is not None:
            out.print(redact(text), markup=False, highlight=False)


def _log_window(tail: int | None, since: str | None) -> tuple[int | None, float | None]:
    """--tail and --since as kubectl checks them: a tail of -1 or more (-1: all), a positive
    duration."""
    if tail is not None and tail < -1:
        raise BadInput(f"--tail {tail} is below -1", hint="use a number of lines, or -1 for all")
    if since is None:
        return (None if tail == -1 else tail), None
    try:
        seconds = crilog.since_seconds(since)
    except ValueError:
        raise BadInput(
            f"--since {since!r} is not a duration", hint="use e.g. 10s, 5m, 2h or 1h30m"
        ) from None
    return (None if tail == -1 else tail), seconds


@app.command()
def stop(
    ctx: typer.Context,
    name: str | None = NameArg,
    wait_: Annotated[
        bool, typer.Option("--wait/--no-wait", help="wait until the job has stopped")
    ] = True,
    dry_run: DryRunOpt = False,
    backend: BackendOpt = None,
    output: Output = OutputOpt,
) -> None:
    """Stop a job: SIGTERM reaches the trainer, which saves a checkpoint and exits. Idempotent. On a
    cluster the job is deleted with foreground propagation (its pods first). -o json: {job, result,
    dry_run}.

    Example: fsdpctl job stop
    """
    from fsdpctl.job import runner  # the verbs that change a job: loaded by them alone

    be, name = resolve_job(ctx, name, backend, acts=True)
    result = runner.stop(
        be, name, wait=wait_, dry_run=dry_run, say=lambda line: note(f"waiting: {line}")
    )
    ok(result)
    emit({"job": name, "result": result, "dry_run": job_view.dry_run_word(dry_run)}, output)


@app.command("list")
def list_(
    ctx: typer.Context,
    output: ViewOutput = ViewOutputOpt,
    backend: BackendOpt = None,
    phase: Annotated[
        list[str] | None,
        typer.Option(
            "--phase",
            metavar="PHASE",
            help="only jobs in this phase (repeat, or a comma list; any case)",
        ),
    ] = None,
    selector: Annotated[
        str | None,
        typer.Option(
            "--selector",
            "-l",
            metavar="KEY=VALUE,...",
            help="only jobs whose labels match: key=value, key!=value, comma separated (all must hold)",
        ),
    ] = None,
) -> None:
    """Jobs with their backend, phase and progress. Those of every backend that runs one started
    from here (local, Slurm), and of BACKEND (on
    EKS the cluster's, started from anywhere), with their backend, phase and progress; --backend
    lists one backend's. A job's labels are its PyTorchJob's (fsdpctl.io/job, fsdpctl.io/run-id,
    app.kubernetes.io/...) plus fsdpctl.io/backend. A backend that cannot be asked fails the command
    (exit 1) after what could be listed, its jobs recorded here shown Unknown.

    Example: fsdpctl job list --phase running,pending -l fsdpctl.io/job=fsdp -o json
    """
    phases = job_view.phase_filter(phase or [])
    reqs = job_view.label_selector(selector) if selector else []
    backends.check_name(backend)
    st = state(ctx)  # BACKEND alone; the whole settings only for a backend that needs them
    listed = listing.list_jobs(
        st.reads("BACKEND")["BACKEND"], backends.readers(st.config), only=backend
    )
    reports = [r for r in listed.reports if job_view.selected(r, phases, reqs)]
    for skipped in listed.notes:  # a stray file, a damaged state: every other job is listed
        warn(skipped)
    if not emit(reports, output):
        out.print(job_view.list_table(reports, wide=output == ViewOutput.wide))
    for failed in listed.failed[1:]:
        warn(str(failed))
    if listed.failed:  # what could be listed is shown; the list is not whole: exit 1, as ls does
        raise listed.failed[0]


@app.command()
def wait(
    ctx: typer.Context,
    name: str | None = NameArg,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", help="seconds (default: no limit)", callback=finite()),
    ] = None,
    backend: BackendOpt = None,
    output: Output = OutputOpt,
    for_: Annotated[
        str | None,
        typer.Option(
            "--for",
            help="instead of its end, wait for: step=N (step N done), checkpoint (one published) or "
            "phase=P; 0 once it holds, 1 if the job ended short of it",
        ),
    ] = None,
) -> None:
    """Wait for a job to end; the exit code says how: 0 succeeded, 3 failed, 4 not found, 5 timed
    out, 6 stopped. -o json: {job, phase, exit_code} on stdout. With --for, wait for a condition
    instead (as kubectl wait --for), whatever the machine's pace.

    Example: fsdpctl job wait --timeout 3600 && echo trained; fsdpctl job wait first --for step=100
    """
    cond = waitfor.parse(for_) if for_ is not None else None  # bad input before anything is asked
    be, name = resolve_job(ctx, name, backend)
    if cond is not None:
        job_wait.wait_for(be, name, cond, timeout, output)
        return
    phase = be.wait(name, timeout, warn)
    try:
        end_wait(name, phase)
    except typer.Exit as e:  # the code end_wait chose, said on stdout too
        emit({"job": name, "phase": phase, "exit_code": e.exit_code}, output)
        raise


# kubectl's, SkyPilot's and torchx's words for the same verbs: aliases, not listed in the help
app.command("ls", hidden=True, help="Alias of `job list`.")(list_)
app.command("cancel", hidden=True, help="Alias of `job stop` (SkyPilot's, torchx's).")(stop)
app.command("delete", hidden=True, help="Alias of `job stop` (kubectl delete deletes the job).")(
    stop
)

# `job plot` and `job tensorboard` (pictures of a job) live in their own module
from fsdpctl.cli import job_plot_cmd  # noqa: E402

app.command()(job_plot_cmd.plot)
app.command()(job_plot_cmd.tensorboard)

job_record_cmd.register(
    app
)  # describe, rerun, diff: a run's record (after the verbs above in the help)
