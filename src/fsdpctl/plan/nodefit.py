"""What a job's GPU nodes offer against what its pods request (pure): the nodes its selector picks,
their allocatable GPUs and EFA interfaces, and one line per node for `job status`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fsdpctl.job.kstatus import PLUGIN_OF, Obj
from fsdpctl.job.kube_shapes import Node
from fsdpctl.job.reports import GpuNode

# --- what the job's GPU nodes offer ---------------------------------------------------------------


def _quantity(value: Any) -> int:
    """An extended resource's count: the API serves it as an integer quantity ("8"); anything else
    is 0."""
    text = str(value or "0")
    return int(text) if text.isdigit() else 0


def device_requests(pods: list[Obj]) -> dict[str, int]:
    """What one job pod asks of the resources only a device plugin advertises (nvidia.com/gpu,
    vpc.amazonaws.com/efa): the most any container of any pod asks. Extended resources are limits,
    and a request, where given, must equal its limit, so either says it."""
    wants: dict[str, int] = {}
    for pod in pods:
        for c in pod.get("spec", {}).get("containers") or []:
            res = c.get("resources") or {}
            for part in (res.get("limits") or {}, res.get("requests") or {}):
                for name in PLUGIN_OF:
                    if name in part:
                        wants[name] = max(wants.get(name, 0), _quantity(part[name]))
    return wants


def _selects(selector: dict[str, str], node: Node) -> bool:
    labels = node.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def job_nodes(nodes: list[Node], pods: list[Obj], selector: dict[str, str]) -> list[Node]:
    """The nodes the job's pods run on (spec.nodeName) or wait for: for a pod not bound yet, every
    node its nodeSelector matches (all pairs, as the scheduler's NodeAffinity filter); `selector`,
    the job's own, while no pod exists yet."""
    bound = {p.get("spec", {}).get("nodeName") for p in pods} - {None, ""}
    waiting = [
        p.get("spec", {}).get("nodeSelector") or {}
        for p in pods
        if not p.get("spec", {}).get("nodeName")
    ]
    if not pods:
        waiting = [selector]
    return [
        n
        for n in nodes
        if n["metadata"]["name"] in bound or any(sel and _selects(sel, n) for sel in waiting)
    ]


def gpu_node_fit(
    rows: Sequence[Mapping[str, Any]], nodes: list[Node], wants: dict[str, int], pods: list[Obj]
) -> list[GpuNode]:
    """Per GPU node of the job (`rows` from deploy.node_rows, which picks the GPU nodes and says
    what the plugins made allocatable), whether it offers as many of each device as one of the job's
    pods asks for (at least one where the pods ask for none), the resources it falls short of, and
    the job's pods on it."""
    by_name = {n["metadata"]["name"]: n for n in nodes}
    out: list[GpuNode] = []
    for row in rows:
        name = row["object"].partition("/")[2]
        allocatable = (by_name[name].get("status") or {}).get("allocatable") or {}
        have = {r: _quantity(allocatable.get(r)) for r in wants}
        short = [r for r, n in wants.items() if have[r] < max(n, 1)]
        on_it = [p["metadata"]["name"] for p in pods if p.get("spec", {}).get("nodeName") == name]
        out.append(
            {
                "node": name,
                "allocatable": have,
                "wants": dict(wants),
                "ready": bool(row["ready"]) and not short,
                "short": short,
                "pods": sorted(on_it),
            }
        )
    return out


def node_problems(fit: list[GpuNode], selector: dict[str, str]) -> list[str]:
    """A line per device a GPU node of the job lacks, naming the plugin that advertises it; or one
    line saying that no GPU node matches the job's selector."""
    if not fit:
        wanted = ",".join(f"{k}={v}" for k, v in selector.items())
        return [
            f"no GPU node matches the job's nodeSelector {wanted}: the node group has no node yet (scaled "
            "to zero, or still joining), or NODE_SELECTOR/INSTANCE_TYPE name another (`fsdpctl cluster "
            "status`)"
        ]
    return [
        f"node {node['node']}: {r}={node['allocatable'][r]} allocatable, a job pod asks for "
        f"{node['wants'][r]}: {PLUGIN_OF[r]} has not advertised it there (`fsdpctl deploy plugins`, "
        "`fsdpctl deploy status`)"
        for node in fit
        for r in node["short"]
    ]


def describe_node(node: GpuNode) -> str:
    """One line of `job status`: what the node offers against what a pod asks, and the job's pods on
    it."""
    have = " ".join(f"{r} {n}/{node['wants'][r]}" for r, n in node["allocatable"].items())
    verdict = "ok" if node["ready"] else "lacks " + ", ".join(node["short"])
    pods = f"; pods {', '.join(node['pods'])}" if node["pods"] else ""
    return f"{node['node']}: {have} allocatable/asked ({verdict}){pods}"
