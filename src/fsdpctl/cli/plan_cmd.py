"""fsdpctl plan: the numbers come from `fsdpctl.plan.planner`; this prints them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.text import Text

from fsdpctl.cli import completion
from fsdpctl.cli.common import Output, OutputOpt, emit, finite, out, state
from fsdpctl.cli.tables import PlainTable, styled
from fsdpctl.job import policy as jobpolicy
from fsdpctl.plan import planner as P
from fsdpctl.plan import sweep, volume
from fsdpctl.plan.planner import PlanReport
from fsdpctl.plan.sweep import SweepRow
from fsdpctl.plan.volume import VolumeReport
from fsdptrain.events import seconds_text

if TYPE_CHECKING:
    from fsdpctl.settings import Config

# Bounds far beyond any real run that keep the products finite (1e308 tokens printed `$inf`): Llama
# 3 trained on 15e12 tokens; a p5.48xlarge lists at about $55 per hour.
MAX_TOKENS = 1e18
MAX_PRICE = 1e6

MEMORY_ROWS = (
    ("params", "parameters (fp32 shard)"),
    ("grads", "gradients (fp32 shard)"),
    ("optimizer", "AdamW moments (fp32 shard)"),
    ("activations", "activations held for backward"),
    ("transient", "gathered layers, recompute, logits, CUDA/NCCL"),
)


def _gib(x: float) -> str:
    return f"{x:,.1f} GiB"


def _print_memory(r: PlanReport) -> None:
    j, m = r["job"], r["memory_gib"]
    out.print(
        f"[bold]{j['model']}[/] on {j['nodes']} x {j['instance_type']} ({j['gpus_per_node']} GPUs each), "
        f"{j['strategy']}, {j['precision']}, checkpointing {j['ac']}, micro-batch {j['micro_batch']} x "
        f"{j['seq_len']} tokens, accumulation {j['grad_accum']}"
    )
    t = PlainTable("per GPU", "memory", box=None, pad_edge=False)
    for key, label in MEMORY_ROWS:
        t.add_row(label, _gib(m[key]))
    verdict = ("FITS", "green") if r["fits"] else ("DOES NOT FIT", "red")
    t.add_row(
        styled("total", "bold"),
        Text.assemble((_gib(m["total"]), "bold"), f" of {_gib(m['capacity'])}  ", verdict),
    )
    out.print(t)
    if not r["fits"]:
        fixed = r["fix_memory_gib"]  # set with `fix`
        out.print(
            f"cheapest change that fits: [bold]{r['fix']}[/] ({_gib(fixed)} per GPU)"
            if r["fix"] and fixed is not None
            else "no single change fits: use a bigger instance type or more nodes"
        )


def _print_report(r: PlanReport) -> None:
    _print_memory(r)
    if "volume" in r:
        _print_volume(r["volume"])
    if "minimum" in r:
        _print_minimum(r["minimum"])
    s = r["speed"]
    out.print(
        f"step {s['step_s']:.2f} s (compute {s['compute_s']:.2f} s, communication {s['comm_s']:.2f} s) | "
        f"{s['tokens_per_s']:,.0f} tokens/s ({s['tokens_per_s_per_gpu']:,.0f} per GPU) | "
        f"{s['tflops_per_gpu']:.0f} TFLOP/s per GPU, MFU {100 * s['mfu']:.0f}%"
    )
    time = f"{r['tokens']:.3g} tokens: {r['hours']:,.1f} h"
    if r["usd"] is None:
        instance = r["job"]["instance_type"]
        out.print(f"{time}; cost unknown: no list price for {instance}, pass --price USD/node-hour")
    else:
        out.print(
            f"{time}, ${r['usd']:,.0f} on-demand "
            f"(${r['price_per_hour']:.2f}/node-hour, prices as of {r['prices_as_of']})"
        )


def _print_minimum(m: P.MinimumReport) -> None:
    """What the job looks like on the fewest nodes of its elastic range, after losing the others."""
    verdict = "[green]FITS[/]" if m["fits"] else "[red]DOES NOT FIT[/]: raise MIN_NODES"
    batch = (
        f"global batch kept (accumulation {m['grad_accum']})"
        if m["rule"] == "constant"
        else f"per-rank batch kept (accumulation {m['grad_accum']}): a smaller global batch"
    )
    usd = f", ${m['usd']:,.0f}" if m["usd"] is not None else ""
    out.print(
        f"at MIN_NODES={m['nodes']}: {_gib(m['memory_gib'])} per GPU {verdict} | "
        f"{m['tokens_per_s']:,.0f} tokens/s | {batch} | {m['hours']:,.1f} h{usd} were it all there"
    )


def _print_volume(v: VolumeReport) -> None:
    """The shared volume: what the job keeps there against FSX_STORAGE_GIB, how fast a save goes."""
    verdict = "[green]FITS[/]" if v["fits"] else "[red]DOES NOT FIT[/]"
    fix = "" if v["fits"] else f": set FSX_STORAGE_GIB={v['size_that_fits_gib']}"
    out.print(
        f"shared volume: {_gib(v['need_gib'])} ({v['holds']}) on FSX_STORAGE_GIB={v['fsx_storage_gib']}  "
        f"{verdict}{fix}"
    )
    out.print(
        f"one save {seconds_text(v['save_s'])} at {v['write_mb_per_s']:,.0f} MB/s (the file system's, "
        f"all nodes together: {escape(v['write_rate_basis'])}) | stop grace {v['stop_grace_s']:,} s"
    )
    if v["warning"]:
        out.print(f"[yellow]warning:[/] {escape(v['warning'])}")


def _print_matrix(rows: list[SweepRow], tokens: float) -> None:
    heads = (
        "model",
        "node",
        "n",
        "GiB/GPU",
        "fits",
        "tok/s/GPU",
        "MFU",
        "scaling",
        f"$/{tokens:.0e} tok",
    )
    t = PlainTable(*heads, box=None, pad_edge=False)
    for r in rows:
        t.add_row(
            r["model"],
            r["instance_type"].split(".")[0],
            str(r["nodes"]),
            f"{r['memory_gib']:.1f}",
            "yes" if r["fits"] else styled("no", "red"),
            f"{r['tokens_per_s_per_gpu']:,.0f}",
            f"{100 * r['mfu']:.0f}%",
            f"{100 * r['scaling']:.0f}%",
            f"{r['usd']:,.0f}" if r["usd"] is not None else "-",
        )
    out.print(t)


def _given_elsewhere(cfg: Config, keys: Iterable[str]) -> str:
    """The plan's keys a .env, the environment or --set gave (not this command's options, not a
    default): a verdict that surprises (DOES NOT FIT after a walkthrough's PRECISION=fp32) names
    where its inputs came from."""
    from fsdpctl.settings import redacted

    values = redacted(cfg)
    shown = [
        f"{key}={values[key]} ({cfg.sources[key]})"
        for key in keys
        if cfg.sources.get(key, "default") not in ("default", "model default", "derived")
        and cfg.sources[key] != PLAN_OPTIONS.get(key)
        and key in values
    ]
    return ", ".join(shown)


# the option that sets each key, as errors and sources name it
PLAN_OPTIONS = {
    "MODEL": "--model",
    "INSTANCE_TYPE": "--instance-type",
    "JOB_NODES": "--nodes",
    "SHARDING_STRATEGY": "--strategy",
    "PRECISION": "--precision",
    "ACTIVATION_CHECKPOINTING": "--ac",
    "MICRO_BATCH_SIZE": "--micro-batch",
    "SEQ_LEN": "--seq-len",
    "GRAD_ACCUM_STEPS": "--grad-accum",
    "BACKEND": "plan (always eks)",
}


# the options, in the command's order
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", help="7b, 13b, 70b, tiny", autocompletion=completion.model_names),
]
InstanceTypeOpt = Annotated[str | None, typer.Option("--instance-type")]
NodesOpt = Annotated[int | None, typer.Option("--nodes")]
StrategyOpt = Annotated[str | None, typer.Option("--strategy", help="FULL_SHARD ... NO_SHARD")]
PrecisionOpt = Annotated[str | None, typer.Option("--precision")]
AcOpt = Annotated[
    str | None,
    typer.Option("--ac", help="activation checkpointing: none, full, every-k, selective"),
]
MicroBatchOpt = Annotated[int | None, typer.Option("--micro-batch")]
SeqLenOpt = Annotated[int | None, typer.Option("--seq-len")]
GradAccumOpt = Annotated[int | None, typer.Option("--grad-accum")]
TokensOpt = Annotated[
    float,
    typer.Option(
        "--tokens",
        help="tokens to train on, for time and cost",
        callback=finite(above=True, maximum=MAX_TOKENS),
    ),
]
MfuOpt = Annotated[
    float,
    typer.Option(
        "--mfu", help="assumed compute MFU (0: per-GPU default)", callback=finite(maximum=1.0)
    ),
]
PriceOpt = Annotated[
    float | None,
    typer.Option(
        "--price", help="USD per node-hour (default: table)", callback=finite(maximum=MAX_PRICE)
    ),
]
TableOpt = Annotated[
    bool,
    typer.Option(
        "--table",
        help="7B/13B/70B (each with its own defaults) x p4de/p5 x 1..16 nodes; --model and --nodes pick "
        "only those rows",
    ),
]


def plan(
    ctx: typer.Context,
    model: ModelOpt = None,
    instance_type: InstanceTypeOpt = None,
    nodes: NodesOpt = None,
    strategy: StrategyOpt = None,
    precision: PrecisionOpt = None,
    ac: AcOpt = None,
    micro_batch: MicroBatchOpt = None,
    seq_len: SeqLenOpt = None,
    grad_accum: GradAccumOpt = None,
    tokens: TokensOpt = 1e9,
    mfu: MfuOpt = 0.0,
    price: PriceOpt = None,
    table: TableOpt = False,
    output: Output = OutputOpt,
) -> None:
    """A job's memory, speed and cost before it runs. Memory per GPU (FITS / DOES NOT FIT, and the
    cheapest fix), step time, tokens/s, MFU and
    cost; the shared volume's need against FSX_STORAGE_GIB, one save's time and the stop grace.

    Uses the same settings as the job; the flags vary them. The model behind the numbers is in the
    docs (docs/plan.md, "The model").

    Example: fsdpctl plan --model 70b --nodes 1 --instance-type p5.48xlarge
    """
    flags = {
        "MODEL": model,
        "INSTANCE_TYPE": instance_type,
        "JOB_NODES": nodes,
        "SHARDING_STRATEGY": strategy,
        "PRECISION": precision,
        "ACTIVATION_CHECKPOINTING": ac,
        "MICRO_BATCH_SIZE": micro_batch,
        "SEQ_LEN": seq_len,
        "GRAD_ACCUM_STEPS": grad_accum,
    }
    # planning is about the cluster whatever BACKEND says: GPUs per node come from the instance type
    cfg = state(ctx).config(
        **{k: v for k, v in flags.items() if v is not None}, BACKEND="eks", set_by=PLAN_OPTIONS
    )
    job = P.job_from(cfg, mfu=mfu, price=price)
    if table:
        _sweep(cfg, job, tokens, output, model=model is not None, nodes=nodes is not None)
        return
    _plan_one(cfg, job, tokens, output, flags)


def _sweep(
    cfg: Config, job: P.Job, tokens: float, output: Output, *, model: bool, nodes: bool
) -> None:
    """--table: --model and --nodes (given: `model`, `nodes`) narrow the sweep to their rows;
    without them it spans every model and size."""
    rows = sweep.matrix(
        job,
        tokens,
        per_model=sweep.sweep_bases(job, cfg),
        models=(job.model,) if model else sweep.SWEEP_MODELS,
        nodes=(job.nodes,) if nodes else sweep.SWEEP_NODES,
    )
    if not emit(rows, output):
        _print_matrix(rows, tokens)


def _plan_one(cfg: Config, job: P.Job, tokens: float, output: Output, flags: Iterable[str]) -> None:
    """The job's report: memory, speed, cost, the shared volume and stop grace, and the job on its
    fewest nodes when it is elastic; then which of the plan's keys (`flags`) a .env, the
    environment or --set gave."""
    r = P.report(job, tokens)
    timing = jobpolicy.stop_timing(cfg)
    shared = volume.report(cfg, r["speed"]["step_s"])
    shared["stop_grace_s"], shared["stop_grace_basis"] = timing.shutdown_s, timing.basis
    r["volume"] = shared
    if cfg.fewest_nodes < cfg.job_nodes:
        r["minimum"] = P.at_minimum(job, cfg.fewest_nodes, tokens)
    if not emit(r, output):
        _print_report(r)
        if given := _given_elsewhere(cfg, flags):
            out.print(f"[dim]from your settings, not this command: {escape(given)}[/]")
