"""fsdpctl plan"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from fsdpctl import plan as P
from fsdpctl.cli.common import Output, OutputOpt, emit, out, state

if TYPE_CHECKING:
    from fsdpctl.settings import Config


def job_from(cfg: Config, *, mfu: float, price: float | None) -> P.Job:
    t = cfg.training
    return P.Job(
        model=t.model,
        instance_type=cfg.instance_type,
        nodes=cfg.job_nodes,
        gpus_per_node=cfg.gpus,
        strategy=t.sharding_strategy,
        precision=t.precision,
        ac=t.activation_checkpointing,
        ac_every=t.ac_every,
        micro_batch=t.micro_batch_size,
        seq_len=t.seq_len,
        grad_accum=t.grad_accum_steps,
        hsdp_shard_size=t.hsdp_shard_size,
        mfu=mfu,
        price_per_hour=price,
    )


def report(job: P.Job, tokens: float) -> dict:
    mem, spd = P.memory(job), P.speed(job)
    hours, usd = P.cost(job, tokens)
    fix = None if mem.fits else P.cheapest_fix(job, tokens)
    return {
        "job": asdict(job),
        "memory_gib": {k: v / P.GIB for k, v in asdict(mem).items()}
        | {"total": mem.total / P.GIB, "state": mem.state / P.GIB},
        "fits": mem.fits,
        "fix": fix[0] if fix else None,
        "fix_memory_gib": P.memory(fix[1]).total / P.GIB if fix else None,
        "speed": asdict(spd),
        "tokens": tokens,
        "hours": hours,
        "usd": usd,
        "price_per_hour": P.price(job),
        "prices_as_of": P.PRICES_AS_OF,
    }


def _gib(x: float) -> str:
    return f"{x:,.1f} GiB"


def _print_report(r: dict) -> None:
    j, m, s = r["job"], r["memory_gib"], r["speed"]
    out.print(
        f"[bold]{j['model']}[/] on {j['nodes']} x {j['instance_type']} ({j['gpus_per_node']} GPUs each), "
        f"{j['strategy']}, {j['precision']}, checkpointing {j['ac']}, micro-batch {j['micro_batch']} x "
        f"{j['seq_len']} tokens, accumulation {j['grad_accum']}"
    )
    t = Table("per GPU", "memory", box=None, pad_edge=False)
    for key, label in (
        ("params", "parameters (fp32 shard)"),
        ("grads", "gradients (fp32 shard)"),
        ("optimizer", "AdamW moments (fp32 shard)"),
        ("activations", "activations held for backward"),
        ("transient", "gathered layers, recompute, logits, CUDA/NCCL"),
    ):
        t.add_row(label, _gib(m[key]))
    verdict = "[green]FITS[/]" if r["fits"] else "[red]DOES NOT FIT[/]"
    t.add_row("[bold]total[/]", f"[bold]{_gib(m['total'])}[/] of {_gib(m['capacity'])}  {verdict}")
    out.print(t)
    if not r["fits"]:
        out.print(
            f"cheapest change that fits: [bold]{r['fix']}[/] ({_gib(r['fix_memory_gib'])} per GPU)"
            if r["fix"]
            else "no single change fits: use a bigger instance type or more nodes"
        )
    out.print(
        f"step {s['step_s']:.2f} s (compute {s['compute_s']:.2f} s, communication {s['comm_s']:.2f} s) | "
        f"{s['tokens_per_s']:,.0f} tokens/s ({s['tokens_per_s_per_gpu']:,.0f} per GPU) | "
        f"{s['tflops_per_gpu']:.0f} TFLOP/s per GPU, MFU {100 * s['mfu']:.0f}%"
    )
    if r["usd"] is None:
        out.print(
            f"{r['tokens']:.3g} tokens: {r['hours']:,.1f} h; cost unknown: no list price for "
            f"{j['instance_type']}, pass --price USD/node-hour"
        )
    else:
        out.print(
            f"{r['tokens']:.3g} tokens: {r['hours']:,.1f} h, ${r['usd']:,.0f} on-demand "
            f"(${r['price_per_hour']:.2f}/node-hour, prices as of {r['prices_as_of']})"
        )


def matrix(base: P.Job, tokens: float) -> list[dict]:
    rows = []
    for model in ("7b", "13b", "70b"):
        for inst in ("p4de.24xlarge", "p5.48xlarge"):
            one = None
            for nodes in (1, 2, 4, 8, 16):
                job = replace(base, model=model, instance_type=inst, nodes=nodes)
                mem, spd = P.memory(job), P.speed(job)
                one = one or spd.tokens_per_s_per_gpu
                hours, usd = P.cost(job, tokens)
                rows.append(
                    {
                        "model": model,
                        "instance_type": inst,
                        "nodes": nodes,
                        "memory_gib": mem.total / P.GIB,
                        "fits": mem.fits,
                        "tokens_per_s_per_gpu": spd.tokens_per_s_per_gpu,
                        "mfu": spd.mfu,
                        "scaling": spd.tokens_per_s_per_gpu / one,
                        "hours": hours,
                        "usd": usd,
                    }
                )
    return rows


def plan(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option("--model", help="7b, 13b, 70b, tiny")] = None,
    instance_type: Annotated[str | None, typer.Option("--instance-type")] = None,
    nodes: Annotated[int | None, typer.Option("--nodes")] = None,
    strategy: Annotated[str | None, typer.Option("--strategy", help="FULL_SHARD ... NO_SHARD")] = None,
    precision: Annotated[str | None, typer.Option("--precision")] = None,
    ac: Annotated[
        str | None, typer.Option("--ac", help="activation checkpointing: none, full, every-k")
    ] = None,
    micro_batch: Annotated[int | None, typer.Option("--micro-batch")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len")] = None,
    grad_accum: Annotated[int | None, typer.Option("--grad-accum")] = None,
    tokens: Annotated[float, typer.Option("--tokens", help="tokens to train on, for time and cost")] = 1e9,
    mfu: Annotated[float, typer.Option("--mfu", help="assumed compute MFU (0: per-GPU default)")] = 0.0,
    price: Annotated[float | None, typer.Option("--price", help="USD per node-hour (default: table)")] = None,
    table: Annotated[bool, typer.Option("--table", help="7B/13B/70B x p4de/p5 x 1..16 nodes")] = False,
    output: Output = OutputOpt,
) -> None:
    """Memory per GPU (FITS / DOES NOT FIT, and the cheapest fix), step time, tokens/s, MFU and cost.

    Uses the same settings as the job; the flags vary them. The model behind the numbers is in the README.

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
    st = state(ctx)
    # planning is about the cluster whatever BACKEND says: GPUs per node come from the instance type
    cfg = st.config(**{**{k: v for k, v in flags.items() if v is not None}, "BACKEND": "eks"})
    job = job_from(cfg, mfu=mfu, price=price)
    if table:
        rows = matrix(job, tokens)
        if emit(rows, output):
            return
        t = Table(
            "model",
            "node",
            "n",
            "GiB/GPU",
            "fits",
            "tok/s/GPU",
            "MFU",
            "scaling",
            f"$/{tokens:.0e} tok",
            box=None,
            pad_edge=False,
        )
        for r in rows:
            t.add_row(
                r["model"],
                r["instance_type"].split(".")[0],
                str(r["nodes"]),
                f"{r['memory_gib']:.1f}",
                "yes" if r["fits"] else "[red]no[/]",
                f"{r['tokens_per_s_per_gpu']:,.0f}",
                f"{100 * r['mfu']:.0f}%",
                f"{100 * r['scaling']:.0f}%",
                f"{r['usd']:,.0f}" if r["usd"] is not None else "-",
            )
        out.print(t)
        return
    r = report(job, tokens)
    if not emit(r, output):
        _print_report(r)
