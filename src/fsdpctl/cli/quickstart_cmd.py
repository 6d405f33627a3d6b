"""fsdpctl quickstart"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from fsdpctl import backends
from fsdpctl.cli import job_status_view, job_view
from fsdpctl.cli.admission import admit
from fsdpctl.cli.common import DryRunOpt, ForceOpt, Output, OutputOpt, emit, ok, out, state
from fsdpctl.job import policy as jobpolicy
from fsdpctl.job import runner

if TYPE_CHECKING:
    from fsdpctl.cli.common import AppState
    from fsdpctl.job.protocol import Started
    from fsdpctl.settings import Config

# The embedded default: a tiny Llama on the offline sample corpus, 2 simulated nodes x 1 process,
# CPU. fp32, because CPUs without bf16 units run bf16 matmuls 3-4x slower (measured: BENCHMARKS.md).
QUICKSTART = {
    "BACKEND": "local",
    "JOB_NAME": "quickstart",
    "MODEL": "tiny",
    "DATASET": "builtin",
    "TOKENIZER": "",
    "PRETRAINED": "",
    "SHARDING_STRATEGY": "FULL_SHARD",
    "PRECISION": "fp32",
    "SEQ_LEN": "128",
    "MICRO_BATCH_SIZE": "2",
    "LOCAL_PROCS_PER_NODE": "1",
    "CHECKPOINT_INTERVAL": "10",
    "RESUME": "never",
}


def next_rows(job_name: str) -> tuple[tuple[str, str], ...]:
    return (
        (f"fsdpctl job status {job_name}", "its steps, loss, tokens/s and checkpoint"),
        (
            f"fsdpctl job logs {job_name} --all",
            "every node's log, each line prefixed with its node",
        ),
        ("fsdpctl job list", "every job fsdpctl knows, with its phase"),
        ("fsdpctl plan --model 7b", "memory, speed and cost of Llama-2 7B on a GPU cluster"),
    )


def next_commands(job_name: str) -> str:
    """What to run after the quickstart, with its job's name: the job is not the default JOB_NAME
    ('fsdp'), so a bare `fsdpctl job status` finds nothing."""
    rows = next_rows(job_name)
    width = max(len(cmd) for cmd, _ in rows)
    return "next:\n" + "".join(f"  {cmd:<{width}}  # {why}\n" for cmd, why in rows)


# the options, in the command's order
NodesOpt = Annotated[
    int, typer.Option("--nodes", help="simulated nodes (one torchrun launcher each)")
]
StepsOpt = Annotated[int, typer.Option("--steps", help="optimizer steps")]
PlotOpt = Annotated[
    bool | None,
    typer.Option(
        "--plot/--no-plot",
        help="draw loss and tokens/s over steps at the end (default: on a terminal)",
    ),
]


def quickstart(
    ctx: typer.Context,
    nodes: NodesOpt = 2,
    steps: StepsOpt = 30,
    plot: PlotOpt = None,
    dry_run: DryRunOpt = False,
    force: ForceOpt = False,
    output: Output = OutputOpt,
) -> None:
    """Train a tiny Llama with FSDP on this machine: 2 simulated nodes, real torchrun rendezvous,
    checkpoints.

    No cloud, GPU, download or .env needed. --set still overrides any setting. A run this machine
    cannot hold (too many processes for its cores, a model over its RAM) is refused as `job run`
    refuses it.

    Example: fsdpctl quickstart --steps 60   (-o json: the final report and the next commands)
    """
    cfg = _settings(state(ctx), nodes, steps)
    admit(cfg, force=force)
    be = backends.create(cfg)
    started = runner.run(
        be,
        cfg,
        run_id=jobpolicy.new_run_id(cfg.job_name),
        replace=True,
        dry_run=dry_run,
        other=backends.factory(cfg),
    )
    if dry_run:  # (a running quickstart is replaced only by a real run)
        job_view.dry_run_done(job_view.started_object(be, started), started, output)
        return
    ok(
        f"quickstart: {cfg.job_nodes} nodes x {cfg.procs_per_node} process, {cfg.training.model} Llama, "
        f"{cfg.training.sharding_strategy}, rendezvous {cfg.rdzv_backend}; {started.where}"
    )
    code = job_view.outcome(
        be, started.job, job_view.follow(be, started.job), table=output == Output.table
    )
    _finish(be, started, code, plot, output)


def _settings(st: AppState, nodes: int, steps: int) -> Config:
    """QUICKSTART under the options under --set, each key's source named as `config show` says."""
    flags = {
        **QUICKSTART,
        "JOB_NODES": str(nodes),
        "MAX_STEPS": str(steps),
        "WARMUP_STEPS": str(min(5, steps)),
        **st.flags,
    }
    options = {"JOB_NODES": "--nodes", "MAX_STEPS": "--steps", "WARMUP_STEPS": "--steps"}
    set_by = {
        **dict.fromkeys(QUICKSTART, "quickstart"),
        **options,
        **dict.fromkeys(st.flags, "--set"),
    }
    return st.config(**flags, set_by=set_by)


def _finish(
    be: backends.Backend, started: Started, code: int, plot: bool | None, output: Output
) -> NoReturn:
    """The ended job's report (-o json|yaml) or its curves and the next commands; exit with the
    job's code."""
    # -o json|yaml: the job's final report and the next commands as one document (progress stays on
    # stderr)
    report = {"job": started.job, "run_id": started.run_id, "dry_run": "none", "exit_code": code}
    if emit(
        {
            **report,
            "report": be.report(started.job),
            "next": [c for c, _ in next_rows(started.job)],
        },
        output,
    ):
        raise typer.Exit(code)
    if job_status_view.want_plot(plot):
        job_status_view.print_curves(be.history(started.job))
    out.print(next_commands(started.job), end="", markup=False)
    raise typer.Exit(code)
