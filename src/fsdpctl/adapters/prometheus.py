"""Adapter: Prometheus (the one `fsdpctl deploy monitoring` installs), queried through the
Kubernetes API server's service proxy, so no port-forward is needed. Knows the DCGM exporter's
series `monitor top` shows."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict, cast

from fsdpctl.adapters.kube import Kube, KubeError
from fsdpctl.errors import FsdpctlError

SERVICE, PORT = "prometheus", 9090
NodeKey = Literal["util", "mem_copy", "power_w", "temp_c", "xid", "gpus"]
# per node (the exporter's Hostname label): GPU and memory-copy utilization, power, temperature, XID
# errors
NODE_QUERIES: dict[NodeKey, str] = {
    "util": "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)",
    "mem_copy": "avg by (Hostname) (DCGM_FI_DEV_MEM_COPY_UTIL)",
    "power_w": "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)",
    "temp_c": "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)",
    "xid": "max by (Hostname) (DCGM_FI_DEV_XID_ERRORS)",
    "gpus": "count by (Hostname) (DCGM_FI_DEV_GPU_UTIL)",
}
POD_QUERY = 'avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!=""})'


class Sample(TypedDict):
    """One series of an instant vector: Prometheus HTTP API, `GET /api/v1/query` answering
    `{"status": "success", "data": {"resultType": "vector", "result": [...]}}`, each result
    `{"metric": {"<label_name>": "<label_value>", ...}, "value": [<unix_time>, "<sample_value>"]}`
    (prometheus docs/querying/api.md, "Instant vectors"). The sample is a string: "NaN", "+Inf"
    are values too."""

    metric: dict[str, str]
    value: list[float | str]  # [unix time, sample value as a string]


class NodeRow(TypedDict):
    """A node of `monitor top` (-o json: `nodes`): the NODE_QUERIES keys it has series for."""

    node: str  # the DCGM exporter's Hostname label
    util: NotRequired[float]
    mem_copy: NotRequired[float]
    power_w: NotRequired[float]
    temp_c: NotRequired[float]
    xid: NotRequired[float]
    gpus: NotRequired[float]


class PodRow(TypedDict):
    """A pod of `monitor top` (-o json: `pods`): its GPU utilization."""

    namespace: str
    pod: str
    util: float


class GpuSnapshot(TypedDict):
    """`monitor top -o json`."""

    nodes: list[NodeRow]
    pods: list[PodRow]


class NoMetrics(FsdpctlError):
    pass


def query(kube: Kube, namespace: str, promql: str) -> list[Sample]:
    """An instant query's result vector; NoMetrics when no Prometheus answers in `namespace`."""
    try:
        data = kube.proxy("GET", namespace, SERVICE, PORT, "/api/v1/query", query={"query": promql})
    except KubeError as e:
        raise NoMetrics(
            f"no metrics source answers (Prometheus in {namespace}: {e.status} {e.reason})",
            hint="fsdpctl deploy monitoring",
        ) from e
    # the proxy hands back Prometheus' JSON as parsed (untyped); every query here is an instant
    # query, whose result is the vector Sample describes
    return cast(list[Sample], data.get("data", {}).get("result", []))


def gpu_snapshot(kube: Kube, namespace: str) -> GpuSnapshot:
    """{"nodes": one row per node with the NODE_QUERIES keys it has series for, "pods": GPU util per
    pod}."""
    nodes: dict[str, NodeRow] = {}
    for key, promql in NODE_QUERIES.items():
        for row in query(kube, namespace, promql):
            host = row["metric"].get("Hostname", "?")
            nodes.setdefault(host, {"node": host})[key] = float(row["value"][1])
    pods: list[PodRow] = [
        {
            "namespace": r["metric"].get("namespace", "-"),
            "pod": r["metric"].get("pod", "-"),
            "util": float(r["value"][1]),
        }
        for r in query(kube, namespace, POD_QUERY)
    ]
    return {"nodes": [row for _, row in sorted(nodes.items())], "pods": pods}
