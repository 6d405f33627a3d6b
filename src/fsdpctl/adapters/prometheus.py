"""Adapter: Prometheus (the one `fsdpctl deploy monitoring` installs), queried through the
Kubernetes API server's service proxy, so no port-forward is needed. Knows the DCGM exporter's
series `monitor top` shows."""

from __future__ import annotations

from typing import Any

from fsdpctl.adapters.kube import Kube, KubeError
from fsdpctl.errors import FsdpctlError

SERVICE, PORT = "prometheus", 9090
# per node (the exporter's Hostname label): GPU and memory-copy utilization, power, temperature, XID
# errors
NODE_QUERIES = {
    "util": "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)",
    "mem_copy": "avg by (Hostname) (DCGM_FI_DEV_MEM_COPY_UTIL)",
    "power_w": "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)",
    "temp_c": "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)",
    "xid": "max by (Hostname) (DCGM_FI_DEV_XID_ERRORS)",
    "gpus": "count by (Hostname) (DCGM_FI_DEV_GPU_UTIL)",
}
POD_QUERY = 'avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!=""})'


class NoMetrics(FsdpctlError):
    pass


def query(kube: Kube, namespace: str, promql: str) -> list[dict[str, Any]]:
    """An instant query's result vector; NoMetrics when no Prometheus answers in `namespace`."""
    try:
        data = kube.proxy("GET", namespace, SERVICE, PORT, "/api/v1/query", query={"query": promql})
    except KubeError as e:
        raise NoMetrics(
            f"no metrics source answers (Prometheus in {namespace}: {e.status} {e.reason})",
            hint="fsdpctl deploy monitoring",
        ) from e
    result: list[dict[str, Any]] = data.get("data", {}).get("result", [])
    return result


def gpu_snapshot(kube: Kube, namespace: str) -> dict[str, list[dict[str, Any]]]:
    """{"nodes": one row per node with the NODE_QUERIES keys it has series for, "pods": GPU util per
    pod}."""
    nodes: dict[str, dict[str, float]] = {}
    for key, promql in NODE_QUERIES.items():
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
