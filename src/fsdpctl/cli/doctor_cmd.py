"""fsdpctl doctor"""

from __future__ import annotations

from typing import Annotated

import typer

from fsdpctl.cli.common import CHECK_STYLE, Output, OutputOpt, err, report_checks, state

LOCAL_DEMAND = 1_000.0  # tokens/s per process of a tiny model on one CPU core (what the quickstart measures)


def doctor(
    ctx: typer.Context,
    output: Output = OutputOpt,
    collectives: Annotated[
        bool, typer.Option("--collectives/--no-collectives", help="run the all-reduce bandwidth test")
    ] = True,
) -> None:
    """Preflight: GPU, driver vs CUDA, a forward/backward on cuda, bf16, NCCL bandwidth, EFA, /dev/shm, disk, data.

    Runs on a workstation, a node, or in a pod: kubectl exec -it POD -- fsdpctl doctor. Exit 1 on any fail.

    Example: fsdpctl doctor -o json
    """
    from fsdpctl import doctor as D
    from fsdpctl.adapters.local import job_dir

    cfg = state(ctx).config()
    if cfg.backend == "eks":
        from fsdpctl import plan as P
        from fsdpctl.cli.plan_cmd import job_from

        demand = P.speed(job_from(cfg, mfu=0.0, price=None)).tokens_per_s_per_gpu
        ckpt = cfg.training.checkpoint_dir or "/checkpoints"
    else:
        demand, ckpt = LOCAL_DEMAND, str(job_dir(cfg.job_name) / "checkpoints")
    live = output == Output.table
    show = (
        (lambda c: err.print(f"[{CHECK_STYLE[c.status]}]{c.status:>7}[/] {c.name}", highlight=False))
        if live
        else None
    )
    from pathlib import Path

    checks = D.run_checks(
        cfg, demand_tokens_per_s=demand, checkpoint_path=Path(ckpt), collectives=collectives, on_check=show
    )
    report_checks(checks, output)
