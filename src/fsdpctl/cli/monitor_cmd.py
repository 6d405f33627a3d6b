"""fsdpctl monitor top: GPU use per node and per pod, from Prometheus (DCGM exporter) through the
API server (the queries are `adapters.prometheus`')."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer

from fsdpctl.cli.common import Output, OutputOpt, command_group, emit, out, state
from fsdpctl.cli.tables import PlainTable

if TYPE_CHECKING:
    from fsdpctl.adapters.prometheus import GpuSnapshot, NodeKey

app = command_group("Watch GPUs and training from the terminal.")

NODE_COLUMNS: tuple[tuple[str, NodeKey], ...] = (
    ("GPUs", "gpus"),
    ("GPU util %", "util"),
    ("mem copy %", "mem_copy"),
    ("power W", "power_w"),
    ("temp C", "temp_c"),
    ("XID", "xid"),
)


def _print(snap: GpuSnapshot) -> None:
    t = PlainTable("node", *(head for head, _ in NODE_COLUMNS))
    for n in snap["nodes"]:
        t.add_row(n["node"], *(f"{n[key]:.0f}" if key in n else "-" for _, key in NODE_COLUMNS))
    out.print(t)
    if snap["pods"]:
        p = PlainTable("namespace", "pod", "GPU util %")
        for row in sorted(snap["pods"], key=lambda r: -r["util"]):
            p.add_row(row["namespace"], row["pod"], f"{row['util']:.0f}")
        out.print(p)
    if not snap["nodes"]:
        out.print(
            "Prometheus answers but has no DCGM series yet (no GPU node, or the exporter is starting)"
        )


@app.command()
def top(
    ctx: typer.Context,
    output: Output = OutputOpt,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="refresh every 5 s")] = False,
) -> None:
    """GPU utilization, memory-copy utilization, power, temperature and XID errors per node, and GPU
    utilization per pod (DCGM exporter metrics, read from Prometheus through the Kubernetes API).

    Example: fsdpctl monitor top -w
    """
    from fsdpctl.adapters import prometheus
    from fsdpctl.backends.eks import api

    cfg = state(ctx).config()
    kube = api.connect(cfg)
    while True:
        with api.calls(
            cfg, "monitor top"
        ):  # an unreachable or silent API server: one line naming it
            snap = prometheus.gpu_snapshot(kube, cfg.monitoring_namespace)
        if not emit(snap, output):
            _print(snap)
        if not watch:
            return
        time.sleep(5)
