"""fsdpctl doctor: the checks are `fsdpctl.cluster.doctor`'s; this shows them as they finish and
reports them."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from fsdpctl.cli.common import Output, OutputOpt, err, state
from fsdpctl.cli.tools import CHECK_STYLE, report_checks


def doctor(
    ctx: typer.Context,
    output: Output = OutputOpt,
    collectives: Annotated[
        bool,
        typer.Option("--collectives/--no-collectives", help="run the all-reduce bandwidth test"),
    ] = True,
) -> None:
    """Preflight: GPU, driver vs CUDA, a forward/backward on cuda, bf16, NCCL bandwidth, EFA,
    /dev/shm, disk, data.

    Runs on a workstation, a node, or in a pod: kubectl exec -it POD -- fsdpctl doctor. Exit 1 on
    any fail.

    Example: fsdpctl doctor -o json
    """
    from fsdpctl.cluster import doctor as D

    cfg = state(ctx).config()
    demand, checkpoints = D.targets(cfg)

    def show(
        c: D.Check,
    ) -> None:  # live progress on stderr, whatever stdout carries (a table, -o json)
        err.print(f"[{CHECK_STYLE[c.status]}]{c.status:>7}[/] " + escape(c.name), highlight=False)

    checks = D.run_checks(
        cfg,
        demand_tokens_per_s=demand,
        checkpoint_path=checkpoints,
        collectives=collectives,
        on_check=show,
    )
    report_checks(checks, output)
