"""fsdpctl monitor top: GPU use per node and per pod, from Prometheus (DCGM exporter) through the API server."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table

from fsdpctl.cli.common import Output, OutputOpt, emit, out, state
from fsdpctl.errors import FsdpctlError

app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Watch GPUs and training from the terminal."
)

QUERIES = {
    "util": "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)",
    "mem_copy": "avg by (Hostname) (DCGM_FI_DEV_MEM_COPY_UTIL)",
    "power_w": "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)",
    "temp_c": "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)",
    "xid": "max by (Hostname) (DCGM_FI_DEV_XID_ERRORS)",
    "gpus": "count by (Hostname) (DCGM_FI_DEV_GPU_UTIL)",
}
POD_QUERY = 'avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!=""})'


def query(kube, namespace: str, promql: str) -> list[dict]:
    from fsdpctl.adapters.kube import KubeError

    try:
        data = kube.proxy("GET", namespace, "prometheus", 9090, "/api/v1/query", query={"query": promql})
    except KubeError as e:
        raise FsdpctlError(
            f"no metrics source answers (Prometheus in {namespace}: {e.status} {e.reason})",
            hint="fsdpctl deploy monitoring",
        ) from e
    return data.get("data", {}).get("result", [])


def snapshot(kube, namespace: str) -> dict:
    nodes: dict[str, dict] = {}
    for key, promql in QUERIES.items():
        for row in query(kube, namespace, promql):
            nodes.setdefault(row["metric"].get("Hostname", "?"), {})[key] = float(row["value"][1])
    pods = [
        {
            "namespace": r["metric"].get("namespace", "-"),
            "pod": r["metric"].get("pod", "-"),
            "util": float(r["value"][1]),
        }
        for r in query(kube, namespace, POD_QUERY)
    ]
    return {"nodes": [{"node": n, **v} for n, v in sorted(nodes.items())], "pods": pods}


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
    from fsdpctl import kjobs

    cfg = state(ctx).config()
    kube = kjobs.connect(cfg)
    while True:
        snap = snapshot(kube, cfg.monitoring_namespace)
        if not emit(snap, output):
            t = Table("node", "GPUs", "GPU util %", "mem copy %", "power W", "temp C", "XID")
            for n in snap["nodes"]:
                fmt = lambda k, f="{:.0f}": f.format(n[k]) if k in n else "-"  # noqa: E731
                t.add_row(
                    n["node"],
                    fmt("gpus"),
                    fmt("util"),
                    fmt("mem_copy"),
                    fmt("power_w"),
                    fmt("temp_c"),
                    fmt("xid"),
                )
            out.print(t)
            if snap["pods"]:
                p = Table("namespace", "pod", "GPU util %")
                for row in sorted(snap["pods"], key=lambda r: -r["util"]):
                    p.add_row(row["namespace"], row["pod"], f"{row['util']:.0f}")
                out.print(p)
            if not snap["nodes"]:
                out.print(
                    "Prometheus answers but has no DCGM series yet (no GPU node, or the exporter is starting)"
                )
        if not watch:
            return
        time.sleep(5)
